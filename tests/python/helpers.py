"""numpy oracles (the independent reference the tests compare meshfuse with) and test helpers."""

import math

import numpy as np

import meshfuse

_erf = np.vectorize(math.erf)


def gelu(x, approximate="none"):
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def softmax(x, dim):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def layer_norm(x, w=None, b=None, eps=1e-5):
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def rms_norm(x, w=None, eps=1e-6):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * (1 if w is None else w)


def sdpa(q, k, v, is_causal=False):
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        n, m = s.shape[-2:]
        s = np.where(np.tril(np.ones((n, m), dtype=bool)), s, -np.inf)
    return softmax(s, -1) @ v


def mlp(x, up_w, down_w, approximate="tanh"):
    return gelu(x.astype(np.float64) @ up_w.T, approximate) @ down_w.T


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def assert_close(actual, expected, rtol=1e-4, atol=1e-4):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol, atol=atol)


def kinds(plan, rank=None):
    return [c.kind for c in plan.collectives(rank)]


def expect(kinds_on_many_ranks):
    """On a world of one rank every mesh axis has size 1 and no collective is needed."""
    return kinds_on_many_ranks if meshfuse.world_size() > 1 else []


def define_mlp(h, approximate="tanh"):
    """The seed's MLP block: linear, gelu, linear."""

    def define(fd):
        inp = fd.define_tensor([-1, h])
        up_w = fd.define_tensor([4 * h, h])
        down_w = fd.define_tensor([h, 4 * h])
        out = fd.ops.gelu(fd.ops.linear(inp, up_w), approximate=approximate)
        fd.add_output(fd.ops.linear(out, down_w))

    return define


def world_mesh():
    return meshfuse.DeviceMesh(list(range(meshfuse.world_size())))


def run(define, arrays, placements=None, mesh=None):
    """Runs `define` on `arrays` distributed with `placements` (default: all replicated) over
    `mesh` (default: the world). Returns (full outputs as numpy, plan, output DTensors)."""
    mesh = mesh or world_mesh()
    placements = placements or [[meshfuse.Replicate()] * mesh.ndim] * len(arrays)
    fdw = meshfuse.FusionDefinitionWrapper(define)
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]
    plan = fdw.plan(inputs)
    outs = fdw(inputs)
    return [o.full_tensor() for o in outs], plan, outs
