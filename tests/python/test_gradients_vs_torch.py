"""Every differentiable op's gradient against torch.autograd, in one place: the cases of
test_autodiff.py plus the ops they leave out (sub, cast, set, sdpa_lse, log_softmax, embedding,
embedding_backward, cross_entropy); a coverage check that every op with a gradient rule
(_C.gradient_rules(), the op table's list) is exercised here; every case again in bf16 within bf16
tolerance; non-contiguous (permuted) inputs, through value_and_grad and torch_interop.autograd; and
the typed errors of bad inputs, by their text. Finite differences in f64 are the C++ side's
(tests/unit/autodiff_test.cpp, one case per op, checked the same way for coverage)."""

import re

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import DataType, Replicate

import helpers as H
import test_autodiff
import test_training

F = torch.nn.functional
R = Replicate()
I64 = DataType.Int64


def _lse(q, k, causal):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


def _scatter_add(g, i, v):
    return torch.zeros(v, g.shape[-1], dtype=g.dtype).index_add(0, i.reshape(-1), g.reshape(-1, g.shape[-1]))


# Inputs: a shape (a float input, standard normal) or ("i64", shape, high) (indices in [0, high)).
# (id, inputs, definition body (fd, *inputs) -> output, torch function)
EXTRA_CASES = [
    ("sub_broadcast", [(3, 4), (1, 4)], lambda fd, x, y: fd.ops.sub(y, x), lambda x, y: y - x),
    ("cast_set", [(3, 4)], lambda fd, x: fd.ops.set(fd.ops.cast(fd.ops.mul(fd.ops.cast(x, DataType.Half), 3.0),
                                                                    DataType.Float)),
     lambda x: x * 3.0),
    ("sdpa_lse", [(1, 2, 3, 4), (1, 2, 5, 4)], lambda fd, q, k: fd.ops.sdpa_lse(q, k), lambda q, k: _lse(q, k, False)),
    ("sdpa_lse_causal", [(2, 1, 4, 4), (2, 1, 4, 4)], lambda fd, q, k: fd.ops.sdpa_lse(q, k, is_causal=True),
     lambda q, k: _lse(q, k, True)),
    ("log_softmax", [(3, 5)], lambda fd, x: fd.ops.log_softmax(x, 0), lambda x: F.log_softmax(x, 0)),
    ("embedding", [(6, 4), ("i64", (2, 3), 6)], lambda fd, w, i: fd.ops.embedding(w, i),
     lambda w, i: F.embedding(i, w)),
    ("embedding_backward", [(2, 3, 4), ("i64", (2, 3), 5)], lambda fd, g, i: fd.ops.embedding_backward(g, i, 5),
     lambda g, i: _scatter_add(g, i, 5)),
    ("cross_entropy_ignored", [(6, 5), ("i64", (6,), 5)],
     lambda fd, x, t: fd.ops.cross_entropy(x, t, ignore_index=2), lambda x, t: F.cross_entropy(x, t, ignore_index=2)),
    ("cross_entropy_sum_spatial", [(2, 5, 3), ("i64", (2, 3), 5)],
     lambda fd, x, t: fd.ops.cross_entropy(x, t, reduction="sum"), lambda x, t: F.cross_entropy(x, t, reduction="sum")),
]
# test_autodiff's cases in the same form (their last field: inputs made positive).
ALL_CASES = [(name, [(s if not positive else ("pos", s)) for s in shapes], body, oracle)
             for name, shapes, body, oracle, positive in test_autodiff.CASES] + EXTRA_CASES


def _arrays(rng, specs):
    out = []
    for s in specs:
        if s and s[0] == "i64":
            out.append(rng.integers(0, s[2], size=s[1]).astype(np.int64))
        elif s and s[0] == "pos":
            out.append(np.abs(H.randn(rng, *s[1])) + 0.5)
        else:
            out.append(H.randn(rng, *s))
    return out


def _is_float(a):
    return a.dtype != np.int64


def _define(specs, body, dtype=DataType.Float):
    def define(fd):
        ins = [fd.define_tensor(list(a.shape), dtype if _is_float(a) else I64) for a in specs]
        fd.add_output(body(fd, *ins))
    return define


def _torch_oracle(oracle, arrays, grad_output):
    ts = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) if _is_float(a) else torch.tensor(a)
          for a in arrays]
    out = oracle(*ts)
    out.backward(torch.as_tensor(np.asarray(grad_output, np.float64)))
    return out.detach().numpy(), [t.grad.numpy() for t in ts if t.is_floating_point()]


