"""The training ops (fd.ops.embedding, log_softmax, cross_entropy, one_hot, embedding_backward)
against torch: forward values and torch.autograd gradients (f64 oracle), ignore_index included,
on one device and sharded over the world (pytest_np1/np2/np4 run this file on 1, 2 and 4 ranks):
vocab-parallel and hidden-parallel embedding tables, batch-sharded and vocab-sharded logits."""

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import DataType, Replicate, Shard

import helpers as H

R = Replicate()
F = torch.nn.functional
I64 = DataType.Int64


def _run(define, arrays, placements=None, wrt=None):
    """Outputs (full, numpy) of `define` on the world mesh; with `wrt`, value_and_grad's
    gradients too (seed 1 for the one scalar output), each checked to be laid out like its input."""
    mesh = H.world_mesh()
    placements = placements or [[R]] * len(arrays)
    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]
    if wrt is None:
        return [np.asarray(o.full_tensor(), dtype=np.float64) for o in fdw(inputs)], None, fdw, inputs
    outs, grads = fdw.value_and_grad(inputs, wrt)
    for g, i in zip(grads, wrt):
        assert g.placements == inputs[i].placements and tuple(g.shape) == tuple(inputs[i].shape)
    return ([np.asarray(o.full_tensor(), dtype=np.float64) for o in outs],
            [np.asarray(g.full_tensor(), dtype=np.float64) for g in grads], fdw, inputs)


def _torch(fn, arrays, wrt):
    """fn's output and, for a scalar output, the gradients of the `wrt` inputs (f64)."""
    ts = [torch.tensor(a) if a.dtype == np.int64 else torch.tensor(a, dtype=torch.float64, requires_grad=i in wrt)
          for i, a in enumerate(arrays)]
    out = fn(*ts)
    if not wrt:
        return out.detach().numpy(), []
    out.backward()
    return out.detach().numpy(), [ts[i].grad.numpy() for i in wrt]


def _indices(rng, hi, *shape, lo=0):
    return np.asarray(rng.integers(lo, hi, size=shape), dtype=np.int64)


# ---- forward against torch ---------------------------------------------------------------------

def test_embedding_matches_torch(rng):
    w, i = H.randn(rng, 10, 6), _indices(rng, 10, 3, 4)

    def define(fd):
        fd.add_output(fd.ops.embedding(fd.define_tensor([10, 6]), fd.define_tensor([3, 4], I64)))

    (y,), _, _, _ = _run(define, [w, i])
    H.assert_close(y, F.embedding(torch.tensor(i), torch.tensor(w)).numpy(), rtol=0, atol=0)


def test_embedding_rows_outside_the_table_are_zero(rng):
    w = H.randn(rng, 5, 3)
    i = np.array([-1, 0, 4, 5, 100], dtype=np.int64)

    def define(fd):
        fd.add_output(fd.ops.embedding(fd.define_tensor([5, 3]), fd.define_tensor([5], I64)))

    (y,), _, _, _ = _run(define, [w, i])
    want = np.zeros((5, 3))
    want[1], want[2] = w[0], w[4]
    H.assert_close(y, want, rtol=0, atol=0)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_log_softmax_matches_torch(dim, rng):
    x = H.randn(rng, 4, 7) * 5

    def define(fd):
        fd.add_output(fd.ops.log_softmax(fd.define_tensor([4, 7]), dim))

    (y,), _, _, _ = _run(define, [x])
    H.assert_close(y, F.log_softmax(torch.tensor(x, dtype=torch.float64), dim).numpy(), rtol=1e-5, atol=1e-5)


def test_one_hot_matches_torch(rng):
    i = _indices(rng, 6, 3, 4)

    def define(fd):
        fd.add_output(fd.ops.one_hot(fd.define_tensor([3, 4], I64), 6))

    (y,), _, _, _ = _run(define, [i])
    H.assert_close(y, F.one_hot(torch.tensor(i), 6).numpy(), rtol=0, atol=0)


