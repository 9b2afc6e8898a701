"""Bad input to a FusionDefinitionWrapper raises a meshfuse.Error with a clear message on EVERY
rank (each rank asserts it here, and the barrier after each test proves that no rank went on
into a collective), never a hang."""

import re

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, DTensor, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

import helpers as H

R, S = Replicate(), Shard


@pytest.fixture
def mlp(rng, world_mesh):
    fdw = FusionDefinitionWrapper(H.define_mlp(16))
    arrays = [H.randn(rng, 8, 16), H.randn(rng, 64, 16), H.randn(rng, 16, 64)]
    inputs = [distribute_tensor(a, world_mesh, [p]) for a, p in zip(arrays, [R, S(0), S(1)])]
    return fdw, inputs, arrays


def test_wrong_number_of_inputs(mlp):
    fdw, inputs, _ = mlp
    with pytest.raises(meshfuse.ValueError, match=r"^the fusion takes 3 inputs but 2 were given$"):
        fdw(inputs[:2])


def test_wrong_dtype(mlp, world_mesh):
    fdw, inputs, arrays = mlp
    half = distribute_tensor(arrays[0].astype(np.float16), world_mesh, [R])
    with pytest.raises(meshfuse.DtypeError, match=r"^input 0 \(%0\): expected dtype f32 but got f16$"):
        fdw([half, *inputs[1:]])


def test_wrong_rank(mlp, world_mesh):
    fdw, inputs, arrays = mlp
    three_d = distribute_tensor(arrays[0].reshape(2, 4, 16), world_mesh, [R])
    with pytest.raises(meshfuse.ShapeError, match=r"input 0 \(%0\): expected rank 2 but got"):
        fdw([three_d, *inputs[1:]])


def test_wrong_static_size(mlp, world_mesh, rng):
    fdw, inputs, _ = mlp
    narrow = distribute_tensor(H.randn(rng, 64, 8), world_mesh, [S(0)])
    with pytest.raises(meshfuse.ShapeError, match=r"input 1 \(%1\): dim 1 must be 16\b"):
        fdw([inputs[0], narrow, inputs[2]])


def test_mesh_larger_than_the_world(mlp):
    fdw, inputs, arrays = mlp
    n = meshfuse.world_size()
    big = DeviceMesh(list(range(n + 1)))
    x = DTensor.from_local(arrays[0], big, [R])
    with pytest.raises(meshfuse.MeshError, match=rf"^input 0: mesh .* names device {n} but the world has {n} ranks"):
        fdw([x, *inputs[1:]])


def test_placement_on_a_missing_dim(world_mesh, rng):
    with pytest.raises(meshfuse.PlacementError, match=r"Shard\(dim=2\) names dim 2 but the tensor has 2 dims"):
        distribute_tensor(H.randn(rng, 8, 16), world_mesh, [S(2)])


def test_not_a_dtensor(mlp):
    fdw, inputs, arrays = mlp
    with pytest.raises(meshfuse.ValueError, match=r"^input 0: expected a meshfuse.DTensor or a "
                                                  r"torch.distributed.tensor.DTensor, got ndarray$"):
        fdw([arrays[0], *inputs[1:]])
    with pytest.raises(meshfuse.ValueError, match="takes a list of DTensors"):
        fdw(inputs[0])


def test_an_error_in_the_definition_surfaces_at_the_first_call(world_mesh, rng):
    def define(fd):
        fd.add_output(fd.ops.add(fd.define_tensor([4, 8], name="a"), fd.define_tensor([4, 6], name="b")))

    x = distribute_tensor(H.randn(rng, 4, 8), world_mesh, [R])
    with pytest.raises(meshfuse.ShapeError, match="add"):
        FusionDefinitionWrapper(define)([x, x])


def test_the_wrapper_still_works_after_an_error(mlp):
    fdw, inputs, arrays = mlp
    with pytest.raises(meshfuse.Error):
        fdw(inputs[:1])
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), H.mlp(*arrays))


def disagreement(label, odd, usual, odd_rank):
    """The message of a rank given `odd` where the others have `usual`."""
    n = meshfuse.world_size()
    others = [r for r in range(n) if r != odd_rank]
    rank_list = ("rank " if len(others) == 1 else "ranks ") + ", ".join(map(str, others))
    return re.escape(f"the ranks disagree: {label} is {odd} on rank {odd_rank} but {usual} on {rank_list}")


