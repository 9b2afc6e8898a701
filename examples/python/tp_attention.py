"""Tensor-parallel causal self-attention: the q/k/v projections sharded by rows (so each rank
owns whole heads), the output projection by columns. meshfuse keeps the heads local through the
reshape/permute/sdpa and allreduces once after the output projection.

    python examples/python/tp_attention.py      # relaunches itself on 2 ranks
"""

from meshfuse.launch import ensure_ranks

ensure_ranks(2)

import math  # noqa: E402

import numpy as np  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor  # noqa: E402

from common import check, report  # noqa: E402

B, S, H, HEADS = 2, 16, 64, 4
E = H // HEADS  # head size


def define_fusion(fd):
    x = fd.define_tensor([B, S, H])
    wq, wk, wv, wo = (fd.define_tensor([H, H]) for _ in range(4))

    def to_heads(t):  # [b, s, h] -> [b, heads, s, e]
        return fd.ops.permute(fd.ops.reshape(t, [B, S, HEADS, E]), [0, 2, 1, 3])

    q, k, v = (to_heads(fd.ops.linear(x, w)) for w in (wq, wk, wv))
    attn = fd.ops.sdpa(q, k, v, is_causal=True)
    merged = fd.ops.reshape(fd.ops.permute(attn, [0, 2, 1, 3]), [B, S, H])
    fd.add_output(fd.ops.linear(merged, wo))


def attention_reference(x, wq, wk, wv, wo):
    heads = lambda t: t.reshape(B, S, HEADS, E).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = (heads(x @ w.T) for w in (wq, wk, wv))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(E) + np.triu(np.full((S, S), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, S, H) @ wo.T


rng = np.random.default_rng(0)
x = rng.standard_normal((B, S, H)).astype(np.float32)
weights = [(rng.standard_normal((H, H)) / math.sqrt(H)).astype(np.float32) for _ in range(4)]

mesh = DeviceMesh(range(meshfuse.world_size()))
placements = [[Replicate()], [Shard(0)], [Shard(0)], [Shard(0)], [Shard(1)]]
inputs = [distribute_tensor(a, mesh, p) for a, p in zip([x, *weights], placements)]
fdw = FusionDefinitionWrapper(define_fusion)
report(fdw.plan(inputs))
(out,) = fdw(inputs)
check("tensor-parallel attention", out.full_tensor(), attention_reference(x.astype(np.float64), *weights))