CE_CASES = [
    # (id, logits shape, target shape, ignore_index, reduction, targets ignored)
    ("mean", (6, 5), (6,), -100, "mean", False),
    ("sum", (6, 5), (6,), -100, "sum", False),
    ("none", (6, 5), (6,), -100, "none", False),
    ("mean_ignore_default", (8, 5), (8,), -100, "mean", True),
    ("sum_ignore_custom", (8, 5), (8,), 2, "sum", True),
    ("spatial_mean_ignore", (2, 5, 3), (2, 3), 1, "mean", True),
    ("spatial_none", (2, 5, 3), (2, 3), -100, "none", False),
    ("unbatched", (5,), (), -100, "mean", False),
]


@pytest.mark.parametrize("name,xs,ts,ignore,reduction,ignored", CE_CASES, ids=[c[0] for c in CE_CASES])
def test_cross_entropy_and_its_gradient_match_torch(name, xs, ts, ignore, reduction, ignored, rng):
    x = H.randn(rng, *xs) * 3
    t = _indices(rng, xs[1] if len(xs) > 1 else xs[0], *ts)
    if ignored:
        t.reshape(-1)[::3] = ignore  # every third target ignored

    def define(fd):
        loss = fd.ops.cross_entropy(fd.define_tensor(list(xs)), fd.define_tensor(list(ts), I64),
                                    ignore_index=ignore, reduction=reduction)
        fd.add_output(loss if reduction != "none" else fd.ops.sum(fd.ops.mul(loss, loss), list(range(len(ts)))))

    def oracle(xt, tt):
        loss = F.cross_entropy(xt, tt, ignore_index=ignore, reduction=reduction)
        return loss if reduction != "none" else (loss * loss).sum()

    (loss,), (gx,), _, _ = _run(define, [x, t], wrt=[0])
    want, (want_gx,) = _torch(oracle, [x, t], [0])
    H.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    H.assert_close(gx, want_gx, rtol=1e-4, atol=1e-5)


def test_cross_entropy_of_bf16_logits_is_f32(rng):
    x = torch.tensor(H.randn(rng, 6, 9) * 3).to(torch.bfloat16)
    t = _indices(rng, 9, 6)

    def define(fd):
        fd.add_output(fd.ops.cross_entropy(fd.define_tensor([6, 9], DataType.BFloat16), fd.define_tensor([6], I64)))

    mesh = H.world_mesh()
    fdw = meshfuse.FusionDefinitionWrapper(define)
    (loss,) = fdw([meshfuse.distribute_tensor(x, mesh, [R]), meshfuse.distribute_tensor(t, mesh, [R])])
    assert loss.dtype == DataType.Float
    want = F.cross_entropy(x.float(), torch.tensor(t)).item()
    H.assert_close(np.asarray(loss.full_tensor(), np.float64), want, rtol=1e-5, atol=1e-6)


# ---- gradients against torch.autograd ----------------------------------------------------------

def test_embedding_gradient_is_a_scatter_add(rng):
    """Repeated rows accumulate; rows no index names get zero."""
    w, i = H.randn(rng, 7, 4), np.array([[0, 3, 3], [6, 0, 3]], dtype=np.int64)
    c = H.randn(rng, 2, 3, 4)

    def define(fd):
        y = fd.ops.embedding(fd.define_tensor([7, 4]), fd.define_tensor([2, 3], I64))
        fd.add_output(fd.ops.sum(fd.ops.mul(y, fd.define_tensor([2, 3, 4])), [0, 1, 2]))

    (_,), (gw, gc), _, _ = _run(define, [w, i, c], wrt=[0, 2])
    _, (want_gw, want_gc) = _torch(lambda w, i, c: (F.embedding(i, w) * c).sum(), [w, i, c], [0, 2])
    H.assert_close(gw, want_gw)
    H.assert_close(gc, want_gc)


def test_log_softmax_gradient_matches_torch(rng):
    x, c = H.randn(rng, 3, 6), H.randn(rng, 3, 6)

    def define(fd):
        y = fd.ops.log_softmax(fd.define_tensor([3, 6]), 1)
        fd.add_output(fd.ops.sum(fd.ops.mul(y, fd.define_tensor([3, 6])), [0, 1]))

    (_,), (gx,), _, _ = _run(define, [x, c], wrt=[0])
    _, (want,) = _torch(lambda x, c: (F.log_softmax(x, 1) * c).sum(), [x, c], [0])
    H.assert_close(gx, want)


