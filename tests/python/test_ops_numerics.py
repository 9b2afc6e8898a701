"""Every op of the issue's list, run through FusionDefinitionWrapper on the world's ranks and
compared with numpy. Inputs are replicated unless said; where an op allows it, sharded too."""

import sys

import numpy as np
import pytest

import meshfuse
from meshfuse import DataType, Replicate, Shard

import helpers as H

R, S = Replicate(), Shard


def unary_case(op, oracle, positive=False, **kw):
    return pytest.param(op, oracle, positive, kw, id=op + ("_" + "_".join(map(str, kw.values())) if kw else ""))


@pytest.mark.parametrize("op,oracle,positive,kw", [
    unary_case("neg", np.negative), unary_case("exp", np.exp), unary_case("log", np.log, positive=True),
    unary_case("tanh", np.tanh), unary_case("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    unary_case("relu", lambda x: np.maximum(x, 0)), unary_case("silu", lambda x: x / (1 + np.exp(-x))),
    unary_case("rsqrt", lambda x: 1 / np.sqrt(x), positive=True),
    unary_case("gelu", lambda x: H.gelu(x, "none"), approximate="none"),
    unary_case("gelu", lambda x: H.gelu(x, "tanh"), approximate="tanh"),
])
@pytest.mark.parametrize("placement", [R, S(0)], ids=["replicated", "sharded"])
def test_unary(op, oracle, positive, kw, placement, rng):
    x = H.randn(rng, 8, 6)
    if positive:
        x = np.abs(x) + 0.5
    (out,), plan, outs = H.run(lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, 6]), **kw)),
                               [x], [[placement]])
    H.assert_close(out, oracle(x.astype(np.float64)))
    assert H.kinds(plan) == [] and outs[0].placements == (placement,)


@pytest.mark.parametrize("op,oracle", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                       ("div", np.divide)])
def test_binary_with_tensors_and_python_scalars(op, oracle, rng):
    a, b = H.randn(rng, 8, 6), np.abs(H.randn(rng, 8, 6)) + 0.5

    def define(fd):
        x, y = fd.define_tensor([-1, 6]), fd.define_tensor([-1, 6])
        f = getattr(fd.ops, op)
        fd.add_output(f(x, y))
        fd.add_output(f(x, 2.0))
        fd.add_output(f(3, y))

    outs, plan, _ = H.run(define, [a, b], [[S(0)], [S(0)]])
    for got, want in zip(outs, [oracle(a, b), oracle(a, 2.0), oracle(3.0, b)]):
        H.assert_close(got, want)
    assert H.kinds(plan) == []


def test_broadcasting_a_row_vector(rng):
    a, b = H.randn(rng, 8, 6), H.randn(rng, 1, 6)
    (out,), _, _ = H.run(lambda fd: fd.add_output(fd.define_tensor([-1, 6]) * fd.define_tensor([1, 6])), [a, b])
    H.assert_close(out, a * b)


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("dims,keepdim", [([1], False), ([0], True), ([0, 1], False), ([-1], True)])
def test_reductions(op, dims, keepdim, rng):
    x = H.randn(rng, 8, 6)
    (out,), _, _ = H.run(lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([8, 6]), dims, keepdim)), [x])
    H.assert_close(out, getattr(np, op)(x.astype(np.float64), axis=tuple(dims), keepdims=keepdim))


def test_sum_over_a_sharded_dim_is_an_allreduce(rng):
    x = H.randn(rng, 8, 6)
    (out,), plan, outs = H.run(lambda fd: fd.add_output(fd.ops.sum(fd.define_tensor([8, 6]), [0])), [x], [[S(0)]])
    H.assert_close(out, x.sum(0))
    assert H.kinds(plan) == H.expect(["allreduce"])
    assert outs[0].placements == (R,)


