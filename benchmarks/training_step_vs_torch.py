"""One training step (forward + backward + AdamW) on one CPU thread: meshfuse against PyTorch eager
autograd and against torch.compile; and the cold compile time of a decoder layer's whole step.

Models (examples/python/tiny_gpt.py defines both sides of each):
  mlp       a GPT MLP block with a residual, x + down(gelu_tanh(up(x) + up_b)) + down_b, x [T, H],
            and a mean-squared-error loss against a target; trains up_w, up_b, down_w, down_b
  tiny_gpt  examples/python/tiny_gpt.py's model (2 pre-norm decoder layers, causal attention, LM
            head, cross-entropy), batch x seq tokens; trains every parameter
Systems, on the same initial weights and data (their first losses are checked against each other):
  meshfuse  fdw.value_and_grad(...) then meshfuse.optim.AdamW.step(grads): three compiled programs
            (forward with saves, backward, the fused in-place update)
  eager     torch.autograd: loss.backward(), torch.optim.AdamW.step() (zero_grad first)
  compile   the loss function under torch.compile (AOTAutograd compiles its backward too) and the
            optimizer step under torch.compile
One compute thread (OPENBLAS_NUM_THREADS=1 is set below, torch.set_num_threads(1)). Each trial
times `iters` steps one by one and keeps the median step; trials alternate between the systems
(the order rotates); the tables give the median of the trials.

Cold compile (--compile-only for just this): a fresh Python process per trial (so every in-process
cache is empty) defines one decoder layer with a mean-squared loss, and times its first training
step (differentiation, compiling the forward, backward and optimizer programs, their kernels, and
one run of each) minus a cached step, per phase.

    PYTHONPATH=build/python python benchmarks/training_step_vs_torch.py [--sizes ...] [--trials 5]
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy or meshfuse load OpenBLAS

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import meshfuse  # noqa: E402
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, distribute_tensor  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import tiny_gpt  # noqa: E402

LR = 1e-3


# ---- the two models, each as (names and arrays of its parameters, its data, both definitions) ------

def mlp_model(t: int, h: int):
    rng = np.random.default_rng(0)
    params = {"up_w": rng.standard_normal((4 * h, h)) / math.sqrt(h), "up_b": 0.1 * rng.standard_normal(4 * h),
              "down_w": rng.standard_normal((h, 4 * h)) / math.sqrt(4 * h), "down_b": 0.1 * rng.standard_normal(h)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    data = [rng.standard_normal((t, h)).astype(np.float32) for _ in range(2)]  # x, target

    def define(fd):
        up_w, up_b = fd.define_tensor([4 * h, h], name="up_w"), fd.define_tensor([4 * h], name="up_b")
        down_w, down_b = fd.define_tensor([h, 4 * h], name="down_w"), fd.define_tensor([h], name="down_b")
        x, target = fd.define_tensor([t, h], name="x"), fd.define_tensor([t, h], name="target")
        ops = fd.ops
        m = ops.gelu(ops.linear(x, up_w, up_b), approximate="tanh")
        err = ops.sub(ops.add(x, ops.linear(m, down_w, down_b)), target)
        fd.add_output(ops.mean(ops.mul(err, err), [0, 1]))

    def torch_loss(p, x, target):
        y = x + F.linear(F.gelu(F.linear(x, p["up_w"], p["up_b"]), approximate="tanh"), p["down_w"], p["down_b"])
        return ((y - target) ** 2).mean()

    return params, data, define, torch_loss


def tiny_gpt_model(c: tiny_gpt.Config):
    params = tiny_gpt.init_params(c)
    data = list(tiny_gpt.batch(c))  # tokens, targets

    def torch_loss(p, tokens, targets):
        return tiny_gpt.torch_loss(c, p, tokens, targets)

    return params, data, tiny_gpt.define_tiny_gpt(c), torch_loss


# ---- one step of each system ------------------------------------------------------------------------

def meshfuse_stepper(params, data, define):
    mesh = DeviceMesh([0])
    weights = [distribute_tensor(a, mesh, [Replicate()]) for a in params.values()]
    inputs = weights + [distribute_tensor(a, mesh, [Replicate()]) for a in data]
    fdw = FusionDefinitionWrapper(define)
    opt = meshfuse.optim.AdamW(weights, lr=LR)
    wrt = list(range(len(weights)))

    def step():
        (loss,), grads = fdw.value_and_grad(inputs, wrt)
        opt.step(grads)
        return loss

    return step, lambda loss: float(np.asarray(loss.to_local()))


def torch_stepper(params, data, torch_loss, compiled: bool):
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    d = [torch.from_numpy(a) for a in data]
    opt = torch.optim.AdamW(list(p.values()), lr=LR)
    loss_fn = torch.compile(torch_loss) if compiled else torch_loss
    opt_step = torch.compile(opt.step) if compiled else opt.step

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(p, *d)
        loss.backward()
        opt_step()
        return loss

    return step, lambda loss: loss.item()


def timed(step, iters: int) -> float:
    """The median of `iters` steps, each timed on its own (a preemption spoils one step, not all)."""
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(model, trials: int, systems: list) -> dict:
    """Median step time per system, and each system's first-step time (compiling included)."""
    params, data, define, torch_loss = model
    steppers, first, losses = {}, {}, {}
    for name in systems:
        t = time.perf_counter()
        if name == "meshfuse":
            step, value = meshfuse_stepper(params, data, define)
        else:
            step, value = torch_stepper(params, data, torch_loss, compiled=(name == "compile"))
        losses[name] = value(step())  # the first step: compiles
        first[name] = time.perf_counter() - t
        steppers[name] = step
    ref = losses[systems[0]]
    for name, loss in losses.items():  # the same model on the same data: the same first loss
        assert abs(loss - ref) <= 1e-4 * max(1.0, abs(ref)), losses
    for step in steppers.values():  # warm up (torch.compile may specialize again on a second call)
        step()
    one = max(timed(s, 1) for s in steppers.values())
    iters = max(3, min(50, int(0.5 / one)))
    results = {name: [] for name in systems}
    for trial in range(trials):
        order = systems[trial % len(systems):] + systems[:trial % len(systems)]
        for name in order:
            results[name].append(timed(steppers[name], iters))
    return {"median": {k: statistics.median(v) for k, v in results.items()}, "first": first, "iters": iters}