def _run(arrays, body, oracle, dtype, rng):
    """(output, gradients of the float inputs) of value_and_grad on the world mesh, then torch's
    (f64, on the inputs and seed as meshfuse sees them: rounded to `dtype`)."""
    tdtype = {DataType.Float: torch.float32, DataType.BFloat16: torch.bfloat16}
    locals_ = [torch.tensor(a).to(tdtype[dtype]) if _is_float(a) else torch.tensor(a) for a in arrays]
    seen = [t.double().numpy() if t.is_floating_point() else t.numpy() for t in locals_]
    fdw = meshfuse.FusionDefinitionWrapper(_define(arrays, body, dtype))
    out_shape = tuple(oracle(*[torch.tensor(a) for a in seen]).shape)
    g = torch.tensor(H.randn(rng, *out_shape)).to(tdtype[fdw.definition.outputs[0].dtype])  # cross_entropy: f32
    want_out, want = _torch_oracle(oracle, seen, g.double().numpy())
    mesh = H.world_mesh()
    inputs = [meshfuse.distribute_tensor(t, mesh, [R]) for t in locals_]
    wrt = [i for i, a in enumerate(arrays) if _is_float(a)]
    (out,), grads = fdw.value_and_grad(inputs, wrt, [meshfuse.distribute_tensor(g, mesh, [R])])
    full = [torch.as_tensor(d.full_tensor()).double().numpy() for d in [out] + grads]
    return full[0], full[1:], want_out, want


# A case whose f32 result is rounded on purpose: cast_set goes through f16 (2^-11 relative).
F32_TOLERANCE = {"cast_set": 2e-3}


@pytest.mark.parametrize("name,specs,body,oracle", EXTRA_CASES, ids=[c[0] for c in EXTRA_CASES])
def test_gradient_matches_torch_autograd(name, specs, body, oracle, rng):
    """f32 (the cases test_autodiff.py does not have)."""
    out, grads, want_out, want = _run(_arrays(rng, specs), body, oracle, DataType.Float, rng)
    tol = F32_TOLERANCE.get(name, 1e-4)
    H.assert_close(out, want_out, rtol=tol, atol=tol)
    for got, exp in zip(grads, want):
        H.assert_close(got, exp, rtol=tol, atol=tol)


def test_every_differentiable_op_is_compared_with_torch():
    """The op table's gradient rules against the ops these cases build: adding an op (with its
    rule, which the build requires) without a torch comparison here fails."""
    used = set()
    for name, specs, body, _ in ALL_CASES:
        fd = meshfuse.FusionDefinition()
        with fd:
            _define(_arrays(np.random.default_rng(0), specs), body)(fd)
        used |= set(re.findall(r"= (\w+)\(", str(fd)))
    rules = meshfuse._C.gradient_rules()
    assert [r["op"] for r in rules] == [s["name"] for s in meshfuse._C.op_schemas()]
    # An op whose rule refuses (attention's gradient, differentiated again) has its own test below.
    refused = [r["op"] for r in rules if r["formula"].startswith("not differentiable")]
    missing = [r["op"] for r in rules if r["rule"] != "none" and r["op"] not in used | set(refused)]
    assert not missing, f"no torch.autograd comparison exercises {missing}"


def test_a_second_derivative_of_attention_is_refused_by_name():
    """sdpa_grad (attention's gradient as an op) is not differentiable again: an UnsupportedError
    naming the op, not a wrong gradient."""
    refused = [r["op"] for r in meshfuse._C.gradient_rules() if r["formula"].startswith("not differentiable")]
    assert refused == ["sdpa_grad"]

    def define(fd):
        q, k, v, g = (fd.define_tensor([1, 2, 4, 8], name=n) for n in "qkvg")
        fd.add_output(fd.ops.sum(fd.ops.sdpa_grad(q, k, v, g, wrt="query"), [0, 1, 2, 3]))

    mesh = meshfuse.DeviceMesh(list(range(meshfuse.world_size())))
    arrays = [np.ones((1, 2, 4, 8), np.float32)] * 4
    inputs = [meshfuse.distribute_tensor(a, mesh, [Replicate()]) for a in arrays]
    with pytest.raises(meshfuse.UnsupportedError, match=r"sdpa_grad \(the gradient of attention\) cannot be "
                                                        r"differentiated again"):
        meshfuse.FusionDefinitionWrapper(define).value_and_grad(inputs, [0])


