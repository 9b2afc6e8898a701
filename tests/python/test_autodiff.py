"""fdw.value_and_grad: reverse-mode autodiff through the normal executor path, against
torch.autograd (computed in f64) on one device and sharded over 1, 2 and 4 ranks; the gradient
collectives of the backward plans; the typed errors."""

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import DataType, Replicate, Shard

import helpers as H

R = Replicate()


def _world_mesh():
    return meshfuse.DeviceMesh(list(range(meshfuse.world_size())))


def _grads(define, arrays, wrt, grad_outputs=None, placements=None, **kw):
    """(full outputs, full gradients, the wrapper) of value_and_grad on the world mesh."""
    mesh = _world_mesh()
    placements = placements or [[R]] * len(arrays)
    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]
    gos = None if grad_outputs is None else [meshfuse.distribute_tensor(g, mesh, [R]) for g in grad_outputs]
    outs, grads = fdw.value_and_grad(inputs, wrt, gos, **kw)
    for g, i in zip(grads, wrt):  # each gradient is laid out like its input
        assert g.placements == inputs[i].placements and g.shape == inputs[i].shape
        assert g.device_mesh == inputs[i].device_mesh
    return [o.full_tensor() for o in outs], [g.full_tensor() for g in grads], fdw


def _torch_grads(fn, arrays, wrt, grad_output):
    ts = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=(i in wrt)) for i, a in enumerate(arrays)]
    out = fn(*ts)
    out.backward(torch.tensor(np.asarray(grad_output, dtype=np.float64)))
    return out.detach().numpy(), [ts[i].grad.numpy() for i in wrt]


F = torch.nn.functional
# (id, shapes, definition body (fd, *inputs) -> output, torch function, positive inputs)
CASES = [
    ("linear_bias", [(3, 2, 4), (5, 4), (5,)], lambda fd, x, w, b: fd.ops.linear(x, w, b), F.linear, False),
    ("matmul_batched", [(2, 3, 4), (2, 4, 5)], lambda fd, a, b: fd.ops.matmul(a, b), torch.matmul, False),
    ("matmul_shared", [(2, 3, 4), (4, 5)], lambda fd, a, b: fd.ops.matmul(a, b), torch.matmul, False),
    ("permute_matmul", [(4, 3), (4, 2)], lambda fd, a, b: fd.ops.matmul(fd.ops.permute(a, [1, 0]), b),
     lambda a, b: a.permute(1, 0) @ b, False),
    ("broadcast_mul_add", [(3, 4), (1, 4), (3, 1)], lambda fd, x, y, z: fd.ops.add(fd.ops.mul(x, y), z),
     lambda x, y, z: x * y + z, False),
    ("div_pow", [(3, 4), (3, 4)], lambda fd, x, y: fd.ops.pow(fd.ops.div(x, y), y),
     lambda x, y: (x / y) ** y, True),
    ("gelu_erf", [(3, 4)], lambda fd, x: fd.ops.gelu(x), F.gelu, False),
    ("gelu_tanh", [(3, 4)], lambda fd, x: fd.ops.gelu(x, approximate="tanh"),
     lambda x: F.gelu(x, approximate="tanh"), False),
    ("silu_sigmoid_tanh", [(3, 4)], lambda fd, x: fd.ops.silu(fd.ops.sigmoid(fd.ops.tanh(x))),
     lambda x: F.silu(torch.sigmoid(torch.tanh(x))), False),
    ("exp_log_rsqrt_sqrt", [(3, 4)], lambda fd, x: fd.ops.rsqrt(fd.ops.sqrt(fd.ops.log(fd.ops.exp(x)))),
     lambda x: torch.rsqrt(torch.sqrt(torch.log(torch.exp(x)))), True),
    ("relu_abs_neg_recip", [(3, 4)], lambda fd, x: fd.ops.reciprocal(fd.ops.add(fd.ops.abs(fd.ops.neg(fd.ops.relu(x))), 1.0)),
     lambda x: torch.reciprocal(torch.abs(-torch.relu(x)) + 1.0), False),
    ("maximum_minimum_where", [(3, 4), (3, 4)],
     lambda fd, x, y: fd.ops.where(fd.ops.gt(x, 0.0), fd.ops.maximum(x, y), fd.ops.minimum(x, y)),
     lambda x, y: torch.where(x > 0, torch.maximum(x, y), torch.minimum(x, y)), False),
    ("sum_mean_max", [(3, 4, 5)],
     lambda fd, x: fd.ops.add(fd.ops.sum(x, [0]), fd.ops.mul(fd.ops.mean(x, [0]), fd.ops.max(x, [0]))),
     lambda x: x.sum(0) + x.mean(0) * x.amax(0), False),
    ("reshape_slice_cat", [(2, 6), (2, 3)],
     lambda fd, x, y: fd.ops.cat([fd.ops.slice(fd.ops.reshape(x, [4, 3]), [1, 0], [3, 3]), y], 1),
     lambda x, y: torch.cat([x.reshape(4, 3)[1:3, :], y], 1), False),
    ("broadcast_in_dim", [(3, 1)], lambda fd, x: fd.ops.broadcast_in_dim(x, [2, 3, 4], [1, 2]),
     lambda x: x.expand(3, 4).unsqueeze(0).expand(2, 3, 4), False),
    ("softmax", [(3, 5)], lambda fd, x: fd.ops.softmax(x, 1), lambda x: torch.softmax(x, 1), False),
    ("layer_norm", [(2, 3, 8), (8,), (8,)], lambda fd, x, w, b: fd.ops.layer_norm(x, w, b),
     lambda x, w, b: F.layer_norm(x, (8,), w, b), False),
    ("rms_norm", [(3, 8), (8,)], lambda fd, x, w: fd.ops.rms_norm(x, w),
     lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w, False),
    ("sdpa", [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)], lambda fd, q, k, v: fd.ops.sdpa(q, k, v),
     F.scaled_dot_product_attention, False),
    ("sdpa_causal", [(2, 2, 4, 4)] * 3, lambda fd, q, k, v: fd.ops.sdpa(q, k, v, is_causal=True),
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), False),
]


