"""Context parallelism trains (issue 17): value_and_grad of attention whose q, k and v arrive
sharded on the sequence, against torch.autograd (f64), on 1, 2 and 4 ranks. Attention's gradient
is an op with attention's sharding rule (sdpa_grad), so the backward is Ulysses where the forward
is (the saved q, k, v and the output's gradient move to a split of the heads by all-to-all and dq,
dk, dv move back: seven all-to-alls, no allgather), and ring attention's backward where the
forward is ring attention (blocks of the other side rotate by send/recv)."""

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


def test_gather_backward_keeps_rows_split_and_gathers_the_other_side(rng):
    """cp="gather": each gradient keeps its own rows (dq the query rows, dk and dv the key rows) and
    gathers the other side: k and v (shared with the recomputed log-sum-exp) for dq; q, the seed,
    the lse and delta for dk and dv (one kernel). Six allgathers, nothing reduced."""
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
        assert g.placements == (Shard(2),)
        H.assert_close(g.full_tensor(), t.grad.numpy())
    bwd = fdw.grad_plans(inputs, [0, 1, 2], seeds)[1]
    assert H.kinds(bwd) == H.expect(["allgather"] * 6)
    n = meshfuse.world_size()
    tensor, rows = B * HEADS * SEQ * HD * 4 // n, B * HEADS * SEQ * 4 // n  # a rank's block sent
    assert sorted(c.bytes for c in bwd.collectives()) == H.expect(sorted([tensor] * 4 + [rows] * 2))


@pytest.mark.parametrize("cp", ["auto", "ring"])
def test_ring_attention_trains_with_a_ring_backward(rng, cp):
    """One head, which no split of 2 or 4 ranks divides: cp="auto" (or "ring") makes the forward
    ring attention and the backward ring attention's backward: the recomputed log-sum-exp rotates
    k, dq's ring k and v, and the one ring of dk and dv the query side (q, the seed, the lse and
    delta), each ring once per batch entry (2 head groups): 2 x 7 (n - 1) send/recv, plus the 11
    mirrored half exchanges that balance the causal work (docs/parallelisms.md), no allgather; the
    gradients match torch."""
    shape = (B, 1, SEQ, HD)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    seed = rng.standard_normal(shape).astype(np.float32)
    mesh = H.world_mesh()
    inputs = [distribute_tensor(a, mesh, [Shard(2)]) for a in arrays]
    seeds = [distribute_tensor(seed, mesh, [Shard(2)])]

    def define(fd):
        q, k, v = (fd.define_tensor(shape, name=n) for n in "qkv")
        fd.add_output(fd.ops.sdpa(q, k, v, is_causal=True))

    fdw = FusionDefinitionWrapper(define, cp=cp)
    (out,), grads = fdw.value_and_grad(inputs, [0, 1, 2], seeds)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    want = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=True)
    want.backward(torch.tensor(seed, dtype=torch.float64))
    H.assert_close(out.full_tensor(), want.detach().numpy())
    for g, t in zip(grads, ts):
        assert g.placements == (Shard(2),)
        H.assert_close(g.full_tensor(), t.grad.numpy())
    fwd, bwd = fdw.grad_plans(inputs, [0, 1, 2], seeds)
    n = meshfuse.world_size()
    assert set(H.kinds(fwd)) == ({"send_recv"} if n > 1 else set())
    assert H.kinds(bwd) == ["send_recv"] * (2 * 7 * (n - 1) + (11 if n > 1 else 0))