@pytest.mark.world(1)  # dtype coverage: every rank would run the same one-device programs
@pytest.mark.parametrize("name,specs,body,oracle", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_bf16_gradient_within_bf16_tolerance(name, specs, body, oracle, rng):
    """bf16 inputs, seeds and gradients; the oracle is f64 torch on the same rounded values, so the
    difference is meshfuse's bf16 rounding of intermediates and results: a few bf16 ulps (2^-8
    relative) of the gradient's scale."""
    out, grads, want_out, want = _run(_arrays(rng, specs), body, oracle, DataType.BFloat16, rng)
    tol = 3e-2
    np.testing.assert_allclose(out, want_out, rtol=tol, atol=tol * max(1.0, np.abs(want_out).max()))
    for got, exp in zip(grads, want):
        np.testing.assert_allclose(got, exp, rtol=tol, atol=tol * max(1e-2, np.abs(exp).max()), err_msg=name)


# ---- non-contiguous inputs ------------------------------------------------------------------------

def _permuted(a: np.ndarray, perm) -> torch.Tensor:
    """`a`'s values in a non-contiguous torch view: a contiguous tensor of the permuted shape,
    permuted back."""
    inverse = np.argsort(perm)
    t = torch.tensor(np.ascontiguousarray(np.transpose(a, perm))).permute(*inverse)
    assert not t.is_contiguous() and np.array_equal(t.numpy(), a)
    return t


@pytest.mark.parametrize("name", ["linear_bias", "matmul_batched", "layer_norm", "sdpa_causal"])
def test_permuted_inputs(name, rng):
    """Inputs that are permuted (non-contiguous) torch views, the local tensors of meshfuse
    DTensors: the same gradients as torch's on the same values."""
    _, shapes, body, oracle, _ = next(c for c in test_autodiff.CASES if c[0] == name)
    arrays = [H.randn(rng, *s) for s in shapes]
    views = [_permuted(a, list(reversed(range(a.ndim)))) if a.ndim > 1 else torch.tensor(a) for a in arrays]
    g = H.randn(rng, *oracle(*[torch.tensor(a) for a in arrays]).shape)
    mesh = H.world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(_define(arrays, body))
    inputs = [meshfuse.distribute_tensor(v, mesh, [R]) for v in views]
    wrt = list(range(len(arrays)))
    (out,), grads = fdw.value_and_grad(inputs, wrt, [meshfuse.distribute_tensor(torch.tensor(g), mesh, [R])])
    want_out, want = _torch_oracle(oracle, arrays, g)
    H.assert_close(torch.as_tensor(out.full_tensor()).numpy(), want_out)
    for got, exp in zip(grads, want):
        H.assert_close(torch.as_tensor(got.full_tensor()).numpy(), exp)


@pytest.mark.world(1)  # plain torch tensors run on one device
def test_torch_interop_with_transposed_parameters():
    """torch_interop.autograd given transposed views of leaf parameters (y = x @ w1_t.T...): the
    gradients reach the leaves through torch's transpose, and torch.optim.AdamW then trains them
    as it trains the pure-torch model."""
    rng = np.random.default_rng(6)
    full = [H.randn(rng, 8, 4), H.randn(rng, 8, 4), 0.3 * H.randn(rng, 4, 16), 0.3 * H.randn(rng, 16, 4)]
    f = meshfuse.torch_interop.autograd(meshfuse.FusionDefinitionWrapper(test_training._define_mlp_loss))

    def our_args(ours):  # w1, w2 stored transposed: the fusion reads non-contiguous views
        args = ours[:2] + [ours[2].t(), ours[3].t()]
        assert not args[2].is_contiguous()
        return args

    def their_loss(x, y, w1t, w2t):
        h = F.gelu(x @ w1t, approximate="tanh")
        return ((h @ w2t - y) ** 2).mean()

    test_training.train_side_by_side(f, full, 3, our_args, their_loss)


# ---- bad inputs, by their text ----------------------------------------------------------------------

def test_bad_inputs_are_typed_errors():
    mesh = H.world_mesh()

    def define(fd):
        x, n = fd.define_tensor([3], name="x"), fd.define_tensor([3], I64, name="n")
        fd.add_output(fd.ops.mul(x, fd.ops.cast(n, DataType.Float)))

    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(np.ones(3, np.float32), mesh, [R]),
              meshfuse.distribute_tensor(np.arange(3, dtype=np.int64), mesh, [R])]
    with pytest.raises(meshfuse.DtypeError, match=r"cannot differentiate with respect to input 1 \(%n\) of dtype i64"):
        fdw.value_and_grad(inputs, [0, 1], [inputs[0]])
    with pytest.raises(meshfuse.ValueError, match=r"without grad_outputs the definition must have one scalar output "
                                                  r"\(its seed is 1\), but output 0 \(%\d+\) has shape \[3\]"):
        fdw.value_and_grad(inputs, [0])
    with pytest.raises(meshfuse.ShapeError, match=r"grad_outputs\[0\] has shape \[\] but output 0 \(%\d+\) has "
                                                  r"shape \[3\]"):
        fdw.value_and_grad(inputs, [0], [meshfuse.distribute_tensor(np.ones((), np.float32), mesh, [R])])
    with pytest.raises(meshfuse.ValueError, match=r"grad_outputs must list one DTensor per output \(1\), got 2"):
        fdw.value_and_grad(inputs, [0], [inputs[0], inputs[0]])
    with pytest.raises(meshfuse.ValueError, match=r"wrt must list distinct input indices, got \[0, 0\]"):
        fdw.value_and_grad(inputs, [0, 0], [inputs[0]])
    # An optimizer given something that is not a parameter: a plain torch tensor, an integer DTensor.
    with pytest.raises(meshfuse.ValueError, match=r"AdamW: params\[1\] is a torch.nn.parameter.Parameter, not a "
                                                  r"parameter: pass meshfuse or torch DTensors"):
        meshfuse.optim.AdamW([inputs[0], torch.nn.Parameter(torch.ones(3))], lr=0.1)
    with pytest.raises(meshfuse.DtypeError, match=r"SGD: params\[0\] is i64: only floating-point tensors can be "
                                                  r"optimized"):
        meshfuse.optim.SGD([inputs[1]], lr=0.1)