# ---- cold compile of a decoder layer's step -------------------------------------------------------

def cold_compile_child(b: int, s: int, h: int, heads: int) -> dict:
    """In a fresh process: one decoder layer with a mean-squared loss; the first step's phases
    timed one by one (the forward's first run compiles its kernels, and so on), then a cached step."""
    c = tiny_gpt.Config(batch=b, seq=s, hidden=h, heads=heads, layers=1)
    full = tiny_gpt.init_params(c)
    params = {k[len("l0."):]: v for k, v in full.items() if k.startswith("l0.")}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, h)).astype(np.float32)

    def define(fd):
        w = {n: fd.define_tensor(shape, name=n) for n, shape in tiny_gpt.layer_param_shapes(c).items()}
        xin = fd.define_tensor([b, s, h], name="x")
        y = tiny_gpt.decoder_layer(fd.ops, c, xin, w)
        fd.add_output(fd.ops.mean(fd.ops.mul(y, y), [0, 1, 2]))

    mesh = DeviceMesh([0])
    weights = [distribute_tensor(params[n], mesh, [Replicate()]) for n in tiny_gpt.LAYER_PARAMS]
    inputs = weights + [distribute_tensor(x, mesh, [Replicate()])]
    wrt = list(range(len(weights)))
    marks = []  # (wall, CPU) at each phase boundary: on a shared machine the CPU time is the steadier

    def mark():
        marks.append((time.perf_counter(), time.process_time()))

    mark()
    fdw = FusionDefinitionWrapper(define)
    opt = meshfuse.optim.AdamW(weights, lr=LR)
    ad = fdw._autodiff_for(inputs, wrt, False)  # define + differentiate
    mark()
    outs = ad.forward(inputs)  # compile the forward-with-saves and its kernels, run it
    mark()
    grads = ad.backward(ad.backward_args(inputs, outs, None))  # the same for the backward
    mark()
    opt.step(grads)  # and for the optimizer's program
    mark()
    cached = []
    for _ in range(3):
        start = len(marks)
        mark()
        outs = ad.forward(inputs)
        mark()
        grads = ad.backward(ad.backward_args(inputs, outs, None))
        mark()
        opt.step(grads)
        mark()
        cached.append([[b[k] - a[k] for a, b in zip(marks[start:start + 3], marks[start + 1:start + 4])] for k in (0, 1)])
        del marks[start:]
    run = [[statistics.median(c[k][phase] for c in cached) for phase in range(3)] for k in (0, 1)]  # [wall, cpu][phase]
    result = {}
    for k, clock in ((0, "wall"), (1, "cpu")):
        t = [m[k] for m in marks]
        result[clock] = {"differentiate": t[1] - t[0], "forward": t[2] - t[1] - run[k][0],
                         "backward": t[3] - t[2] - run[k][1], "optimizer": t[4] - t[3] - run[k][2],
                         "total": t[4] - t[0] - sum(run[k]), "cached_step": sum(run[k])}
    result["kernels"] = {"forward": _kernel_count(ad.forward, inputs),
                         "backward": _kernel_count(ad.backward, ad.backward_args(inputs, outs, None))}
    return result


