"""Sequence-parallel MLP: like tensor parallelism, and the activations are sharded along the
tokens too. meshfuse allgathers the input before the first GEMM and reduce-scatters the output,
which stays sharded (Shard(0)).

    python examples/python/sp_mlp.py            # relaunches itself on 2 ranks
"""

from meshfuse.launch import ensure_ranks

ensure_ranks(2)

import numpy as np  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Shard, distribute_tensor  # noqa: E402

from common import check, gelu_tanh, report  # noqa: E402

H, T = 64, 32


def define_fusion(fd):
    inp = fd.define_tensor([-1, H])
    up_w = fd.define_tensor([4 * H, H])
    down_w = fd.define_tensor([H, 4 * H])
    fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(inp, up_w), approximate="tanh"), down_w))


rng = np.random.default_rng(0)
x, up_w, down_w = (rng.standard_normal(s).astype(np.float32) for s in [(T, H), (4 * H, H), (H, 4 * H)])

mesh = DeviceMesh(range(meshfuse.world_size()))
inputs = [distribute_tensor(a, mesh, [p]) for a, p in zip([x, up_w, down_w], [Shard(0), Shard(0), Shard(1)])]
fdw = FusionDefinitionWrapper(define_fusion)
report(fdw.plan(inputs))
(out,) = fdw(inputs)
assert out.placements == (Shard(0),), out.placements
check("sequence-parallel MLP", out.full_tensor(), gelu_tanh(x.astype(np.float64) @ up_w.T) @ down_w.T)
