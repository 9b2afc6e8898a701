"""Context parallelism trains (issue 17): value_and_grad of attention whose q, k and v arrive
sharded on the sequence, against torch.autograd (f64), on 1, 2 and 4 ranks. The backward is
Ulysses too: attention's gradient is an op with attention's sharding rule (sdpa_grad), so the
saved q, k, v and the output's gradient move to a split of the heads by all-to-all and dq, dk, dv
move back: seven all-to-alls, no allgather."""

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import FusionDefinitionWrapper, Shard, distribute_tensor

import helpers as H

B, HEADS, SEQ, HD = 2, 4, 16, 8


def attention(causal):
    def define(fd):
        q, k, v = (fd.define_tensor((B, HEADS, SEQ, HD), name=n) for n in "qkv")
        fd.add_output(fd.ops.sdpa(q, k, v, is_causal=causal))
    return define


@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_gradients_match_torch_and_the_backward_is_all_to_alls(rng, causal):
    arrays = [H.randn(rng, B, HEADS, SEQ, HD) for _ in range(3)]
    seed = H.randn(rng, B, HEADS, SEQ, HD)
    mesh = H.world_mesh()
    inputs = [distribute_tensor(a, mesh, [Shard(2)]) for a in arrays]
    seeds = [distribute_tensor(seed, mesh, [Shard(2)])]
    fdw = FusionDefinitionWrapper(attention(causal))
    (out,), grads = fdw.value_and_grad(inputs, [0, 1, 2], seeds)

    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    want = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal)
    want.backward(torch.tensor(seed, dtype=torch.float64))
    H.assert_close(out.full_tensor(), want.detach().numpy())
    for g, t in zip(grads, ts):
        assert g.placements == (Shard(2),)
        H.assert_close(g.full_tensor(), t.grad.numpy())

    fwd, bwd = fdw.grad_plans(inputs, [0, 1, 2], seeds)
    assert H.kinds(fwd) == H.expect(["all_to_all"] * 3)  # the output stays split by heads
    # In: q, k, v (saved: the forward's inputs) and the seed; out: dq, dk, dv.
    assert H.kinds(bwd) == H.expect(["all_to_all"] * 7), bwd.host_ir()
    block = B * HEADS * (SEQ // meshfuse.world_size()) * HD * 4
    assert all(c.bytes == block for c in bwd.collectives())


def test_gather_backward_all_gathers_and_reduce_scatters_nothing(rng):
    """cp="gather": the backward gathers q, k, v and the seed, computes every gradient whole on
    each rank and keeps its block (a local slice): four allgathers."""
    arrays = [H.randn(rng, B, HEADS, SEQ, HD) for _ in range(3)]
    seed = H.randn(rng, B, HEADS, SEQ, HD)
    mesh = H.world_mesh()
    inputs = [distribute_tensor(a, mesh, [Shard(2)]) for a in arrays]
    seeds = [distribute_tensor(seed, mesh, [Shard(2)])]
    fdw = FusionDefinitionWrapper(attention(True), cp="gather")
    _, grads = fdw.value_and_grad(inputs, [0, 1, 2], seeds)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=True).backward(torch.tensor(seed, dtype=torch.float64))
    for g, t in zip(grads, ts):
        H.assert_close(g.full_tensor(), t.grad.numpy())
    assert H.kinds(fdw.grad_plans(inputs, [0, 1, 2], seeds)[1]) == H.expect(["allgather"] * 4)