@pytest.mark.parametrize("name,shapes,body,oracle,positive", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_torch_autograd(name, shapes, body, oracle, positive, rng):
    arrays = [H.randn(rng, *s) for s in shapes]
    if positive:
        arrays = [np.abs(a) + 0.5 for a in arrays]

    def define(fd):
        fd.add_output(body(fd, *[fd.define_tensor(list(s)) for s in shapes]))

    wrt = list(range(len(shapes)))
    want_out, want = None, None
    out_shape = oracle(*[torch.tensor(a, dtype=torch.float64) for a in arrays]).shape
    g = H.randn(rng, *out_shape)
    want_out, want = _torch_grads(oracle, arrays, wrt, g)
    (out,), grads, _ = _grads(define, arrays, wrt, [g])
    H.assert_close(out, want_out)
    for got, exp in zip(grads, want):
        H.assert_close(got, exp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "sdpa_causal"])
def test_bf16_gradients_within_bf16_tolerance(op, rng):
    shape = (2, 2, 4, 8)
    arrays = [H.randn(rng, *shape) for _ in range(3 if op == "sdpa_causal" else 1)]
    body = {"softmax": lambda fd, x: fd.ops.softmax(x, 3), "layer_norm": lambda fd, x: fd.ops.layer_norm(x),
            "sdpa_causal": lambda fd, q, k, v: fd.ops.sdpa(q, k, v, is_causal=True)}[op]
    oracle = {"softmax": lambda x: torch.softmax(x, 3), "layer_norm": lambda x: F.layer_norm(x, (8,)),
              "sdpa_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}[op]

    def define(fd):
        fd.add_output(body(fd, *[fd.define_tensor(list(shape), DataType.BFloat16) for _ in arrays]))

    bf = [torch.tensor(a).to(torch.bfloat16) for a in arrays]
    g = torch.tensor(H.randn(rng, *shape)).to(torch.bfloat16)
    _, want = _torch_grads(oracle, [t.double().numpy() for t in bf], list(range(len(bf))), g.double().numpy())
    mesh = _world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(t, mesh, [R]) for t in bf]
    _, grads = fdw.value_and_grad(inputs, list(range(len(bf))), [meshfuse.distribute_tensor(g, mesh, [R])])
    for got, exp in zip(grads, want):
        assert got.dtype == DataType.BFloat16
        full = got.full_tensor()
        full = full.double().numpy() if isinstance(full, torch.Tensor) else np.asarray(full, np.float64)
        np.testing.assert_allclose(full, exp, rtol=3e-2, atol=3e-2 * np.abs(exp).max())


def _mlp(fd):
    x = fd.define_tensor([-1, 8], name="x")
    w1 = fd.define_tensor([16, 8], name="w1")
    w2 = fd.define_tensor([8, 16], name="w2")
    fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, w1), approximate="tanh"), w2))


def _mlp_torch(x, w1, w2):
    return F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2)


