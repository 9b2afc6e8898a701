"""Sizes the mesh does not divide (issue 14): Shard(d) follows torch.chunk, as torch's DTensor does
(leading ranks ceil(n / D), the trailing ones fewer, possibly none). Every parallelism runs on
such sizes through meshfuse's DTensors and torch's, distribute_tensor / redistribute /
full_tensor included, against numpy; on 1, 2 and 4 ranks."""

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, DTensor, FusionDefinitionWrapper, Partial, Replicate, Shard, distribute_tensor
from meshfuse.mesh import local_shape

import helpers as H

R, S = Replicate(), Shard


def chunks(n, d):
    """torch.chunk's sizes of n over d parts, empty ones included (DTensor's shards)."""
    c = -(-n // d)
    return [max(0, min(n, c * (i + 1)) - c * i) for i in range(d)]


def test_local_shapes_are_torch_chunk_blocks(world_mesh):
    n = meshfuse.world_size()
    for rows in (7, 5, 3, 1, 0):
        want = chunks(rows, n)
        got = [local_shape((rows, 2), world_mesh, [S(0)], r)[0] for r in range(n)]
        assert got == want, rows


@pytest.mark.world(4)
def test_nested_shards_of_one_dim_on_a_2x2_mesh():
    """torch's [Shard(1), Shard(1)] of 5 columns: 3 + 2 on axis 0, then 2 + 1 and 1 + 1."""
    mesh = DeviceMesh([[0, 1], [2, 3]])
    assert [local_shape((2, 5), mesh, [S(1), S(1)], r) for r in range(4)] == [(2, 2), (2, 1), (2, 1), (2, 1)]


def test_redistribute_and_full_tensor_of_uneven_shards(world_mesh, rng):
    """Every resharding of a [7, 5] array, both dims uneven: allgather, all-to-all both ways, local
    slices; blocks of 0 rows included on 4 ranks of 3 rows."""
    for shape in [(7, 5), (3, 2)]:
        full = H.randn(rng, *shape)
        for a in [[S(0)], [S(1)], [R]]:
            x = distribute_tensor(full, world_mesh, a)
            assert x.to_local().shape == local_shape(shape, world_mesh, a, meshfuse.rank())
            np.testing.assert_array_equal(x.full_tensor(), full)
            for b in [[S(0)], [S(1)], [R]]:
                y = x.redistribute(b)
                assert y.placements == tuple(b) and y.shape == shape
                assert y.to_local().shape == local_shape(shape, world_mesh, b, meshfuse.rank())
                np.testing.assert_array_equal(y.full_tensor(), full)


def test_a_pending_sum_reduce_scattered_into_uneven_blocks(world_mesh, rng):
    """Partial -> Shard(0) of 5 rows: a reduce-scatter whose blocks differ (and may be empty)."""
    parts = [H.randn(rng, 5, 3) for _ in range(meshfuse.world_size())]
    x = DTensor(parts[meshfuse.rank()], world_mesh, [Partial()])
    y = x.redistribute([S(0)])
    assert y.to_local().shape == local_shape((5, 3), world_mesh, [S(0)], meshfuse.rank())
    H.assert_close(y.full_tensor(), np.sum([p.astype(np.float64) for p in parts], axis=0))


def mlp_definition(h, f):
    def define(fd):
        x, up_w, down_w = fd.define_tensor([-1, h], name="x"), fd.define_tensor([f, h]), fd.define_tensor([h, f])
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, up_w), approximate="tanh"), down_w))

    return define


@pytest.mark.parametrize("name,placements,kinds", [
    ("tensor", [[R], [S(0)], [S(1)]], ["allreduce"]),
    ("sequence", [[S(0)], [S(0)], [S(1)]], ["allgather", "reduce_scatter"]),
    ("data", [[S(0)], [R], [R]], []),
    ("fsdp", [[S(0)], [S(0)], [S(0)]], ["allgather", "allgather"]),
])
def test_mlp_parallelisms_of_seven_tokens_and_seven_units(name, placements, kinds, world_mesh, rng):
    x, up_w, down_w = H.randn(rng, 7, 6), H.randn(rng, 7, 6), H.randn(rng, 6, 7)
    inputs = [distribute_tensor(a, world_mesh, p) for a, p in zip([x, up_w, down_w], placements)]
    fdw = FusionDefinitionWrapper(mlp_definition(6, 7), fsdp=name == "fsdp")
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), H.mlp(x, up_w, down_w))
    assert H.kinds(fdw.plan(inputs)) == (kinds if meshfuse.world_size() > 1 else [])


