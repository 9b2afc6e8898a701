"""Data x tensor parallel MLP on a 2x2 mesh: mesh axis 0 (mesh_y) splits the tokens (data
parallel), mesh axis 1 (mesh_x) splits the weights (tensor parallel). meshfuse allreduces over
the 2 ranks of the tensor axis only: ranks {0, 1} and {2, 3}.

    python examples/python/dp_tp_mlp_2x2.py     # relaunches itself on 4 ranks
"""

from meshfuse.launch import ensure_ranks

ensure_ranks(4)

import numpy as np  # noqa: E402

from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor  # noqa: E402

from common import check, gelu_tanh, report  # noqa: E402

H, T = 64, 32


def define_fusion(fd):
    inp = fd.define_tensor([-1, H])
    up_w = fd.define_tensor([4 * H, H])
    down_w = fd.define_tensor([H, 4 * H])
    fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(inp, up_w), approximate="tanh"), down_w))


rng = np.random.default_rng(0)
x, up_w, down_w = (rng.standard_normal(s).astype(np.float32) for s in [(T, H), (4 * H, H), (H, 4 * H)])

mesh = DeviceMesh([[0, 1], [2, 3]])  # [data, tensor]
placements = [[Shard(0), Replicate()], [Replicate(), Shard(0)], [Replicate(), Shard(1)]]
inputs = [distribute_tensor(a, mesh, p) for a, p in zip([x, up_w, down_w], placements)]
fdw = FusionDefinitionWrapper(define_fusion)
report(fdw.plan(inputs))
(out,) = fdw(inputs)
assert out.placements == (Shard(0), Replicate()), out.placements
check("data x tensor parallel MLP", out.full_tensor(), gelu_tanh(x.astype(np.float64) @ up_w.T) @ down_w.T)