def _tiny_lm(fd, v=8, h=4, tokens=(2, 3)):
    """embedding -> layer_norm -> LM head -> cross_entropy (targets: the tokens shifted)."""
    w = fd.define_tensor([v, h], name="wte")
    head = fd.define_tensor([v, h], name="head")
    tok = fd.define_tensor(list(tokens), I64, name="tok")
    tgt = fd.define_tensor(list(tokens), I64, name="tgt")
    n = tokens[0] * tokens[1]
    logits = fd.ops.reshape(fd.ops.linear(fd.ops.layer_norm(fd.ops.embedding(w, tok)), head), [n, v])
    fd.add_output(fd.ops.cross_entropy(logits, fd.ops.reshape(tgt, [n])))


def _tiny_lm_torch(w, head, tok, tgt):
    v, h = w.shape
    logits = F.linear(F.layer_norm(F.embedding(tok, w), (h,)), head)
    return F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1))


def test_tiny_lm_gradients_match_torch(rng):
    w, head = H.randn(rng, 8, 4), H.randn(rng, 8, 4)
    tok, tgt = _indices(rng, 8, 2, 3), _indices(rng, 8, 2, 3)
    tgt[0, 1] = -100
    (loss,), grads, _, _ = _run(_tiny_lm, [w, head, tok, tgt], wrt=[0, 1])
    want, want_grads = _torch(_tiny_lm_torch, [w, head, tok, tgt], [0, 1])
    H.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    for got, exp in zip(grads, want_grads):
        H.assert_close(got, exp, rtol=1e-4, atol=1e-5)


# ---- sharded over the world ----------------------------------------------------------------------

def test_vocab_parallel_embedding(rng):
    """The table Shard(0) (Megatron's vocab-parallel embedding): each rank looks up its rows, rows
    outside them give zeros, one allreduce sums the blocks. The table's gradient keeps Shard(0)."""
    n = meshfuse.world_size()
    v = 4 * n
    w, tok, c = H.randn(rng, v, 6), _indices(rng, v, 3, 5), H.randn(rng, 3, 5, 6)

    def define(fd):
        y = fd.ops.embedding(fd.define_tensor([v, 6]), fd.define_tensor([3, 5], I64))
        fd.add_output(fd.ops.sum(fd.ops.mul(y, fd.define_tensor([3, 5, 6])), [0, 1, 2]))

    placements = [[Shard(0)], [R], [R]]
    (loss,), (gw,), fdw, inputs = _run(define, [w, tok, c], placements, wrt=[0])
    want, (want_gw,) = _torch(lambda w, i, c: (F.embedding(i, w) * c).sum(), [w, tok, c], [0])
    H.assert_close(loss, want)
    H.assert_close(gw, want_gw)

    def lookup(fd):
        fd.add_output(fd.ops.embedding(fd.define_tensor([v, 6]), fd.define_tensor([3, 5], I64)))

    (y,), _, fdw, inputs = _run(lookup, [w, tok], placements[:2])
    H.assert_close(y, F.embedding(torch.tensor(tok), torch.tensor(w)).numpy(), rtol=0, atol=0)
    assert H.kinds(fdw.plan(inputs)) == H.expect(["allreduce"])


def test_hidden_parallel_embedding_and_batch_sharded_indices(rng):
    n = meshfuse.world_size()
    w, tok, c = H.randn(rng, 5, 2 * n), _indices(rng, 5, 2 * n, 3), H.randn(rng, 2 * n, 3, 2 * n)

    def define(fd):
        y = fd.ops.embedding(fd.define_tensor([5, 2 * n]), fd.define_tensor([2 * n, 3], I64))
        fd.add_output(fd.ops.sum(fd.ops.mul(y, fd.define_tensor([2 * n, 3, 2 * n])), [0, 1, 2]))

    want, (want_gw,) = _torch(lambda w, i, c: (F.embedding(i, w) * c).sum(), [w, tok, c], [0])
    for placements in ([[Shard(1)], [R], [R]], [[R], [Shard(0)], [Shard(0)]]):
        (loss,), (gw,), _, _ = _run(define, [w, tok, c], placements, wrt=[0])
        H.assert_close(loss, want)
        H.assert_close(gw, want_gw)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_data_parallel_cross_entropy(reduction, rng):
    """Logits and targets Shard(0), shards ignoring different numbers of targets: the loss is the
    global batch's (a sum over the global count), the logits' gradient stays Shard(0)."""
    n = meshfuse.world_size()
    x, t = H.randn(rng, 4 * n, 5) * 3, _indices(rng, 5, 4 * n)
    t[: 3] = -100  # on rank 0 only, when sharded

    def define(fd):
        fd.add_output(fd.ops.cross_entropy(fd.define_tensor([4 * n, 5]), fd.define_tensor([4 * n], I64),
                                           reduction=reduction))

    (loss,), (gx,), fdw, inputs = _run(define, [x, t], [[Shard(0)], [Shard(0)]], wrt=[0])
    want, (want_gx,) = _torch(lambda x, t: F.cross_entropy(x, t, reduction=reduction), [x, t], [0])
    H.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    H.assert_close(gx, want_gx, rtol=1e-4, atol=1e-5)
    kinds = H.kinds(fdw.plan(inputs))
    assert kinds == H.expect(["allreduce"] * (2 if reduction == "mean" else 1)), kinds


