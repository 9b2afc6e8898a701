"""Context parallelism of attention, derived (issue 17): q, k and v arrive sharded on the sequence
dim and meshfuse picks the communication. Ulysses (cp="auto" where the heads divide the mesh, or
cp="ulysses") moves them to a split of the heads by all-to-all and runs attention on whole
sequences; cp="gather" all-gathers k and v (the query keeps its rows); cp="ring" rotates k and v
around the ring (ring attention). numpy is the oracle; the collectives are this rank's exact
list (none on one rank)."""

import numpy as np
import pytest

import meshfuse
from meshfuse import FusionDefinitionWrapper, Replicate, Shard

import helpers as H

B, SEQ, HD = 2, 32, 8


def attention_define(causal):
    def define(fd):
        q, k, v = (fd.define_tensor((B, 4, SEQ, HD)) for _ in range(3))
        fd.add_output(fd.ops.sdpa(q, k, v, is_causal=causal))
    return define


def run(define, arrays, placements, **options):
    mesh = H.world_mesh()
    fdw = FusionDefinitionWrapper(define, **options)
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]
    plan = fdw.plan(inputs)
    outs = fdw(inputs)
    return outs, plan


@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_is_three_all_to_alls_and_a_split_of_the_heads(rng, causal):
    q, k, v = (H.randn(rng, B, 4, SEQ, HD) for _ in range(3))
    outs, plan = run(attention_define(causal), [q, k, v], [[Shard(2)]] * 3)
    H.assert_close(outs[0].full_tensor(), H.sdpa(q, k, v, causal))
    assert H.kinds(plan) == H.expect(["all_to_all"] * 3)
    assert outs[0].placements == (Shard(1),)
    block = B * 4 * (SEQ // meshfuse.world_size()) * HD * 4  # this rank's f32 block of q
    assert all(c.bytes == block for c in plan.collectives())


def test_gather_all_gathers_k_and_v(rng):
    # Each query row's attention is computed where the row is: only k and v move, and the output
    # keeps the sequence split.
    q, k, v = (H.randn(rng, B, 4, SEQ, HD) for _ in range(3))
    outs, plan = run(attention_define(True), [q, k, v], [[Shard(2)]] * 3, cp="gather")
    H.assert_close(outs[0].full_tensor(), H.sdpa(q, k, v, True))
    assert H.kinds(plan) == H.expect(["allgather"] * 2)
    assert outs[0].placements == (Shard(2),)


def test_unknown_cp_is_a_value_error():
    with pytest.raises(meshfuse.ValueError, match="context parallelism 'ring2': expected auto, ulysses, ring or gather"):
        run(attention_define(False), [np.zeros((B, 4, SEQ, HD), np.float32)] * 3, [[Replicate()]] * 3, cp="ring2")


# Seed 003's Ulysses example, written for one device: x [batch, seq, hidden] viewed as
# [batch, seq, heads, head_dim] (BSND), self-attention, viewed back. With x sharded on the sequence
# meshfuse derives what the seed writes by hand: one all-to-all into a split of the heads (q, k and
# v are the same tensor, moved once), attention on whole sequences, and the result brought back
# to the sequence split by one more all-to-all (the seed then all-gathers: here the output pin).
@pytest.mark.parametrize("pin", [Shard(1), Replicate()])
def test_seed_003_ulysses_example(rng, pin):
    n = meshfuse.world_size()
    heads, hidden = 8, 64

    def define(fd):
        x = fd.define_tensor((1, SEQ, hidden))
        xh = fd.ops.permute(fd.ops.reshape(x, [1, SEQ, heads, hidden // heads]), [0, 2, 1, 3])
        a = fd.ops.sdpa(xh, xh, xh)
        y = fd.ops.reshape(fd.ops.permute(a, [0, 2, 1, 3]), [1, SEQ, hidden])
        fd.add_output(y)
        y.set_device_mesh(H.world_mesh())
        if pin.is_shard():
            y.split(1, n)
            y.axis(1).parallelize(meshfuse.ParallelType.mesh_x)

    x = H.randn(rng, 1, SEQ, hidden)
    outs, plan = run(define, [x], [[Shard(1)]])
    xh = x.reshape(1, SEQ, heads, hidden // heads).transpose(0, 2, 1, 3)
    want = H.sdpa(xh, xh, xh).transpose(0, 2, 1, 3).reshape(1, SEQ, hidden)
    H.assert_close(outs[0].full_tensor(), want)
    back = "all_to_all" if pin.is_shard() else "allgather"
    assert H.kinds(plan) == H.expect(["all_to_all", back])
    assert outs[0].placements == (pin,)
