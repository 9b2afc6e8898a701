#!/usr/bin/env python3
"""PyTorch baselines of the GPU benchmarks: the GPT-style MLP block forward (bf16, h = 4096,
t = 8192, one GPU) in eager mode and under torch.compile, timed like cuda_benchmarks (median of
10 after warm-up). With --meshfuse FILE (cuda_benchmarks' JSON) it adds the ratios the CUDA issue
asks for: meshfuse >= 1.1x faster than eager, and no slower than torch.compile.

    python3 benchmarks/cuda_mlp_torch.py [--t 8192] [--h 4096] [--json OUT] [--meshfuse FILE]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def median_seconds(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mlp(x, up_w, down_w):
    return F.linear(F.gelu(F.linear(x, up_w), approximate="tanh"), down_w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", type=int, default=8192)
    ap.add_argument("--h", type=int, default=4096)
    ap.add_argument("--json")
    ap.add_argument("--meshfuse", help="cuda_benchmarks --json output to compare with")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(args.t, args.h, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1
    up = (torch.rand(4 * args.h, args.h, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1) / args.h**0.5
    down = (torch.rand(args.h, 4 * args.h, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1) / args.h**0.5
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "t": args.t, "h": args.h}
    with torch.no_grad():
        out["eager_ms"] = median_seconds(lambda: mlp(x, up, down)) * 1e3
        compiled = torch.compile(mlp)
        out["compile_ms"] = median_seconds(lambda: compiled(x, up, down)) * 1e3
    if args.meshfuse:
        with open(args.meshfuse) as f:
            mf = json.load(f).get("mlp", {})
        if "meshfuse_ms" in mf:
            out["meshfuse_ms"] = mf["meshfuse_ms"]
            out["speedup_vs_eager"] = out["eager_ms"] / mf["meshfuse_ms"]  # goal >= 1.1
            out["speedup_vs_compile"] = out["compile_ms"] / mf["meshfuse_ms"]  # goal >= 1.0
        else:
            out["meshfuse"] = mf.get("meshfuse", "missing")
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
