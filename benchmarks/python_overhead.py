"""Python overhead of a cached FusionDefinitionWrapper call, beyond the C++ execution.

For each case, in the same run, call by call in pairs:
  cpp    the executor's run() of the compiled program, timed in C++ (Prepared.time_run)
  py     fdw(inputs) from Python: signature lookup, zero-copy conversion of the locals, the same
         C++ run (GIL released), wrapping the outputs as DTensors
  overhead = py - cpp, per call (target: <= 30 us)

Each call is timed on its own and a trial reports the median call, so that the preemptions of a
shared machine (milliseconds, now and then) do not count; the table shows the median of the
trials. Both DTensor kinds (meshfuse over numpy, torch DTensor).

    PYTHONPATH=build/python python benchmarks/python_overhead.py          # 1 rank
    PYTHONPATH=build/python python -m meshfuse.launch -n 2 benchmarks/python_overhead.py
"""

import argparse
import statistics
import sys
import time

import numpy as np

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor


def mlp(h):
    def define(fd):
        inp, up_w, down_w = fd.define_tensor([-1, h]), fd.define_tensor([4 * h, h]), fd.define_tensor([h, 4 * h])
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(inp, up_w), approximate="tanh"), down_w))

    return define


def add_one(fd):
    fd.add_output(fd.define_tensor([-1, 8]) + 1.0)


def measure(name, define, arrays, placements, iters, trials, torch_mesh=None):
    mesh = DeviceMesh(range(meshfuse.world_size()))
    fdw = FusionDefinitionWrapper(define)
    if torch_mesh is None:
        inputs = [distribute_tensor(a, mesh, p) for a, p in zip(arrays, placements)]
    else:
        import torch
        from torch.distributed.tensor import Replicate as TR
        from torch.distributed.tensor import Shard as TS
        from torch.distributed.tensor import distribute_tensor as tdist

        tp = [[TS(p[0].dim) if p[0].is_shard() else TR()] for p in placements]
        inputs = [tdist(torch.from_numpy(a), torch_mesh, p) for a, p in zip(arrays, tp)]
    fdw(inputs)  # compile and warm up
    call, locals_ = fdw._call_for(inputs)
    # Paired: each Python call is followed by one C++-timed run of the same program, so that
    # load from other processes hits both alike.
    cpp, py, over = [], [], []
    clock = time.perf_counter
    for _ in range(trials):
        meshfuse.barrier()
        cs, ps = [], []
        for _ in range(iters):
            t = clock()
            fdw(inputs)
            ps.append(clock() - t)
            cs.append(call.prepared.time_run(locals_, 1))
        cpp.append(statistics.median(cs))
        py.append(statistics.median(ps))
        over.append(statistics.median(p - c for p, c in zip(ps, cs)))
    return {"case": name, "cpp_us": statistics.median(cpp) * 1e6, "py_us": statistics.median(py) * 1e6,
            "overhead_us": statistics.median(over) * 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    n = meshfuse.world_size()
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    R, S = Replicate(), Shard
    cases = [("x + 1, 1 input [8n, 8]", add_one, [r(8 * n, 8)], [[S(0)]]),
             ("TP MLP h=64, t=16 (3 inputs)", mlp(64), [r(16, 64), r(256, 64), r(64, 256)], [[R], [S(0)], [S(1)]])]
    rows = [measure("meshfuse DTensor: " + c[0], *c[1:], args.iters, args.trials) for c in cases]
    if not args.no_torch:
        import torch

        from meshfuse.torch_interop import init_process_group

        torch.set_num_threads(1)
        init_process_group()
        from torch.distributed.device_mesh import init_device_mesh

        tm = init_device_mesh("cpu", (n,))
        rows += [measure("torch DTensor: " + c[0], *c[1:], args.iters, args.trials, tm) for c in cases]
    if meshfuse.rank() == 0:
        print(f"\nPython overhead per cached fdw(...) call, {n} rank(s), median of {args.trials} trials of the "
              f"median of {args.iters} calls\n")
        print("| case | C++ run (us) | fdw(...) from Python (us) | Python overhead (us) |")
        print("|---|---:|---:|---:|")
        for row in rows:
            print(f"| {row['case']} | {row['cpp_us']:.1f} | {row['py_us']:.1f} | {row['overhead_us']:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
