"""A pin on a reduction's or contraction's output (issue 14): the op computes a local pending sum
and one reduce-scatter (Shard pin) or allreduce (Replicate pin) makes the pin, as when a pinned
set follows the op; nothing moves its input or a weight. Written both with meshfuse's pins and
with nvFuser's schedule spelling (its multidevice tests). numpy is the oracle; the collectives
are this rank's exact list (none on one rank)."""

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, ParallelType, Replicate, Shard

import helpers as H

R, S = Replicate(), Shard


def pin(tv, placement, mesh, axis):
    """Pins `tv` with the schedule API: Shard is a split of loop axis `axis` (its logical domain
    holds the reduction dims too) with the outer part on the mesh; Replicate is a bare mesh."""
    tv.set_device_mesh(mesh)
    if placement.is_shard():
        tv.split(axis, mesh.size())
        tv.axis(axis).parallelize(ParallelType.mesh_x)


def collectives(plan):
    return [(c.kind, c.bytes) for c in plan.collectives()]


def expect(pairs):
    return pairs if meshfuse.world_size() > 1 else []


# nvFuser's test_reduce_scatter: inp [d, 4d] with its outer axis on the mesh; out = sum(inp, [0])
# split by d with the outer part on the mesh. On one rank d is 1: a size-1 dim on the mesh.
def test_nvfuser_reduce_scatter_schedule(rng):
    d = meshfuse.world_size()
    mesh = DeviceMesh(list(range(d)))

    def define(fd):
        inp = fd.define_tensor((d, d * 4))
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
        out.split(-1, d)
        out.axis(-2).parallelize(ParallelType.mesh_x)

    a = H.randn(rng, d, d * 4)
    (out,), plan, outs = H.run(define, [a], [[S(0)]], mesh)
    H.assert_close(out, a.astype(np.float64).sum(0))
    assert collectives(plan) == expect([("reduce_scatter", d * 4 * 4)])  # this rank's [4d] partial sums
    assert outs[0].placements == (S(0),) and outs[0].to_local().shape == (4,)


# nvFuser's test_allreduce: the reduced dim split and parallelized, the output left open.
def test_nvfuser_allreduce_schedule(rng):
    d = meshfuse.world_size()
    mesh = DeviceMesh(list(range(d)))

    def define(fd):
        inp = fd.define_tensor((-1, -1, -1))
        fd.add_output(fd.ops.sum(inp, [1]))
        inp.set_device_mesh(mesh)
        inp.split(1, d)
        inp.axis(1).parallelize(ParallelType.mesh_x)

    a = H.randn(rng, 2, d * 3, 5)
    (out,), plan, outs = H.run(define, [a], [[S(1)]], mesh)
    H.assert_close(out, a.astype(np.float64).sum(1))
    assert collectives(plan) == expect([("allreduce", 2 * 5 * 4)])
    assert outs[0].placements == (R,)


@pytest.mark.parametrize("placement", [S(0), R])
@pytest.mark.parametrize("via_set", [False, True])
def test_pinned_sum_over_a_sharded_dim(placement, via_set, rng, world_mesh):
    a = H.randn(rng, 64, 16)

    def define(fd):
        y = fd.ops.sum(fd.define_tensor([64, 16]), [0])  # [r64, 16]
        if via_set:
            y = fd.ops.set(y)  # [16]
        pin(y, placement, world_mesh, axis=0 if via_set else 1)
        fd.add_output(y)

    (out,), plan, outs = H.run(define, [a], [[S(0)]])
    H.assert_close(out, a.astype(np.float64).sum(0))
    kind = "reduce_scatter" if placement.is_shard() else "allreduce"
    assert collectives(plan) == expect([(kind, 16 * 4)])  # never the [64, 16] input
    assert outs[0].placements == (placement,)


@pytest.mark.parametrize("via_set", [False, True])
def test_pinned_row_parallel_linear_moves_no_weight(via_set, rng, world_mesh):
    x, w = H.randn(rng, 8, 16), H.randn(rng, 12, 16)

    def define(fd):
        y = fd.ops.linear(fd.define_tensor([8, 16]), fd.define_tensor([12, 16]))
        if via_set:
            y = fd.ops.set(y)
        pin(y, S(0), world_mesh, axis=0)  # [8, 12, r16] or [8, 12]
        fd.add_output(y)

    (out,), plan, outs = H.run(define, [x, w], [[S(1)], [S(1)]])
    H.assert_close(out, x.astype(np.float64) @ w.T)
    assert collectives(plan) == expect([("reduce_scatter", 8 * 12 * 4)])
    assert outs[0].placements == (S(0),)
