"""Tensor-parallel MLP (Megatron): up_w sharded by rows, down_w by columns, the input
replicated. meshfuse derives one allreduce of the output.

    python examples/python/tp_mlp.py            # relaunches itself on 2 ranks
    python -m meshfuse.launch -n 4 examples/python/tp_mlp.py
"""

from meshfuse.launch import ensure_ranks

ensure_ranks(2)

import numpy as np  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor  # noqa: E402

from common import check, gelu_tanh, report  # noqa: E402

H = 64  # hidden size
T = 32  # tokens (batch * sequence)


def define_fusion(fd):
    inp = fd.define_tensor([-1, H])  # [tokens, hidden]; tokens bound at run time
    up_w = fd.define_tensor([4 * H, H])
    down_w = fd.define_tensor([H, 4 * H])
    out = fd.ops.gelu(fd.ops.linear(inp, up_w), approximate="tanh")
    fd.add_output(fd.ops.linear(out, down_w))


rng = np.random.default_rng(0)  # the same full arrays on every rank
x, up_w, down_w = (rng.standard_normal(s).astype(np.float32) for s in [(T, H), (4 * H, H), (H, 4 * H)])

mesh = DeviceMesh(range(meshfuse.world_size()))
inputs = [distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(up_w, mesh, [Shard(0)]),
          distribute_tensor(down_w, mesh, [Shard(1)])]
fdw = FusionDefinitionWrapper(define_fusion)
report(fdw.plan(inputs))
(out,) = fdw(inputs)
check("tensor-parallel MLP", out.full_tensor(), gelu_tanh(x.astype(np.float64) @ up_w.T) @ down_w.T)
