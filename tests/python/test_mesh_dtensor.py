"""DeviceMesh, placements and meshfuse's DTensor: value semantics, distribute_tensor,
redistribute and full_tensor (numpy is the oracle), and their errors."""

import itertools

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor

import helpers as H

R, S = Replicate(), Shard


def test_meshes_compare_and_hash_by_value():
    a = DeviceMesh([[0, 1], [2, 3]])
    b = DeviceMesh([0, 1, 2, 3], shape=(2, 2))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != DeviceMesh([0, 1, 2, 3]) and a.ndim == 2 and a.shape == (2, 2)
    assert a.size() == 4 and a.size(1) == 2 and 3 in a and 5 not in a
    assert a.coordinates(2) == [1, 0] and a.team(2, 1) == [2, 3]
    assert repr(a) == "DeviceMesh([[0, 1], [2, 3]])"
    assert DeviceMesh(range(3)) == DeviceMesh(np.arange(3)) and DeviceMesh(range(3)).shape == (3,)
    assert np.array_equal(a.mesh, [[0, 1], [2, 3]])


def test_malformed_meshes_are_mesh_errors():
    with pytest.raises(meshfuse.MeshError, match="rectangular"):
        DeviceMesh([[0, 1], [2]])
    with pytest.raises(meshfuse.MeshError, match="malformed mesh: device id 0 appears twice"):
        DeviceMesh([0, 0])
    with pytest.raises(meshfuse.MeshError):
        DeviceMesh([0, 1, 2], shape=(2, 2))
    with pytest.raises(meshfuse.MeshError, match="non-empty"):
        DeviceMesh([])


def test_placements_compare_and_hash_by_value():
    assert S(0) == S(0) and S(0) != S(1) and S(0) != R and R == Replicate() and Partial() == Partial()
    assert len({S(0), S(0), R, Partial()}) == 3
    assert [repr(p) for p in (S(1), R, Partial())] == ["Shard(dim=1)", "Replicate()", "Partial()"]
    assert S(1).is_shard() and S(1).is_shard(1) and not S(1).is_shard(0) and R.is_replicate() and Partial().is_partial()
    with pytest.raises(meshfuse.PlacementError, match=r"Shard\(dim\) takes an int, got 'x'"):
        S("x")
    with pytest.raises(meshfuse.UnsupportedError, match="only 'sum'"):
        Partial("max")