def test_linear_matmul_and_bias(rng):
    x, w, b, m = H.randn(rng, 8, 16), H.randn(rng, 12, 16), H.randn(rng, 12), H.randn(rng, 16, 4)

    def define(fd):
        xt, wt, bt, mt = (fd.define_tensor(s) for s in ([-1, 16], [12, 16], [12], [16, 4]))
        fd.add_output(fd.ops.linear(xt, wt))
        fd.add_output(fd.ops.linear(xt, wt, bias=bt))
        fd.add_output(fd.ops.matmul(xt, mt))

    outs, _, _ = H.run(define, [x, w, b, m])
    for got, want in zip(outs, [x @ w.T, x @ w.T + b, x @ m]):
        H.assert_close(got, want.astype(np.float64))


def test_batched_matmul(rng):
    a, b = H.randn(rng, 4, 8, 16), H.randn(rng, 4, 16, 8)
    (out,), plan, _ = H.run(lambda fd: fd.add_output(fd.ops.matmul(fd.define_tensor([4, 8, 16]),
                                                                   fd.define_tensor([4, 16, 8]))), [a, b],
                            [[S(0)], [S(0)]])
    H.assert_close(out, a.astype(np.float64) @ b)
    assert H.kinds(plan) == []


def test_reshape_permute_broadcast_in_dim_and_cast(rng):
    x, v = H.randn(rng, 8, 6), H.randn(rng, 6)

    def define(fd):
        t = fd.define_tensor([8, 6])
        fd.add_output(fd.ops.reshape(t, [4, 2, 6]))
        fd.add_output(fd.ops.permute(t, [1, 0]))
        fd.add_output(fd.ops.broadcast_in_dim(fd.define_tensor([6]), [3, 6], [1]))
        fd.add_output(fd.ops.cast(fd.ops.cast(t, DataType.BFloat16), DataType.Float))
        fd.add_output(fd.ops.set(t))

    outs, _, _ = H.run(define, [x, v])
    H.assert_close(outs[0], x.reshape(4, 2, 6))
    H.assert_close(outs[1], x.T)
    H.assert_close(outs[2], np.broadcast_to(v, (3, 6)))
    H.assert_close(outs[3], x, rtol=1e-2, atol=1e-2)  # one bf16 rounding
    H.assert_close(outs[4], x)


def test_softmax_layer_norm_rms_norm(rng):
    x, w, b = H.randn(rng, 8, 16), H.randn(rng, 16), H.randn(rng, 16)

    def define(fd):
        t, wt, bt = fd.define_tensor([-1, 16]), fd.define_tensor([16]), fd.define_tensor([16])
        fd.add_output(fd.ops.softmax(t, 1))
        fd.add_output(fd.ops.softmax(t, dim=0))
        fd.add_output(fd.ops.layer_norm(t, wt, bt, eps=1e-5))
        fd.add_output(fd.ops.layer_norm(t))
        fd.add_output(fd.ops.rms_norm(t, wt))
        fd.add_output(fd.ops.rms_norm(t, eps=1e-3))

    outs, _, _ = H.run(define, [x, w, b])
    want = [H.softmax(x, 1), H.softmax(x, 0), H.layer_norm(x, w, b), H.layer_norm(x), H.rms_norm(x, w),
            H.rms_norm(x, eps=1e-3)]
    for got, w_ in zip(outs, want):
        H.assert_close(got, w_)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("placement", [R, S(1)], ids=["replicated", "heads_sharded"])
def test_sdpa_like_torch(is_causal, placement, rng):
    q, k, v = (H.randn(rng, 2, 4, 8, 16) for _ in range(3))
    shape = [2, 4, 8, 16]
    (out,), plan, _ = H.run(
        lambda fd: fd.add_output(fd.ops.sdpa(*(fd.define_tensor(shape) for _ in range(3)), is_causal=is_causal)),
        [q, k, v], [[placement]] * 3)
    H.assert_close(out, H.sdpa(q, k, v, is_causal))
    assert H.kinds(plan) == []


