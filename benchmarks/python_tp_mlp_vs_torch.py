"""Tensor-parallel MLP on CPU ranks: meshfuse vs PyTorch's own tensor parallelism.

The same block (linear 4h, gelu tanh, linear h; no bias), the same weights and shapes, in the
same run:
  meshfuse  FusionDefinitionWrapper on meshfuse DTensors: inp Replicate, up_w Shard(0),
            down_w Shard(1) (one allreduce), called with a fresh DTensor of the input each step
  torch     parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            over gloo, called on the local (replicated) input each step, under no_grad. Its
            output is RowwiseParallel's allreduce, issued asynchronously (an AsyncCollectiveTensor):
            each step waits for it, as any use of the output would, like meshfuse's call, which
            returns once its allreduce is done.
Both run one compute thread per rank (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)). Trials
alternate between the two (which one goes first alternates too); a trial's time is the median
step of the slowest rank; the medians of the trials are reported. The outputs are checked against
each other and numpy first.

    PYTHONPATH=build/python python benchmarks/python_tp_mlp_vs_torch.py     # relaunches on 2 ranks
"""

from meshfuse.launch import ensure_ranks

ensure_ranks(2)

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch.distributed._functional_collectives import AsyncCollectiveTensor  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import DeviceMesh, DTensor, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor  # noqa: E402
from meshfuse.torch_interop import init_process_group  # noqa: E402


class Mlp(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.up = torch.nn.Linear(h, 4 * h, bias=False)
        self.down = torch.nn.Linear(4 * h, h, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def define_mlp(h):
    def define(fd):
        inp, up_w, down_w = fd.define_tensor([-1, h]), fd.define_tensor([4 * h, h]), fd.define_tensor([h, 4 * h])
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(inp, up_w), approximate="tanh"), down_w))

    return define


def timed(step, iters):
    """The median step of `iters`, of the slowest rank. Each step is timed on its own: on a shared
    machine a preemption (milliseconds) then spoils one step, not the whole trial."""
    MPI.COMM_WORLD.Barrier()
    steps = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        steps.append(time.perf_counter() - t)
    return MPI.COMM_WORLD.allreduce(statistics.median(steps), op=MPI.MAX)


def bench(t, h, trials, torch_mesh, mesh):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, h)).astype(np.float32)
    up_w = (rng.standard_normal((4 * h, h)) / math.sqrt(h)).astype(np.float32)
    down_w = (rng.standard_normal((h, 4 * h)) / math.sqrt(4 * h)).astype(np.float32)

    fdw = FusionDefinitionWrapper(define_mlp(h))
    weights = [distribute_tensor(up_w, mesh, [Shard(0)]), distribute_tensor(down_w, mesh, [Shard(1)])]

    def meshfuse_step():
        return fdw([DTensor.from_local(x, mesh, [Replicate()]), *weights])[0].to_local()

    model = Mlp(h)
    with torch.no_grad():
        model.up.weight.copy_(torch.from_numpy(up_w))
        model.down.weight.copy_(torch.from_numpy(down_w))
    tp = parallelize_module(model, torch_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    tx = torch.from_numpy(x)

    def torch_step():
        with torch.no_grad():
            out = tp(tx)
            # Not waiting would time only the issue of the allreduce (torch warns at exit about
            # "unwaited collective calls") and favour torch.
            return out.wait() if isinstance(out, AsyncCollectiveTensor) else out

    ours, theirs = meshfuse_step(), torch_step().numpy()
    hidden = x.astype(np.float64) @ up_w.T
    want = (0.5 * hidden * (1 + np.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden**3)))) @ down_w.T
    np.testing.assert_allclose(ours, want, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(theirs, want, rtol=1e-3, atol=1e-3)

    # Enough iterations per trial for ~0.2 s of work.
    one = max(timed(meshfuse_step, 3), timed(torch_step, 3))
    iters = max(3, min(2000, int(0.2 / one)))
    mf, th = [], []
    for trial in range(trials):
        if trial % 2 == 0:
            mf.append(timed(meshfuse_step, iters))
            th.append(timed(torch_step, iters))
        else:
            th.append(timed(torch_step, iters))
            mf.append(timed(meshfuse_step, iters))
    return statistics.median(mf), statistics.median(th), iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--sizes", default="16x256,128x512,512x1024", help="comma-separated TOKENSxHIDDEN")
    args = ap.parse_args()
    torch.set_num_threads(1)
    init_process_group()
    n = meshfuse.world_size()
    torch_mesh, mesh = init_device_mesh("cpu", (n,)), DeviceMesh(range(n))
    rows = []
    for size in args.sizes.split(","):
        t, h = (int(v) for v in size.split("x"))
        mf, th, iters = bench(t, h, args.trials, torch_mesh, mesh)
        rows.append((t, h, iters, mf, th))
    if meshfuse.rank() == 0:
        print(f"\nTensor-parallel MLP on {n} CPU ranks (median of {args.trials} trials of the median forward, "
              "slowest rank)\n")
        print("| tokens x hidden | iters/trial | meshfuse (ms) | torch TP (ms) | torch / meshfuse |")
        print("|---|---:|---:|---:|---:|")
        for t, h, iters, mf, th in rows:
            print(f"| {t} x {h} | {iters} | {mf * 1e3:.3f} | {th * 1e3:.3f} | {th / mf:.2f}x |")


if __name__ == "__main__":
    main()
