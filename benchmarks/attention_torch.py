"""PyTorch CPU baseline of benchmarks/attention_cpu.cpp: torch.nn.functional.scaled_dot_product_attention
on f32 [1, HEADS, SEQ, HEAD_SIZE] q, k, v, one thread, no autograd; prints "min <fastest>" and "seconds <median>".

    python attention_torch.py HEADS SEQ HEAD_SIZE CAUSAL(0|1) ITERS
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    heads, seq, d, causal, iters = (int(a) for a in sys.argv[1:6])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq, d, generator=g) for _ in range(3))
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))  # noqa: E731
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    print("torch", torch.__version__, "threads", torch.get_num_threads())
    print("min", min(times))
    print("seconds", statistics.median(times))


if __name__ == "__main__":
    main()