@pytest.mark.parametrize("dtype,np_dtype,tol", [(DataType.Float, np.float32, 1e-4), (DataType.Half, np.float16, 2e-2)])
def test_dtypes_round_trip_through_numpy(dtype, np_dtype, tol, rng):
    x = H.randn(rng, 8, 6).astype(np_dtype)
    (out,), _, outs = H.run(lambda fd: fd.add_output(fd.ops.tanh(fd.define_tensor([-1, 6], dtype=dtype))), [x],
                            [[S(0)]])
    assert outs[0].dtype == dtype and out.dtype == np_dtype
    H.assert_close(out, np.tanh(x.astype(np.float64)), rtol=tol, atol=tol)


def define_bfloat16_cast(fd):
    fd.add_output(fd.ops.cast(fd.define_tensor([-1, 6], name="x"), DataType.BFloat16))


def test_a_bfloat16_output_of_numpy_inputs_is_a_torch_tensor(rng):
    """numpy has no bfloat16: such an output is a torch tensor, as nvFuser returns."""
    torch = pytest.importorskip("torch")
    x = H.randn(rng, 8, 6)
    (out,), _, (y,) = H.run(define_bfloat16_cast, [x], [[S(0)]])
    local = y.to_local()
    assert isinstance(local, torch.Tensor) and local.dtype == torch.bfloat16
    assert y.dtype == DataType.BFloat16 and y.placements == (S(0),)
    block = np.split(x, meshfuse.world_size())[meshfuse.rank()]
    H.assert_close(local.float().numpy(), block, rtol=1e-2, atol=1e-2)  # one bf16 rounding
    assert out.dtype == np.float32  # full_tensor() is numpy: bfloat16 widened to float32
    H.assert_close(out, x, rtol=1e-2, atol=1e-2)


def test_a_bfloat16_output_without_torch_is_a_dtype_error_when_compiled(rng, world_mesh, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as if it were not installed
    fdw = meshfuse.FusionDefinitionWrapper(define_bfloat16_cast)
    x = meshfuse.distribute_tensor(H.randn(rng, 8, 6), world_mesh, [R])
    with pytest.raises(meshfuse.DtypeError, match=r"^output 0 \(%0\) is bfloat16, which numpy cannot represent, and "
                                                  r"torch .* is not installed: cast it to DataType.Float"):
        fdw.plan([x])


def test_python_operators_build_ops(rng):
    """`2 ** x`, `abs(x)` and comparisons (`==` too) build ops, as in torch and nvFuser."""
    a, b = H.randn(rng, 8, 6), H.randn(rng, 8, 6)
    b[::2] = a[::2]  # some equal elements for == and !=

    def define(fd):
        x, y = fd.define_tensor([-1, 6]), fd.define_tensor([-1, 6])
        fd.add_output(2 ** x)
        fd.add_output(abs(x))
        for cmp in (x > 0, 0.5 < x, x <= y, x >= y, x < y, x == y, x != y, x == 0.0):
            fd.add_output(cmp)
        fd.add_output(fd.ops.where(x == y, 1.0, fd.ops.maximum(x, y)))

    outs, plan, tensors = H.run(define, [a, b], [[S(0)], [S(0)]])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    H.assert_close(outs[0], 2.0 ** a64)
    H.assert_close(outs[1], np.abs(a64))
    for got, want in zip(outs[2:10], [a > 0, 0.5 < a, a <= b, a >= b, a < b, a == b, a != b, a == 0.0]):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, want)
    H.assert_close(outs[10], np.where(a == b, 1.0, np.maximum(a64, b64)))
    assert tensors[2].dtype == DataType.Bool and H.kinds(plan) == []


@pytest.mark.parametrize("scale", [None, 0.25])
def test_sdpa_scale_like_torch(scale, rng):
    q, k, v = (H.randn(rng, 1, 2, 8, 16) for _ in range(3))
    (out,), _, _ = H.run(lambda fd: fd.add_output(fd.ops.sdpa(*(fd.define_tensor([1, 2, 8, 16]) for _ in range(3)),
                                                              scale=scale)), [q, k, v])
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * (0.25 if scale is not None else 1 / np.sqrt(16))
    H.assert_close(out, H.softmax(s, -1) @ v)