@pytest.mark.world(2, 4)
def test_an_input_that_differs_on_one_rank_fails_on_every_rank(mlp, world_mesh):
    """Only the last rank is given an f16 input: every rank raises the same error before any
    collective (without the check the others would wait in the allreduce until the timeout)."""
    fdw, inputs, arrays = mlp
    last = meshfuse.world_size() - 1
    x = arrays[0].astype(np.float16) if meshfuse.rank() == last else arrays[0]
    mesh = f"[Replicate()] on mesh {world_mesh}"
    with pytest.raises(meshfuse.ValueError, match="^FusionDefinitionWrapper: " + disagreement(
            "input 0 (%0)", f"f16[8, 16] {mesh}", f"f32[8, 16] {mesh}", last) + "$"):
        fdw([distribute_tensor(x, world_mesh, [R]), *inputs[1:]])
    (out,) = fdw(inputs)  # the wrapper still works
    H.assert_close(out.full_tensor(), H.mlp(*arrays))


@pytest.mark.world(2, 4)
def test_local_shapes_that_differ_fail_on_every_rank(mlp, world_mesh):
    fdw, inputs, arrays = mlp
    last = meshfuse.world_size() - 1
    n = meshfuse.world_size()
    rows = 2 if meshfuse.rank() == last else 1  # the others make a global [n, 16], the last [2n, 16]
    x = DTensor.from_local(arrays[0][:rows], world_mesh, [S(0)])
    mesh = f"[Shard(dim=0)] on mesh {world_mesh}"
    with pytest.raises(meshfuse.ValueError, match="^FusionDefinitionWrapper: " + disagreement(
            "input 0 (%0)", f"f32[{2 * n}, 16] {mesh}", f"f32[{n}, 16] {mesh}", last) + "$"):
        fdw([x, *inputs[1:]])
    with pytest.raises(meshfuse.ValueError, match="^DTensor.from_local: " + disagreement(
            "local shape", "[2, 16]", "[1, 16]", last) + "$"):
        DTensor.from_local(arrays[0][:rows], world_mesh, [S(0)], run_check=True)
    agreed = DTensor.from_local(arrays[0][:1], world_mesh, [S(0)], run_check=True)
    assert agreed.shape == (n, 16)


@pytest.mark.world(2, 4)
def test_an_error_on_one_rank_fails_every_rank(mlp):
    fdw, inputs, arrays = mlp
    last = meshfuse.world_size() - 1
    x = arrays[0] if meshfuse.rank() == last else inputs[0]  # the last rank passes a bare array
    with pytest.raises(meshfuse.ValueError, match=rf"^FusionDefinitionWrapper: rank {last} failed: ValueError: input "
                                                  r"0: expected a meshfuse.DTensor or a torch.distributed.tensor."
                                                  r"DTensor, got ndarray$"):
        fdw([x, *inputs[1:]])


@pytest.mark.world(2, 4)
def test_check_inputs_always_checks_cached_signatures_too(rng, world_mesh):
    """check_inputs="first" checks a signature's first call only: a rank that changes its inputs
    on a later call while the others repeat theirs is caught by "always" (one allgather per call)."""
    fdw = FusionDefinitionWrapper(H.define_mlp(16), check_inputs="always")
    arrays = [H.randn(rng, 8, 16), H.randn(rng, 64, 16), H.randn(rng, 16, 64)]
    weights = [distribute_tensor(a, world_mesh, [p]) for a, p in zip(arrays[1:], [S(0), S(1)])]
    for x in [arrays[0], arrays[0] * 2]:
        (out,) = fdw([distribute_tensor(x, world_mesh, [R]), *weights])
        H.assert_close(out.full_tensor(), H.mlp(x, *arrays[1:]))
    last = meshfuse.world_size() - 1
    x = arrays[0][:4] if meshfuse.rank() == last else arrays[0]  # a cached signature, except on the last rank
    with pytest.raises(meshfuse.ValueError, match=r"^FusionDefinitionWrapper: the ranks disagree: input 0 \(%0\) is "
                                                  rf"f32\[4, 16\] .* on rank {last} but f32\[8, 16\]"):
        fdw([distribute_tensor(x, world_mesh, [R]), *weights])


def test_check_inputs_takes_first_always_or_never():
    with pytest.raises(meshfuse.ValueError, match=r"^check_inputs must be one of 'first', 'always', 'never', got "
                                                  r"True$"):
        FusionDefinitionWrapper(H.define_mlp(16), check_inputs=True)