@pytest.mark.parametrize("placement,local_shape", [(S(0), lambda n: (8 // n, 12)), (S(1), lambda n: (8, 12 // n)),
                                                   (S(-1), lambda n: (8, 12 // n)), (R, lambda n: (8, 12))])
def test_distribute_tensor_keeps_this_ranks_block(placement, local_shape, rng, world_mesh):
    x = H.randn(rng, 8, 12)
    n, r = meshfuse.world_size(), meshfuse.rank()
    d = distribute_tensor(x, world_mesh, [placement])
    assert d.shape == (8, 12) and d.ndim == 2 and d.dtype == meshfuse.DataType.Float
    assert d.device_mesh == world_mesh and isinstance(d.to_local(), np.ndarray)
    assert d.to_local().shape == local_shape(n)
    if placement.is_shard():
        assert d.placements == (S(placement.dim % 2),)  # negative dims are normalized
        blocks = np.split(x, n, axis=placement.dim % 2)
        np.testing.assert_array_equal(d.to_local(), blocks[r])
    np.testing.assert_array_equal(d.full_tensor(), x)


def test_from_local_is_zero_copy_and_infers_the_global_shape(world_mesh):
    n = meshfuse.world_size()
    local = np.full((2, 3), float(meshfuse.rank()), dtype=np.float32)
    d = DTensor.from_local(local, world_mesh, [S(0)])
    assert d.to_local() is local and d.shape == (2 * n, 3)
    np.testing.assert_array_equal(d.full_tensor(), np.repeat(np.arange(n, dtype=np.float32), 2)[:, None] * np.ones(3))


@pytest.mark.parametrize("src", [S(0), S(1), R, Partial()])
@pytest.mark.parametrize("dst", [S(0), S(1), R])
def test_redistribute_keeps_the_value(src, dst, rng, world_mesh):
    x = H.randn(rng, 8, 12)
    d = distribute_tensor(x, world_mesh, [src]).redistribute([dst])
    assert d.placements == (dst,)
    expected_local = np.split(x, meshfuse.world_size(), axis=dst.dim)[meshfuse.rank()] if dst.is_shard() else x
    H.assert_close(d.to_local(), expected_local)
    H.assert_close(d.full_tensor(), x)


def test_partial_holds_a_sum(rng, world_mesh):
    x = H.randn(rng, 4, 4)
    d = distribute_tensor(x, world_mesh, [Partial()])
    # The rank at index 0 holds the value, the others zeros; the DTensor's value is their sum.
    np.testing.assert_array_equal(d.to_local(), x if meshfuse.rank() == 0 else np.zeros_like(x))
    H.assert_close(d.full_tensor(), x)
    with pytest.raises(meshfuse.UnsupportedError, match=r"redistribute: Shard\(dim=0\) -> Partial\(\) on mesh axis 0"):
        distribute_tensor(x, world_mesh, [S(0)]).redistribute([Partial()])


@pytest.mark.world(4)
def test_two_dimensional_mesh_blocks_nest_in_axis_order(rng):
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x = H.randn(rng, 8, 12)
    r = meshfuse.rank()
    d = distribute_tensor(x, mesh, [S(0), S(1)])
    np.testing.assert_array_equal(d.to_local(), x[(r // 2) * 4:(r // 2 + 1) * 4, (r % 2) * 6:(r % 2 + 1) * 6])
    two_on_dim0 = distribute_tensor(x, mesh, [S(0), S(0)])  # dim 0 split by axis 0, then by axis 1
    np.testing.assert_array_equal(two_on_dim0.to_local(), x[2 * r:2 * r + 2])


@pytest.mark.world(4)
def test_every_redistribution_on_a_2x2_mesh(rng):
    """All 16 x 9 (from, to) pairs; each rank's block is checked against distribute_tensor's."""
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x = H.randn(rng, 8, 12)
    wrong = []
    for src in itertools.product([R, S(0), S(1), Partial()], repeat=2):
        for dst in itertools.product([R, S(0), S(1)], repeat=2):
            got = distribute_tensor(x, mesh, src).redistribute(dst)
            want = distribute_tensor(x, mesh, dst).to_local()
            if got.placements != dst or not np.allclose(got.to_local(), want, rtol=1e-5, atol=1e-5):
                wrong.append((src, dst))
    assert wrong == []


def test_bad_placements_are_placement_errors(rng, world_mesh):
    x = H.randn(rng, 8, 12)
    with pytest.raises(meshfuse.PlacementError, match=r"distribute_tensor: Shard\(dim=2\) names dim 2 but the tensor "
                                                      r"has 2 dims"):
        distribute_tensor(x, world_mesh, [S(2)])
    with pytest.raises(meshfuse.PlacementError, match=r"2 placements .* for a 1-d mesh .*: give one placement per mesh "
                                                      r"axis"):
        distribute_tensor(x, world_mesh, [S(0), R])
    with pytest.raises(meshfuse.PlacementError, match="is not a placement"):
        distribute_tensor(x, world_mesh, ["Shard(0)"])


def test_bad_data_is_rejected_with_the_reason(world_mesh):
    with pytest.raises(meshfuse.DtypeError, match=r"unsupported numpy dtype float64.*astype\(numpy.float32\)"):
        distribute_tensor(np.zeros((4, 4)), world_mesh, [R])
    with pytest.raises(meshfuse.ValueError, match="expected a tensor"):
        DTensor.from_local("data", world_mesh, [R])
    # Non-contiguous and read-only arrays are accepted (copied for meshfuse's view).
    x = np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::2]
    x.flags.writeable = False
    H.assert_close(distribute_tensor(x, world_mesh, [R]).full_tensor(), x)


def test_uneven_shards_are_torch_chunk_blocks(world_mesh):
    """n + 1 rows on n ranks: torch.chunk gives the leading ranks 2 rows, then 1s, then empties
    (torch's DTensor alike); the global shape is the full one, and the blocks round-trip."""
    n = meshfuse.world_size()
    full = np.arange((n + 1) * 4, dtype=np.float32).reshape(n + 1, 4)
    x = distribute_tensor(full, world_mesh, [S(0)])
    chunk = -(-(n + 1) // n)
    start = min(n + 1, chunk * meshfuse.rank())
    np.testing.assert_array_equal(x.to_local(), full[start:start + chunk])
    assert x.shape == (n + 1, 4)
    np.testing.assert_array_equal(x.full_tensor(), full)
    # Built from its block with the global shape=, as torch's from_local(shape=...).
    y = DTensor(x.to_local(), world_mesh, [S(0)], shape=(n + 1, 4))
    np.testing.assert_array_equal(y.full_tensor(), full)


def test_a_shape_that_the_local_shape_contradicts_is_a_shape_error(world_mesh):
    n = meshfuse.world_size()
    rows = -(-8 // n)
    with pytest.raises(meshfuse.ShapeError, match=rf"^DTensor: local shape \(1, 4\) is not rank {meshfuse.rank()}'s "
                                                  rf"block of shape=\(8, 8\) with placements \[Shard\(dim=0\)\] on "
                                                  rf"mesh .*, which is \({rows}, 8\) \(torch.chunk's blocks\)$"):
        DTensor(np.zeros((1, 4), dtype=np.float32), world_mesh, [S(0)], shape=(8, 8))


def test_a_mesh_larger_than_the_world_is_a_mesh_error():
    n = meshfuse.world_size()
    big = DeviceMesh(list(range(n + 1)))
    with pytest.raises(meshfuse.MeshError, match=rf"distribute_tensor: mesh .* names device {n} but the world has "
                                                 rf"{n} ranks .*launch with mpirun -np {n + 1}"):
        distribute_tensor(np.zeros((4 * (n + 1), 2), dtype=np.float32), big, [S(0)])


def test_the_world():
    meshfuse.init()
    meshfuse.init()  # idempotent
    assert meshfuse.is_initialized() and 0 <= meshfuse.rank() < meshfuse.world_size()
    assert meshfuse.communicator_name() == ("mpi" if meshfuse.world_size() > 1 else meshfuse.communicator_name())


class DLPackOnly:
    """A DLPack producer that is neither numpy nor torch (as cupy or jax arrays would be)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_any_dlpack_producer_can_back_a_dtensor(rng, world_mesh):
    full = H.randn(rng, 4 * meshfuse.world_size(), 3)
    block = np.split(full, meshfuse.world_size())[meshfuse.rank()]
    d = DTensor.from_local(DLPackOnly(block), world_mesh, [S(0)])
    assert isinstance(d.to_local(), DLPackOnly) and d.shape == full.shape
    H.assert_close(d.full_tensor(), full)
    (y,) = meshfuse.FusionDefinitionWrapper(lambda fd: fd.add_output(fd.ops.neg(fd.define_tensor([-1, 3]))))([d])
    H.assert_close(y.full_tensor(), -full)  # outputs of unknown kinds come back as numpy


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("placement", [R, S(0)], ids=["replicated", "sharded"])
def test_full_tensor_and_redistribute_outside_the_mesh(placement, rng):
    """A rank outside the mesh gets an empty array from full_tensor(), whatever the placements
    (as torch gives it an empty local and no communication); the ranks inside get the value."""
    x = H.randn(rng, 4, 2)
    last = meshfuse.world_size() - 1
    d = distribute_tensor(x, DeviceMesh([last]), [placement])
    r = d.redistribute([S(1) if placement.is_replicate() else R])
    if meshfuse.rank() == last:
        np.testing.assert_array_equal(d.full_tensor(), x)
        np.testing.assert_array_equal(r.full_tensor(), x)
    else:
        full = d.full_tensor()
        assert isinstance(full, np.ndarray) and full.shape == (0, 0) and full.dtype == np.float32
        assert r.to_local().shape == (0, 0) and r.full_tensor().shape == (0, 0)
    assert r.placements == (S(1) if placement.is_replicate() else R,) and r.shape == (4, 2)
