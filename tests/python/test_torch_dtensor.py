"""torch.distributed.tensor.DTensor in, torch DTensor out (gloo on CPU): meshes and placements
translated both ways, local tensors viewed zero-copy; numpy is the oracle. Also the seed's
user-API example with both kinds of DTensor."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor as TorchDTensor  # noqa: E402
from torch.distributed.tensor import Partial as TPartial  # noqa: E402
from torch.distributed.tensor import Replicate as TReplicate  # noqa: E402
from torch.distributed.tensor import Shard as TShard  # noqa: E402
from torch.distributed.tensor import distribute_tensor as torch_distribute  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import FusionDefinitionWrapper  # noqa: E402
from meshfuse.torch_interop import init_process_group  # noqa: E402

import helpers as H  # noqa: E402

HIDDEN = 16


@pytest.fixture(scope="module")
def torch_mesh():
    init_process_group()
    assert dist.get_rank() == meshfuse.rank() and dist.get_world_size() == meshfuse.world_size()
    yield init_device_mesh("cpu", (meshfuse.world_size(),))


def seed_example(kind, rng, torch_mesh):
    """The seed's "User API" section, verbatim apart from the inputs' construction."""
    h = HIDDEN

    def define_fusion(fd):
        inp = fd.define_tensor([-1, h])  # [batch * sequence, hidden]
        up_w = fd.define_tensor([h * 4, h])
        out = fd.ops.linear(inp, up_w)
        out = fd.ops.gelu(out)
        down_w = fd.define_tensor([h, h * 4])
        out = fd.ops.linear(out, down_w)
        fd.add_output(out)

    arrays = [H.randn(rng, 8, h), H.randn(rng, 4 * h, h), H.randn(rng, h, 4 * h)]
    if kind == "torch":
        inp_dtensors = [torch_distribute(torch.from_numpy(a), torch_mesh, [p])
                        for a, p in zip(arrays, [TReplicate(), TShard(0), TShard(1)])]
    else:
        mesh = H.world_mesh()
        inp_dtensors = [meshfuse.distribute_tensor(a, mesh, [p])
                        for a, p in zip(arrays, [meshfuse.Replicate(), meshfuse.Shard(0), meshfuse.Shard(1)])]
    fdw = FusionDefinitionWrapper(define_fusion)
    out_dtensors = fdw(inp_dtensors)
    return fdw, inp_dtensors, out_dtensors, arrays


@pytest.mark.parametrize("kind", ["meshfuse", "torch"])
def test_the_seed_user_api_example(kind, rng, torch_mesh):
    fdw, inputs, (out,), arrays = seed_example(kind, rng, torch_mesh)
    want = H.mlp(*arrays, approximate="none")
    if kind == "torch":
        assert isinstance(out, TorchDTensor) and out.device_mesh is torch_mesh
        assert out.placements == (TReplicate(),) and tuple(out.shape) == (8, HIDDEN)
        H.assert_close(out.full_tensor().numpy(), want)
    else:
        assert isinstance(out, meshfuse.DTensor) and out.placements == (meshfuse.Replicate(),)
        H.assert_close(out.full_tensor(), want)
    assert H.kinds(fdw.plan(inputs)) == H.expect(["allreduce"])


def test_shard0_plus_one_keeps_mesh_and_placements(rng, torch_mesh):
    x = torch.from_numpy(H.randn(rng, 8, 4))
    xd = torch_distribute(x, torch_mesh, [TShard(0)])
    (y,) = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.define_tensor([-1, 4]) + 1))([xd])
    assert isinstance(y, TorchDTensor)
    assert y.device_mesh is torch_mesh and y.placements == (TShard(0),)
    assert y.to_local().shape == xd.to_local().shape and tuple(y.shape) == (8, 4)
    H.assert_close(y.full_tensor().numpy(), x.numpy() + 1)


def test_sequence_parallel_mlp_gives_torch_shard0(rng, torch_mesh):
    arrays = [H.randn(rng, 8, HIDDEN), H.randn(rng, 4 * HIDDEN, HIDDEN), H.randn(rng, HIDDEN, 4 * HIDDEN)]
    inputs = [torch_distribute(torch.from_numpy(a), torch_mesh, [p]) for a, p in
              zip(arrays, [TShard(0), TShard(0), TShard(1)])]
    fdw = FusionDefinitionWrapper(H.define_mlp(HIDDEN))
    (out,) = fdw(inputs)
    assert out.placements == (TShard(0),)
    H.assert_close(out.full_tensor().numpy(), H.mlp(*arrays))
    plan = fdw.plan(inputs)
    assert H.kinds(plan) == H.expect(["allgather", "reduce_scatter"])
    assert plan.output_placements == [(meshfuse.Shard(0),)]


def test_partial_torch_output(rng, torch_mesh):
    a, b = H.randn(rng, 8, 16), H.randn(rng, 16, 12)

    def define(fd):
        y = fd.ops.matmul(fd.define_tensor([8, 16]), fd.define_tensor([16, 12]))
        y._set_placements(H.world_mesh(), [meshfuse.Partial()])
        fd.add_output(y)

    ins = [torch_distribute(torch.from_numpy(a), torch_mesh, [TShard(1)]),
           torch_distribute(torch.from_numpy(b), torch_mesh, [TShard(0)])]
    (y,) = FusionDefinitionWrapper(define)(ins)
    assert y.placements == (TPartial(),)
    H.assert_close(y.full_tensor().numpy(), a.astype(np.float64) @ b)  # torch sums the partials


@pytest.mark.world(4)
def test_2x2_torch_mesh_data_times_tensor_parallel(rng):
    mesh2 = init_device_mesh("cpu", (2, 2))
    arrays = [H.randn(rng, 8, HIDDEN), H.randn(rng, 4 * HIDDEN, HIDDEN), H.randn(rng, HIDDEN, 4 * HIDDEN)]
    placements = [[TShard(0), TReplicate()], [TReplicate(), TShard(0)], [TReplicate(), TShard(1)]]
    inputs = [torch_distribute(torch.from_numpy(a), mesh2, p) for a, p in zip(arrays, placements)]
    fdw = FusionDefinitionWrapper(H.define_mlp(HIDDEN))
    (out,) = fdw(inputs)
    assert out.device_mesh is mesh2 and out.placements == (TShard(0), TReplicate())
    H.assert_close(out.full_tensor().numpy(), H.mlp(*arrays))
    [c] = fdw.plan(inputs).collectives()
    assert c.kind == "allreduce" and c.mesh_axis == 1


def test_bfloat16_through_torch(rng, torch_mesh):
    x = torch.from_numpy(H.randn(rng, 8, 16)).bfloat16()
    w = torch.from_numpy(H.randn(rng, 12, 16)).bfloat16()

    def define(fd):
        a = fd.define_tensor([-1, 16], dtype=meshfuse.DataType.BFloat16)
        b = fd.define_tensor([12, 16], dtype=meshfuse.DataType.BFloat16)
        fd.add_output(fd.ops.linear(a, b))

    (y,) = FusionDefinitionWrapper(define)([torch_distribute(x, torch_mesh, [TShard(0)]),
                                            torch_distribute(w, torch_mesh, [TReplicate()])])
    assert y.dtype == torch.bfloat16 and y.placements == (TShard(0),)
    H.assert_close(y.full_tensor().float().numpy(), x.double().numpy() @ w.double().numpy().T, rtol=2e-2, atol=5e-2)


def test_meshfuse_dtensors_over_torch_locals_are_zero_copy(rng):
    mesh = H.world_mesh()
    local = torch.from_numpy(H.randn(rng, 4, 8))
    x = meshfuse.DTensor.from_local(local, mesh, [meshfuse.Shard(0)])
    assert x.to_local() is local
    (y,) = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.ops.relu(fd.define_tensor([-1, 8]))))([x])
    assert isinstance(y, meshfuse.DTensor) and isinstance(y.to_local(), torch.Tensor)
    H.assert_close(y.to_local().numpy(), np.maximum(local.numpy(), 0))
    # The output's torch tensor views meshfuse's buffer: same address as the C++ output.
    assert y.to_local().data_ptr() == y._cpp.data_ptr


def test_mixed_inputs_give_torch_outputs(rng, torch_mesh):
    a, b = H.randn(rng, 8, 4), H.randn(rng, 8, 4)
    ta = torch_distribute(torch.from_numpy(a), torch_mesh, [TShard(0)])
    mb = meshfuse.distribute_tensor(b, H.world_mesh(), [meshfuse.Shard(0)])
    (y,) = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.define_tensor([-1, 4]) * fd.define_tensor([-1, 4])))(
        [ta, mb])
    assert isinstance(y, TorchDTensor) and y.device_mesh is torch_mesh
    H.assert_close(y.full_tensor().numpy(), a * b)


def test_inputs_requiring_grad_are_read_detached(rng, torch_mesh):
    x = torch_distribute(torch.from_numpy(H.randn(rng, 8, 4)).requires_grad_(), torch_mesh, [TShard(0)])
    (y,) = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor([-1, 4]))))([x])
    H.assert_close(y.full_tensor().numpy(), np.exp(x.full_tensor().detach().double().numpy()))


def test_unsupported_torch_placements_are_errors(rng, torch_mesh):
    x = torch_distribute(torch.from_numpy(H.randn(rng, 8, 4)), torch_mesh, [TReplicate()])
    x_max = TorchDTensor.from_local(x.to_local(), torch_mesh, [TPartial("max")], run_check=False)
    fdw = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.ops.neg(fd.define_tensor([-1, 4]))))
    with pytest.raises(meshfuse.UnsupportedError, match=r"only Partial sums are supported"):
        fdw([x_max])
    with pytest.raises(meshfuse.DtypeError, match=r"^input 0: unsupported element type float64"):
        fdw([torch_distribute(torch.zeros(8, 4, dtype=torch.float64), torch_mesh, [TReplicate()])])


def test_uneven_torch_shards_go_in_and_come_out_as_torch_lays_them_out(rng, torch_mesh):
    """torch shards 7 rows as 4 + 3 (2 + 2 + 2 + 1): meshfuse takes the blocks as they are and
    gives back a torch DTensor of the same layout, local blocks of different sizes."""
    full = H.randn(rng, 7, 4)
    x = torch_distribute(torch.from_numpy(full), torch_mesh, [TShard(0)])
    fdw = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.define_tensor([-1, 4], name="x") + 1))
    (y,) = fdw([x])
    assert isinstance(y, TorchDTensor) and tuple(y.shape) == (7, 4)
    assert tuple(y.to_local().shape) == tuple(x.to_local().shape)
    H.assert_close(y.full_tensor().numpy(), full.astype(np.float64) + 1)
    assert H.kinds(fdw.plan([x])) == []


@pytest.mark.world(2, 4)
def test_sequence_parallel_mlp_with_8_then_7_tokens(rng, torch_mesh):
    """The cache keys on the global shape: 7 tokens is not the cached 8 on any rank (ranks holding
    4 rows of both would otherwise hit the cache while the others compile)."""
    weights = [torch_distribute(torch.from_numpy(a), torch_mesh, [p]) for a, p in
               [(H.randn(rng, 4 * HIDDEN, HIDDEN), TShard(0)), (H.randn(rng, HIDDEN, 4 * HIDDEN), TShard(1))]]

    def define(fd):
        x, up_w, down_w = fd.define_tensor([-1, HIDDEN], name="x"), fd.define_tensor([4 * HIDDEN, HIDDEN]), \
            fd.define_tensor([HIDDEN, 4 * HIDDEN])
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, up_w), approximate="tanh"), down_w))

    fdw = FusionDefinitionWrapper(define)
    x8 = H.randn(rng, 8, HIDDEN)
    (out,) = fdw([torch_distribute(torch.from_numpy(x8), torch_mesh, [TShard(0)]), *weights])
    H.assert_close(out.full_tensor().numpy(), H.mlp(x8, *(w.full_tensor().numpy() for w in weights)))
    x7 = H.randn(rng, 7, HIDDEN)
    (out,) = fdw([torch_distribute(torch.from_numpy(x7), torch_mesh, [TShard(0)]), *weights])
    H.assert_close(out.full_tensor().numpy(), H.mlp(x7, *(w.full_tensor().numpy() for w in weights)))
    assert fdw.cache_size == 2