def test_vocab_sharded_logits_are_gathered(rng):
    n = meshfuse.world_size()
    x, t = H.randn(rng, 3, 4 * n), _indices(rng, 4 * n, 3)

    def define(fd):
        fd.add_output(fd.ops.cross_entropy(fd.define_tensor([3, 4 * n]), fd.define_tensor([3], I64)))

    (loss,), (gx,), _, _ = _run(define, [x, t], [[Shard(1)], [R]], wrt=[0])
    want, (want_gx,) = _torch(lambda x, t: F.cross_entropy(x, t), [x, t], [0])
    H.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    H.assert_close(gx, want_gx, rtol=1e-4, atol=1e-5)


def test_tiny_lm_data_and_vocab_parallel(rng):
    """The tiny LM with its batch sharded, then with its tables vocab-parallel."""
    n = meshfuse.world_size()
    v = 4 * n
    w, head = H.randn(rng, v, 4), H.randn(rng, v, 4)
    tok, tgt = _indices(rng, v, 2 * n, 3), _indices(rng, v, 2 * n, 3)
    tgt[0, :2] = -100
    want, want_grads = _torch(_tiny_lm_torch, [w, head, tok, tgt], [0, 1])

    def define(fd):
        _tiny_lm(fd, v=v, tokens=(2 * n, 3))

    for placements in ([[R], [R], [Shard(0)], [Shard(0)]], [[Shard(0)], [Shard(0)], [R], [R]]):
        (loss,), grads, _, _ = _run(define, [w, head, tok, tgt], placements, wrt=[0, 1])
        H.assert_close(loss, want, rtol=1e-5, atol=1e-5)
        for got, exp in zip(grads, want_grads):
            H.assert_close(got, exp, rtol=1e-4, atol=1e-5)


# ---- the Python surface ------------------------------------------------------------------------

def test_signatures_and_errors():
    with meshfuse.FusionDefinition() as fd:
        x = fd.define_tensor([4, 5])
        t = fd.define_tensor([4], I64)
        loss = fd.ops.cross_entropy(x, t)
        fd.add_output(loss)
    assert "cross_entropy(%0, %1)" in str(fd)
    assert "ignore_index=-100" in str(fd.ops.cross_entropy.__signature__)
    with meshfuse.FusionDefinition() as fd:
        x = fd.define_tensor([4, 5])
        t = fd.define_tensor([4], I64)
        with pytest.raises(meshfuse.ValueError, match=r'cross_entropy: reduction must be "mean", "sum" or "none" '
                                                      r'but is "avg"'):
            fd.ops.cross_entropy(x, t, reduction="avg")
        with pytest.raises(meshfuse.DtypeError, match=r"embedding: indices %0 must be i64 but is f32"):
            fd.ops.embedding(fd.define_tensor([3, 5]), x)
        with pytest.raises(meshfuse.ShapeError, match=r"cross_entropy: batch dim 0 \(logits without the class dim\) "
                                                      r"mismatch: %0 has 4 but %\d+ has 3"):
            fd.ops.cross_entropy(x, fd.define_tensor([3], I64))
        fd.add_output(fd.ops.log_softmax(x, dim=1))