@pytest.mark.world(2, 4)
def test_placements_that_differ_on_one_rank_fail_on_every_rank(mlp, world_mesh):
    """The last rank shards input 0 where the others replicate it (same global shape, same dtype):
    every rank raises the same error, naming the input and which ranks had which placements."""
    fdw, inputs, arrays = mlp
    last = meshfuse.world_size() - 1
    odd = [S(0)] if meshfuse.rank() == last else [R]
    with pytest.raises(meshfuse.ValueError, match="^FusionDefinitionWrapper: " + disagreement(
            "input 0 (%0)", f"f32[8, 16] [Shard(dim=0)] on mesh {world_mesh}",
            f"f32[8, 16] [Replicate()] on mesh {world_mesh}", last) + "$"):
        fdw([distribute_tensor(arrays[0], world_mesh, odd), *inputs[1:]])
    (out,) = fdw(inputs)  # the wrapper still works
    H.assert_close(out.full_tensor(), H.mlp(*arrays))


@pytest.mark.world(2, 4)
def test_meshes_that_differ_on_one_rank_fail_on_every_rank(mlp, world_mesh):
    """The last rank lays input 1 out on the world's ranks in reverse order (its shard is then
    another block of the weight): a disagreement on the mesh, named with both meshes."""
    fdw, inputs, arrays = mlp
    last = meshfuse.world_size() - 1
    reverse = DeviceMesh(list(reversed(range(meshfuse.world_size()))))
    mesh = reverse if meshfuse.rank() == last else world_mesh
    with pytest.raises(meshfuse.ValueError, match="^FusionDefinitionWrapper: " + disagreement(
            "input 1 (%1)", f"f32[64, 16] [Shard(dim=0)] on mesh {reverse}",
            f"f32[64, 16] [Shard(dim=0)] on mesh {world_mesh}", last) + "$"):
        fdw([inputs[0], distribute_tensor(arrays[1], mesh, [S(0)]), inputs[2]])


@pytest.mark.world(2, 4)
def test_from_local_with_run_check_names_a_dtype_or_placement_that_differs(world_mesh, rng):
    """DTensor.from_local(run_check=True), as torch's: the blocks' dtype and placements must agree."""
    last = meshfuse.world_size() - 1
    block = H.randn(rng, 2, 16)
    odd_dtype = block.astype(np.float16) if meshfuse.rank() == last else block
    with pytest.raises(meshfuse.ValueError, match="^DTensor.from_local: " + disagreement(
            "dtype", "f16", "f32", last) + "$"):
        DTensor.from_local(odd_dtype, world_mesh, [S(0)], run_check=True)
    odd_placement = [R] if meshfuse.rank() == last else [S(0)]
    with pytest.raises(meshfuse.ValueError, match="^DTensor.from_local: " + disagreement(
            "placements", "[Replicate()]", "[Shard(dim=0)]", last) + "$"):
        DTensor.from_local(block, world_mesh, odd_placement, run_check=True)


def test_a_tensor_larger_than_memory_is_refused_naming_it(world_mesh):
    """An intermediate larger than the machine's memory (the outer product of 2^20 rows and 2^20
    columns: 4 TiB of f32, split over the ranks): a RuntimeError naming the tensor, its dtype, shape
    and bytes on every rank, raised before anything runs (no std::bad_alloc, no crash, no OOM kill;
    nothing that large is touched). The wrapper still works afterwards."""
    def define(fd):
        a = fd.define_tensor([-1, 1])
        b = fd.define_tensor([1, -1])
        fd.add_output(fd.ops.relu(fd.ops.matmul(a, b)))

    n = meshfuse.world_size()
    rows, cols = 1 << 20, 1 << 20  # rows per rank
    fdw = FusionDefinitionWrapper(define)
    a = distribute_tensor(np.ones((rows * n, 1), np.float32), world_mesh, [S(0)])
    b = distribute_tensor(np.ones((1, cols), np.float32), world_mesh, [R])
    ranks = ("rank " if n == 1 else "ranks ") + ", ".join(map(str, range(n)))
    with pytest.raises(meshfuse.RuntimeError, match=re.escape(
            f"cannot allocate %2 on {ranks}, a f32 tensor of shape [{rows}, {cols}]: {rows * cols * 4} bytes "
            "(4 TiB), more than the ") + r"[0-9.]+ [KMGT]iB of (host memory|memory of GPU \d+)"):
        fdw([a, b])
    small = [distribute_tensor(np.full((2 * n, 1), 2, np.float32), world_mesh, [S(0)]),
             distribute_tensor(np.full((1, 3), -1, np.float32), world_mesh, [R])]
    (out,) = fdw(small)
    H.assert_close(out.full_tensor(), np.zeros((2 * n, 3)))
