#!/usr/bin/env python3
"""PyTorch baselines of the GPU benchmarks: the GPT-style MLP block forward (bf16, h = 4096,
t = 8192, one GPU) and the pre-norm decoder layer of examples/models.h (bf16, batch 2, seq 2048,
h = 4096, 32 heads, causal) in eager mode and under torch.compile, and scaled_dot_product_attention
alone (bf16, batch 2, 32 heads, seq 2048, head size 128; forward, and backward through autograd),
timed like cuda_benchmarks (median of 10 after warm-up). With --meshfuse FILE (cuda_benchmarks' JSON) it adds the ratios the
CUDA issue asks for: meshfuse >= 1.1x faster than eager, and no slower than torch.compile.

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


def decoder(x, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, up_w, down_w, heads):
    b, s, h = x.shape
    to_heads = lambda t: t.reshape(b, s, heads, h // heads).transpose(1, 2)
    n1 = F.layer_norm(x, (h,), ln1_w, ln1_b, eps=1e-5)
    attn = F.scaled_dot_product_attention(to_heads(F.linear(n1, wq)), to_heads(F.linear(n1, wk)),
                                          to_heads(F.linear(n1, wv)), is_causal=True)
    x2 = x + F.linear(attn.transpose(1, 2).reshape(b, s, h), wo)
    return x2 + mlp(F.layer_norm(x2, (h,), ln2_w, ln2_b, eps=1e-5), up_w, down_w)


def attention(dev, g):
    """torch's scaled_dot_product_attention on cuda_benchmarks' attention shapes (ms, TFLOP/s)."""
    b, heads, s, d = 2, 32, 2048, 128
    out = {"batch": b, "heads": heads, "seq": s, "head_size": d, "backend": "torch sdpa (default kernel choice)"}
    for causal in (True, False):
        q, k, v, go = [(torch.rand(b, heads, s, d, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1)
                       for _ in range(4)]
        flops = 4.0 * b * heads * s * s * d / (2 if causal else 1)
        with torch.no_grad():
            fwd = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        qg, kg, vg = [t.clone().requires_grad_() for t in (q, k, v)]
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        bwd = median_seconds(lambda: o.backward(go, retain_graph=True))
        out["causal" if causal else "full"] = {
            "forward": {"ms": fwd * 1e3, "TFLOPs": flops / fwd / 1e12},
            # dq, dk, dv: five products of the forward's size (q k^T recomputed, g v^T, dS k, dS^T q, P^T g)
            "backward": {"ms": bwd * 1e3, "TFLOPs": 2.5 * flops / bwd / 1e12}}
    return out


def compare_attention(out, mf):
    for mask in ("causal", "full"):
        if mask in mf and mask in out["attention"]:
            torch_ms = out["attention"][mask]["forward"]["ms"]
            out["attention"][mask]["meshfuse_forward_ms"] = mf[mask]["tensor_cores"]["ms"]
            out["attention"][mask]["meshfuse_vs_torch_forward"] = torch_ms / mf[mask]["tensor_cores"]["ms"]


def compare(out, name, mf):
    if "meshfuse_ms" in mf:
        out[name]["meshfuse_ms"] = mf["meshfuse_ms"]
        out[name]["speedup_vs_eager"] = out[name]["eager_ms"] / mf["meshfuse_ms"]  # goal >= 1.1
        out[name]["speedup_vs_compile"] = out[name]["compile_ms"] / mf["meshfuse_ms"]  # goal >= 1.0
    else:
        out[name]["meshfuse"] = mf.get("meshfuse", "missing")


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
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "mlp": {"t": args.t, "h": args.h}, "decoder": {"batch": 2, "seq": 2048, "h": args.h, "heads": 32}}
    rand = lambda *shape, scale=1.0: (torch.rand(*shape, device=dev, dtype=torch.bfloat16, generator=g) * 2 - 1) * scale
    h = args.h
    dec_args = [rand(2, 2048, h), 1 + rand(h, scale=0.1), rand(h, scale=0.1)] + [rand(h, h, scale=h**-0.5)] * 4 + \
               [1 + rand(h, scale=0.1), rand(h, scale=0.1), rand(4 * h, h, scale=h**-0.5), rand(h, 4 * h, scale=h**-0.5)]
    with torch.no_grad():
        out["mlp"]["eager_ms"] = median_seconds(lambda: mlp(x, up, down)) * 1e3
        compiled = torch.compile(mlp)
        out["mlp"]["compile_ms"] = median_seconds(lambda: compiled(x, up, down)) * 1e3
        out["decoder"]["eager_ms"] = median_seconds(lambda: decoder(*dec_args, heads=32)) * 1e3
        compiled_dec = torch.compile(decoder)
        out["decoder"]["compile_ms"] = median_seconds(lambda: compiled_dec(*dec_args, heads=32)) * 1e3
    out["attention"] = attention(dev, g)
    if args.meshfuse:
        with open(args.meshfuse) as f:
            mf = json.load(f)
        compare(out, "mlp", mf.get("mlp", {}))
        compare(out, "decoder", mf.get("decoder", {}))
        compare_attention(out, mf.get("attention", {}))
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
