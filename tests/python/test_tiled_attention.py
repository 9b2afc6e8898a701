"""The tiled attention kernel (online softmax over 64 x 128 tiles; docs/kernels.md) against
torch.nn.functional.scaled_dot_product_attention: f32 and bf16, causal and not, sequence lengths
up to 4096 that are no multiple of the tiles; sdpa_lse against torch.logsumexp of the scores."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import meshfuse
from meshfuse import DataType

DTYPES = {"f32": (DataType.Float, torch.float32), "bf16": (DataType.BFloat16, torch.bfloat16)}


def _run(define, tensors):
    mesh = meshfuse.DeviceMesh(list(range(meshfuse.world_size())))
    fdw = meshfuse.FusionDefinitionWrapper(define, device="cpu")
    outs = fdw([meshfuse.distribute_tensor(t, mesh, [meshfuse.Replicate()]) for t in tensors])
    # The outputs' meshfuse dtypes, and their values as torch tensors (full_tensor() may give numpy).
    fulls = [o.full_tensor() for o in outs]
    return [o.dtype for o in outs], [f if isinstance(f, torch.Tensor) else torch.from_numpy(np.asarray(f)) for f in fulls]


def _lse(q, k, is_causal):
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(), float("-inf"))
    return torch.logsumexp(s, -1)


def _close(got, want, tol):
    got, want = got.double(), want.double()
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= tol * max(scale, 1.0), f"max error {err} over a range of {scale}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 3, 1, 16), (1, 2, 100, 32), (1, 2, 333, 64), (2, 1, 1000, 48)],
                         ids=lambda s: f"s{s[2]}")
def test_sdpa_and_lse_like_torch(dtype, is_causal, shape):
    md, td = DTYPES[dtype]
    g = torch.Generator().manual_seed(sum(shape))
    q, k, v = (torch.randn(*shape, generator=g).to(td) for _ in range(3))

    def define(fd):
        tq, tk, tv = (fd.define_tensor(list(shape), dtype=md) for _ in range(3))
        fd.add_output(fd.ops.sdpa(tq, tk, tv, is_causal=is_causal))
        fd.add_output(fd.ops.sdpa_lse(tq, tk, is_causal=is_causal))

    dtypes, (out, lse) = _run(define, [q, k, v])
    # torch in f32 on the same (bf16-rounded) inputs: the kernel computes in f32 and rounds once.
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal)
    assert dtypes == [md, DataType.Float]
    _close(out, want, 1e-5 if dtype == "f32" else 8e-3)
    _close(lse, _lse(q, k, is_causal), 1e-5)


@pytest.mark.world(1)  # the kernel's numerics at sequence 4095: one rank is enough
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_long_sequence_like_torch(is_causal):
    shape = (1, 2, 4095, 64)  # 4095: the last query tile and key tile are partial
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))

    def define(fd):
        tq, tk, tv = (fd.define_tensor(list(shape)) for _ in range(3))
        fd.add_output(fd.ops.sdpa(tq, tk, tv, is_causal=is_causal))
        fd.add_output(fd.ops.sdpa_lse(tq, tk, is_causal=is_causal))

    _, (out, lse) = _run(define, [q, k, v])
    _close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), 1e-5)
    _close(lse, _lse(q, k, is_causal), 1e-5)


def test_heads_sharded_sdpa_and_lse_need_no_communication():
    # sdpa_lse follows sdpa's sharding rule: batch and heads pass through, sequences stay whole.
    shape = (1, 4, 70, 16)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))

    def define(fd):
        tq, tk, tv = (fd.define_tensor(list(shape)) for _ in range(3))
        fd.add_output(fd.ops.sdpa(tq, tk, tv, is_causal=True))
        fd.add_output(fd.ops.sdpa_lse(tq, tk, is_causal=True))

    mesh = meshfuse.DeviceMesh(list(range(meshfuse.world_size())))
    fdw = meshfuse.FusionDefinitionWrapper(define, device="cpu")
    inputs = [meshfuse.distribute_tensor(t, mesh, [meshfuse.Shard(1)]) for t in (q, k, v)]
    assert [c.kind for c in fdw.plan(inputs).collectives()] == []
    outs = fdw(inputs)
    assert [o.placements for o in outs] == [(meshfuse.Shard(1),)] * 2
    out, lse = (torch.as_tensor(np.asarray(o.full_tensor())) for o in outs)
    _close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-5)
    _close(lse, _lse(q, k, True), 1e-5)