@pytest.mark.parametrize("save_all", [False, True], ids=["default_policy", "save_all"])
def test_scalar_loss_seed_is_one(save_all, rng):
    def define(fd):
        x = fd.define_tensor([-1, 8], name="x")
        w = fd.define_tensor([4, 8], name="w")
        y = fd.ops.linear(x, w)
        fd.add_output(fd.ops.mean(fd.ops.mul(y, y), [0, 1]))

    x, w = H.randn(rng, 6, 8), H.randn(rng, 4, 8)
    (loss,), (gw,), fdw = _grads(define, [x, w], [1], save_all=save_all)
    want_loss, (want_gw,) = _torch_grads(lambda x, w: (F.linear(x, w) ** 2).mean(), [x, w], [1], 1.0)
    H.assert_close(loss, want_loss)
    H.assert_close(gw, want_gw)
    mesh = _world_mesh()
    _, bwd = fdw.grad_plans([meshfuse.distribute_tensor(a, mesh, [R]) for a in (x, w)], [1], save_all=save_all)
    # The policy's decisions: the linear's output is saved either way; mul is recomputed by default.
    assert "GEMM output (linear)" in bwd.saves
    assert ("mul output (save-all policy)" in bwd.saves) == save_all, bwd.saves


@pytest.mark.parametrize("wrt", [[0, 1, 2], [1, 2]], ids=["with_input", "weights_only"])
def test_tensor_parallel_mlp(wrt, rng):
    """Megatron: w1 column-parallel (Shard(0)), w2 row-parallel (Shard(1)), x replicated. The
    backward's only collective is the allreduce of x's gradient (the f/g pair's g)."""
    n = meshfuse.world_size()
    x, w1, w2 = H.randn(rng, 6, 8), H.randn(rng, 16, 8), H.randn(rng, 8, 16)
    g = H.randn(rng, 6, 8)
    placements = [[R], [Shard(0)], [Shard(1)]]
    (out,), grads, fdw = _grads(_mlp, [x, w1, w2], wrt, [g], placements)
    want_out, want = _torch_grads(_mlp_torch, [x, w1, w2], wrt, g)
    H.assert_close(out, want_out)
    for got, exp in zip(grads, want):
        H.assert_close(got, exp)
    mesh = _world_mesh()
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip([x, w1, w2], placements)]
    _, bwd = fdw.grad_plans(inputs, wrt, [meshfuse.distribute_tensor(g, mesh, [R])])
    expected = ["allreduce"] if (0 in wrt and n > 1) else []
    assert H.kinds(bwd) == expected, bwd.host_ir()


def test_data_parallel_mlp(rng):
    """DDP: the batch is Shard(0), the weights replicated. Each weight's gradient is the global
    batch's (exact semantics), allreduced once per weight."""
    n = meshfuse.world_size()
    x, w1, w2 = H.randn(rng, 4 * n, 8), H.randn(rng, 16, 8), H.randn(rng, 8, 16)
    g = H.randn(rng, 4 * n, 8)
    placements = [[Shard(0)], [R], [R]]
    mesh = _world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(_mlp)
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip([x, w1, w2], placements)]
    seed = [meshfuse.distribute_tensor(g, mesh, [Shard(0)])]
    (out,), grads = fdw.value_and_grad(inputs, [0, 1, 2], seed)
    want_out, want = _torch_grads(_mlp_torch, [x, w1, w2], [0, 1, 2], g)
    H.assert_close(out.full_tensor(), want_out)
    assert [gr.placements for gr in grads] == [(Shard(0),), (R,), (R,)]
    for got, exp in zip(grads, want):
        H.assert_close(got.full_tensor(), exp)
    _, bwd = fdw.grad_plans(inputs, [0, 1, 2], seed)
    assert H.kinds(bwd) == (["allreduce", "allreduce"] if n > 1 else []), bwd.host_ir()


def test_data_parallel_scalar_loss_is_the_global_batch_loss(rng):
    n = meshfuse.world_size()

    def define(fd):
        x = fd.define_tensor([-1, 8], name="x")
        w = fd.define_tensor([4, 8], name="w")
        y = fd.ops.tanh(fd.ops.linear(x, w))
        fd.add_output(fd.ops.sum(fd.ops.mul(y, y), [0, 1]))

    x, w = H.randn(rng, 2 * n, 8), H.randn(rng, 4, 8)
    (loss,), (gw,), _ = _grads(define, [x, w], [1], placements=[[Shard(0)], [R]])
    want_loss, (want_gw,) = _torch_grads(lambda x, w: (torch.tanh(F.linear(x, w)) ** 2).sum(), [x, w], [1], 1.0)
    H.assert_close(loss, want_loss)
    H.assert_close(gw, want_gw)


def test_error_integer_input(rng):
    def define(fd):
        x = fd.define_tensor([3], name="x")
        n = fd.define_tensor([3], DataType.Int64, name="n")
        fd.add_output(fd.ops.sum(fd.ops.mul(x, n), [0]))

    mesh = _world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(np.ones(3, np.float32), mesh, [R]),
              meshfuse.distribute_tensor(np.ones(3, np.int64), mesh, [R])]
    with pytest.raises(meshfuse.DtypeError, match=r"cannot differentiate with respect to input 1 \(%n\) of dtype "
                                                  r"i64: only floating-point \(f32, bf16, f16\) inputs have gradients"):
        fdw.value_and_grad(inputs, [1])
    with pytest.raises(meshfuse.ValueError, match=r"wrt must list input indices in \[0, 2\), got 5"):
        fdw.value_and_grad(inputs, [5])