def _kernel_count(fdw, inputs) -> dict:
    lines = [line.strip() for line in fdw.plan(inputs).host_ir().splitlines()]
    return {"kernels": sum(line.startswith("launch ") for line in lines), "gemms": sum(line.startswith("gemm ") for line in lines)}


def cold_compile(shape: tuple, trials: int) -> list:
    out = []
    for _ in range(trials):
        r = subprocess.run([sys.executable, __file__, "--cold-child", ",".join(map(str, shape))], capture_output=True,
                           text=True, check=True, env=dict(os.environ))
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


# ---- the command ----------------------------------------------------------------------------------

def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return (f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} "
            f"(1 / 5 min), torch {torch.__version__}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--mlp", default="512x512,1024x1024,2048x1024", help="comma-separated TOKENSxHIDDEN")
    ap.add_argument("--gpt", default="4x128x512x8x512", help="comma-separated BATCHxSEQxHIDDENxHEADSxVOCAB")
    ap.add_argument("--systems", default="meshfuse,eager,compile")
    ap.add_argument("--compile-shape", default="4x128x512x8", help="the decoder layer: BATCHxSEQxHIDDENxHEADS")
    ap.add_argument("--compile-trials", type=int, default=3)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--cold-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cold_child:
        print(json.dumps(cold_compile_child(*(int(v) for v in args.cold_child.split(",")))))
        return
    print(f"machine: {machine()}\n")
    systems = args.systems.split(",")
    if not args.compile_only:
        rows = []
        for size in filter(None, args.mlp.split(",")):
            t, h = (int(v) for v in size.split("x"))
            rows.append((f"MLP block, {t} tokens x hidden {h}", bench(mlp_model(t, h), args.trials, systems)))
        for size in filter(None, args.gpt.split(",")):
            b, s, h, heads, v = (int(x) for x in size.split("x"))
            c = tiny_gpt.Config(vocab=v, seq=s, batch=b, hidden=h, heads=heads)
            rows.append((f"tiny GPT, {b}x{s} tokens, hidden {h}, {heads} heads, vocab {v}",
                         bench(tiny_gpt_model(c), args.trials, systems)))
        head = " | ".join(f"{n} (ms)" for n in systems)
        ratios = " | ".join(f"{n} / meshfuse" for n in systems if n != "meshfuse")
        print(f"| case | iters/trial | {head} | {ratios} |")
        print("|---|---:|" + "---:|" * (len(systems) * 2 - 1))
        for label, r in rows:
            m = r["median"]
            times = " | ".join(f"{m[n] * 1e3:.2f}" for n in systems)
            rel = " | ".join(f"{m[n] / m['meshfuse']:.2f}x" for n in systems if n != "meshfuse")
            print(f"| {label} | {r['iters']} | {times} | {rel} |")
        print("\nfirst step (compiling included), s: " + "; ".join(
            f"{label}: " + ", ".join(f"{n} {r['first'][n]:.2f}" for n in systems) for label, r in rows))
    if args.compile_trials <= 0:  # (--compile-trials 0: the step table alone)
        return
    shape = tuple(int(v) for v in args.compile_shape.split("x"))
    runs = cold_compile(shape, args.compile_trials)
    print(f"\ncold compile of a decoder layer's training step (batch, seq, hidden, heads = {shape}), "
          f"{args.compile_trials} fresh processes, seconds, median (min-max):")
    print("| phase | wall | CPU (this process) |\n|---|---:|---:|")
    for key in ("differentiate", "forward", "backward", "optimizer", "total", "cached_step"):
        cells = []
        for clock in ("wall", "cpu"):
            vals = [r[clock][key] for r in runs]
            cells.append(f"{statistics.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})")
        print(f"| {key} | {cells[0]} | {cells[1]} |")
    print(f"  kernels: {runs[0]['kernels']}")


if __name__ == "__main__":
    main()
