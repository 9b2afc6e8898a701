"""CFG parallelism (issue 17): examples/python/dit_cfg.py's DiT block evaluated on both guidance
branches as one batch and combined, uncond + s (cond - uncond), with the batch Shard(0) over the
world (1, 2, 4 ranks) and, on 4 ranks, CFG x Ulysses and CFG x ring attention on a 2x2 mesh; forward against PyTorch and
the exact collectives of this rank, and the backward (batch-sharded) against torch.autograd."""

import os
import sys

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import dit_cfg  # noqa: E402

import helpers as H  # noqa: E402

R = Replicate()
# The branches split over the world: the conditioning's batch (null embeddings, then the prompt's).
CFG = {"x": [R], "t_freq": [R], "y": [Shard(0)]}


def config():
    # One row per rank: each rank of a 1-D world holds one branch (two rows per branch on 4 ranks).
    return dit_cfg.Config(batch=max(1, meshfuse.world_size() // 2))


def placed(c, mesh, data_placements, seed=0):
    params = dit_cfg.init_params(c, seed)
    data = dict(zip(["x", "t_freq", "y"], dit_cfg.inputs(c)))
    replicated = [R] * mesh.ndim
    arrays = [*params.values(), *data.values()]
    placements = [replicated] * len(params) + [data_placements[name] for name in data]
    return arrays, [distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]


def torch_forward(c, arrays, requires_grad=False):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad) for a in arrays]
    p = dict(zip(dit_cfg.PARAMS, ts))
    x, t_freq, y = ts[len(dit_cfg.PARAMS):]
    return ts, dit_cfg.torch_dit(c, p, x, t_freq, y)


def test_each_rank_runs_one_branch_and_only_the_combine_communicates():
    c = config()
    arrays, inputs = placed(c, H.world_mesh(), CFG)
    fdw = FusionDefinitionWrapper(dit_cfg.define_dit(c))
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), torch_forward(c, arrays)[1].detach().numpy())
    assert out.placements == (R,)
    assert H.kinds(fdw.plan(inputs)) == H.expect(["allgather"])


@pytest.mark.world(4)
def test_cfg_times_ulysses_on_a_2x2_mesh():
    c = dit_cfg.Config()
    mesh = DeviceMesh([[0, 1], [2, 3]])
    arrays, inputs = placed(c, mesh, dit_cfg.CFG_X_ULYSSES)
    fdw = FusionDefinitionWrapper(dit_cfg.define_dit(c))
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), torch_forward(c, arrays)[1].detach().numpy())
    assert out.placements == (R, Shard(1))  # as the latents: the next step's input
    plan = fdw.plan(inputs)
    # Ulysses over the sequence axis: q, k, v to the heads' split and the attention output back
    # to the tokens (the plan search's choice: op by op, the output projection of the heads-split
    # attention output is reduce-scattered instead, which sends more), then the guidance
    # combine's allgather over the CFG axis.
    assert [(k.kind, k.mesh_axis) for k in plan.collectives()] == [
        ("all_to_all", 1), ("all_to_all", 1), ("all_to_all", 1), ("all_to_all", 1), ("allgather", 0)]
    greedy = FusionDefinitionWrapper(dit_cfg.define_dit(c), plan="greedy").plan(inputs)
    assert [k.kind for k in greedy.collectives()][3] == "reduce_scatter"
    assert sum(k.bytes for k in plan.collectives()) < sum(k.bytes for k in greedy.collectives())


@pytest.mark.world(4)
def test_cfg_times_ring_attention_on_a_2x2_mesh():
    c = dit_cfg.Config()
    mesh = DeviceMesh([[0, 1], [2, 3]])
    arrays, inputs = placed(c, mesh, dit_cfg.CFG_X_ULYSSES)
    fdw = FusionDefinitionWrapper(dit_cfg.define_dit(c), cp="ring")
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), torch_forward(c, arrays)[1].detach().numpy())
    assert out.placements == (R, Shard(1))
    # k and v rotate over the sequence axis (one step each: 2 ranks per ring, in 2 head groups),
    # nothing gathered there; the attention output keeps its rows, so the output projection needs
    # no collective; then the combine's allgather over the CFG axis.
    assert [(k.kind, k.mesh_axis) for k in fdw.plan(inputs).collectives()] == [
        ("send_recv", 1)] * 4 + [("allgather", 0)]


def test_cfg_backward_matches_torch_autograd():
    """Parameter gradients through the guided prediction, the branches batch-sharded: each rank
    differentiates its branch, and the parameter gradients are summed over them. One parameter
    per path (timestep MLP, adaLN, attention, MLP) keeps the backward small."""
    c = config()
    arrays, inputs = placed(c, H.world_mesh(), CFG)
    seed = np.random.default_rng(5).standard_normal((c.batch, c.seq, c.hidden)).astype(np.float32)
    fdw = FusionDefinitionWrapper(dit_cfg.define_dit(c))
    names = ["t_w1", "ada_w", "wq", "down_w"]
    wrt = [dit_cfg.PARAMS.index(n) for n in names]
    (out,), grads = fdw.value_and_grad(inputs, wrt, [distribute_tensor(seed, H.world_mesh(), [R])])
    ts, want = torch_forward(c, arrays, requires_grad=True)
    want.backward(torch.tensor(seed, dtype=torch.float64))
    H.assert_close(out.full_tensor(), want.detach().numpy())
    for name, i, g in zip(names, wrt, grads):
        np.testing.assert_allclose(np.asarray(g.full_tensor(), np.float64), ts[i].grad.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=name)