def test_error_non_scalar_output_without_grad_outputs(rng):
    mesh = _world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(_mlp)
    inputs = [meshfuse.distribute_tensor(H.randn(rng, *s), mesh, [R]) for s in [(6, 8), (16, 8), (8, 16)]]
    with pytest.raises(meshfuse.ValueError,
                       match=r"without grad_outputs the definition must have one scalar output \(its seed is 1\), "
                             r"but output 0 \(%\d+\) has shape \[6, 8\]: pass grad_outputs"):
        fdw.value_and_grad(inputs, [1])
    bad = [meshfuse.distribute_tensor(H.randn(rng, 6, 4), mesh, [R])]
    with pytest.raises(meshfuse.ShapeError,
                       match=r"grad_outputs\[0\] has shape \[6, 4\] but output 0 \(%\d+\) has shape \[6, 8\]"):
        fdw.value_and_grad(inputs, [1], bad)


def test_torch_dtensors_in_torch_dtensor_gradients_out(rng):
    """torch DTensors (gloo on CPU) in: the gradients are torch DTensors on the same torch mesh
    with their inputs' placements; a scalar loss is seeded with a replicated torch 1."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor as TorchDTensor, Replicate as TR, Shard as TS
    from torch.distributed.tensor import distribute_tensor as torch_distribute
    from meshfuse.torch_interop import init_process_group

    init_process_group()
    assert dist.get_world_size() == meshfuse.world_size()
    tmesh = init_device_mesh("cpu", (meshfuse.world_size(),))

    def loss_define(fd):
        x = fd.define_tensor([-1, 8], name="x")
        w1 = fd.define_tensor([16, 8], name="w1")
        w2 = fd.define_tensor([8, 16], name="w2")
        y = fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, w1), approximate="tanh"), w2)
        fd.add_output(fd.ops.mean(fd.ops.mul(y, y), [0, 1]))

    arrays = [H.randn(rng, 6, 8), H.randn(rng, 16, 8), H.randn(rng, 8, 16)]
    placements = [TR(), TS(0), TS(1)]
    inputs = [torch_distribute(torch.from_numpy(a).float(), tmesh, [p]) for a, p in zip(arrays, placements)]
    fdw = meshfuse.FusionDefinitionWrapper(loss_define)
    (loss,), grads = fdw.value_and_grad(inputs, [0, 1, 2])
    want_loss, want = _torch_grads(lambda x, w1, w2: (_mlp_torch(x, w1, w2) ** 2).mean(), arrays, [0, 1, 2], 1.0)
    assert isinstance(loss, TorchDTensor)
    H.assert_close(loss.full_tensor().numpy(), want_loss)
    for g, p, exp in zip(grads, placements, want):
        assert isinstance(g, TorchDTensor) and g.device_mesh is tmesh and g.placements == (p,)
        H.assert_close(g.full_tensor().numpy(), exp)


@pytest.mark.parametrize("kind", ["fsdp", "sequence_parallel"])
def test_fsdp_and_sequence_parallel_mlp(kind, rng):
    """FSDP (batch and every weight Shard(0), parameters gathered where used): backward gathers
    the weights again and reduce-scatters their gradients. Sequence parallelism (x Shard(0), w1
    column-, w2 row-parallel): the gradients match and keep their inputs' placements."""
    n = meshfuse.world_size()
    x, w1, w2 = H.randn(rng, 4 * n, 8), H.randn(rng, 16, 8), H.randn(rng, 8, 16)
    g = H.randn(rng, 4 * n, 8)
    placements = [[Shard(0)], [Shard(0)], [Shard(0)]] if kind == "fsdp" else [[Shard(0)], [Shard(0)], [Shard(1)]]
    mesh = _world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(_mlp, fsdp=(kind == "fsdp"))
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip([x, w1, w2], placements)]
    seed = [meshfuse.distribute_tensor(g, mesh, [Shard(0)])]
    (out,), grads = fdw.value_and_grad(inputs, [0, 1, 2], seed)
    want_out, want = _torch_grads(_mlp_torch, [x, w1, w2], [0, 1, 2], g)
    H.assert_close(out.full_tensor(), want_out)
    assert [gr.placements for gr in grads] == [tuple(p) for p in placements]
    for got, exp in zip(grads, want):
        H.assert_close(got.full_tensor(), exp)
    if kind == "fsdp":
        _, bwd = fdw.grad_plans(inputs, [0, 1, 2], seed)
        assert H.kinds(bwd) == (["allgather", "allgather", "reduce_scatter", "reduce_scatter"] if n > 1 else []), \
            bwd.host_ir()
