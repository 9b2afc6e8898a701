"""A size-1 dim is a dim like any other to a placement (issue 14): a mesh axis of one device shards
it, whether the array comes from distribute_tensor, DTensor(...) or torch, and whatever the
definition calls it (a definition's 1 is a broadcast dim: one elementwise ops may expand). Over
two devices or more it is an uneven shard (torch.chunk: the first rank holds it, the others
nothing). numpy is the oracle."""

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard

import helpers as H

R, S = Replicate(), Shard


def define_exp(shape):
    def define(fd):
        fd.add_output(fd.ops.exp(fd.define_tensor(shape)))

    return define


@pytest.mark.parametrize("definition_shape", [[1, 4], [-1, -1]])
def test_distribute_tensor_shards_a_size_one_dim_on_one_device(definition_shape, rng):
    full = H.randn(rng, 1, 4)
    mesh = DeviceMesh([0])
    x = meshfuse.distribute_tensor(full, mesh, [S(0)])
    assert x.placements == (S(0),) and x.shape == (1, 4)
    built = meshfuse.DTensor(full if meshfuse.rank() == 0 else None, mesh, [S(0)], shape=(1, 4))
    fdw = FusionDefinitionWrapper(define_exp(definition_shape))
    for d in (x, built):
        assert H.kinds(fdw.plan([d])) == []
        (y,) = fdw([d])
        assert y.placements == (S(0),)
        if meshfuse.rank() == 0:
            np.testing.assert_array_equal(x.to_local(), full)
            H.assert_close(y.full_tensor(), np.exp(full.astype(np.float64)))


def test_a_size_one_dim_over_several_devices_is_an_uneven_shard(world_mesh, rng):
    """One row over n ranks: rank 0 holds it, the others an empty block (torch.chunk); exp runs on
    each block, the empty ones included."""
    full = H.randn(rng, 1, 4)
    x = meshfuse.distribute_tensor(full, world_mesh, [S(0)])
    assert x.to_local().shape == ((1, 4) if meshfuse.rank() == 0 else (0, 4))
    (y,) = FusionDefinitionWrapper(define_exp([-1, 4]))([x])
    assert y.placements == (S(0),)
    H.assert_close(y.full_tensor(), np.exp(full.astype(np.float64)))


# A [1, n] mesh: axis 0 has one device, axis 1 every rank. x's size-1 dim is sharded on axis 0;
# add expands it against z's 8 rows, which needs it whole on axis 0: where it already is.
def test_a_size_one_dim_on_a_one_device_mesh_axis(rng):
    n = meshfuse.world_size()
    mesh = DeviceMesh([list(range(n))])
    x, z = H.randn(rng, 1, 4 * n), H.randn(rng, 8, 4 * n)

    def define(fd):
        a, b = fd.define_tensor([1, 4 * n]), fd.define_tensor([8, 4 * n])
        fd.add_output(fd.ops.exp(a))
        fd.add_output(fd.ops.add(a, b))

    (e, s), plan, outs = H.run(define, [x, z], [[S(0), S(1)], [R, S(1)]], mesh)
    H.assert_close(e, np.exp(x.astype(np.float64)))
    H.assert_close(s, x.astype(np.float64) + z)
    assert H.kinds(plan) == []
    assert [o.placements for o in outs] == [(S(0), S(1)), (R, S(1))]
    assert outs[0].to_local().shape == (1, 4)


def test_torch_dtensor_with_a_size_one_dim_on_a_one_device_mesh_axis(rng):
    torch = pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor as TorchDTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor as torch_distribute

    from meshfuse.torch_interop import init_process_group

    init_process_group()
    n = meshfuse.world_size()
    mesh = init_device_mesh("cpu", (1, n))
    full = H.randn(rng, 1, 4 * n)
    x = torch_distribute(torch.from_numpy(full), mesh, [TShard(0), TShard(1)])  # torch accepts it
    fdw = FusionDefinitionWrapper(define_exp([1, 4 * n]))
    (y,) = fdw([x])
    assert isinstance(y, TorchDTensor) and y.device_mesh is mesh and y.placements == (TShard(0), TShard(1))
    assert tuple(y.to_local().shape) == (1, 4)
    H.assert_close(y.full_tensor().numpy(), np.exp(full.astype(np.float64)))
    assert H.kinds(fdw.plan([x])) == []
