"""Bad input to a FusionDefinitionWrapper raises a meshfuse.Error with a clear message on EVERY
rank (each rank asserts it here, and the barrier after each test proves that no rank went on
into a collective), never a hang."""

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