@pytest.mark.world(4)
def test_data_times_tensor_parallel_mlp_with_odd_dims_on_a_2x2_mesh(rng):
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x, up_w, down_w = H.randn(rng, 7, 6), H.randn(rng, 7, 6), H.randn(rng, 6, 7)
    inputs = [distribute_tensor(x, mesh, [S(0), R]), distribute_tensor(up_w, mesh, [R, S(0)]),
              distribute_tensor(down_w, mesh, [R, S(1)])]
    fdw = FusionDefinitionWrapper(mlp_definition(6, 7))
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), H.mlp(x, up_w, down_w))
    assert H.kinds(fdw.plan(inputs)) == ["allreduce"]
    assert out.to_local().shape == ((4 if meshfuse.rank() < 2 else 3), 6)


def test_ulysses_of_seven_tokens(world_mesh, rng):
    q, k, v = (H.randn(rng, 2, 3, 7, 4) for _ in range(3))

    def define(fd):
        a, b, c = (fd.define_tensor([2, 3, 7, 4]) for _ in range(3))
        fd.add_output(fd.ops.sdpa(a, b, c, is_causal=True))

    inputs = [distribute_tensor(t, world_mesh, [S(2)]) for t in (q, k, v)]
    fdw = FusionDefinitionWrapper(define, cp="ulysses")
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), H.sdpa(q, k, v, is_causal=True))
    assert H.kinds(fdw.plan(inputs)) == (["all_to_all"] * 3 if meshfuse.world_size() > 1 else [])


def test_overlap_of_seven_tokens(world_mesh, rng):
    x, up_w, down_w = H.randn(rng, 7, 8), H.randn(rng, 16, 8), H.randn(rng, 8, 16)
    inputs = [distribute_tensor(a, world_mesh, p) for a, p in zip([x, up_w, down_w], [[S(0)], [S(0)], [S(1)]])]
    for overlap, chunks_ in [("collective", 3), ("ring", meshfuse.world_size())]:
        (out,) = FusionDefinitionWrapper(mlp_definition(8, 16), overlap=overlap, chunks=chunks_)(inputs)
        H.assert_close(out.full_tensor(), H.mlp(x, up_w, down_w))


def test_torch_dtensors_of_uneven_shards_in_and_out(world_mesh, rng):
    """torch lays out 7 tokens as it does (4 + 3, 2 + 2 + 2 + 1); meshfuse runs the sequence-parallel
    MLP on those blocks and returns torch DTensors of the same layout."""
    torch = pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor as TorchDTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor as torch_distribute

    from meshfuse.torch_interop import init_process_group

    init_process_group()
    mesh = init_device_mesh("cpu", (meshfuse.world_size(),))
    x, up_w, down_w = H.randn(rng, 7, 6), H.randn(rng, 7, 6), H.randn(rng, 6, 7)
    inputs = [torch_distribute(torch.from_numpy(a), mesh, [TShard(d)]) for a, d in [(x, 0), (up_w, 0), (down_w, 1)]]
    (out,) = FusionDefinitionWrapper(mlp_definition(6, 7))(inputs)
    assert isinstance(out, TorchDTensor) and tuple(out.shape) == (7, 6)
    assert tuple(out.to_local().shape) == tuple(inputs[0].to_local().shape)  # torch's own 7-row blocks
    H.assert_close(out.full_tensor().numpy(), H.mlp(x, up_w, down_w))
    # And torch reads meshfuse's uneven blocks back as its own.
    mine = distribute_tensor(x, world_mesh, [S(0)])
    np.testing.assert_array_equal(mine.to_local(), inputs[0].to_local().numpy())
