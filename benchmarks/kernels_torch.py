"""PyTorch CPU eager baselines for the generated-kernel benchmarks (benchmarks/kernels_*.cpp run
this script in the same benchmark run and print the ratio). One thread (torch.set_num_threads(1)),
no autograd; prints "seconds <median>".

    python kernels_torch.py pointwise ROWS COLS ITERS   # gelu_tanh(x + bias) + residual
    python kernels_torch.py mlp TOKENS HIDDEN ITERS     # linear+bias, gelu_tanh, linear+bias, + x
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F


def median_seconds(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    case, a, b, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    g = torch.Generator().manual_seed(0)
    if case == "pointwise":
        x = torch.rand(a, b, generator=g) * 2 - 1
        bias = torch.rand(b, generator=g) * 2 - 1
        r = torch.rand(a, b, generator=g) * 2 - 1
        fn = lambda: F.gelu(x + bias, approximate="tanh") + r  # noqa: E731
    elif case == "mlp":
        t, h = a, b
        x = torch.rand(t, h, generator=g) * 2 - 1
        up_w, up_b = torch.rand(4 * h, h, generator=g) - 0.5, torch.rand(4 * h, generator=g) - 0.5
        down_w, down_b = torch.rand(h, 4 * h, generator=g) - 0.5, torch.rand(h, generator=g) - 0.5
        fn = lambda: F.linear(F.gelu(F.linear(x, up_w, up_b), approximate="tanh"), down_w, down_b) + x  # noqa: E731
    else:
        raise SystemExit(f"unknown case {case}")
    print("torch", torch.__version__, "threads", torch.get_num_threads())
    print("seconds", median_seconds(fn, iters))


if __name__ == "__main__":
    main()
