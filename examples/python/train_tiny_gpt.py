"""Trains examples/python/tiny_gpt.py's model with meshfuse (value_and_grad + meshfuse.optim.AdamW)
on a token stream drawn from a fixed random Markov chain, and shows the loss approaching the
chain's entropy rate, the lowest mean cross-entropy any next-token predictor can reach.

    python examples/python/train_tiny_gpt.py                   # 600 steps, writes tiny_gpt_loss.{csv,png}
    python examples/python/train_tiny_gpt.py --torch           # the same model trained by PyTorch alongside
    mpirun -np 2 python examples/python/train_tiny_gpt.py      # data parallel: the batch Shard(0)

The chain: transition matrix P (row i: the next token's distribution after token i) with
Dirichlet(concentration) rows, seeded. Its stationary distribution pi solves pi P = pi, and its
entropy rate is H = -sum_i pi_i sum_j P_ij log P_ij (nats per token): after the first token of a
stationary stream, each target's conditional entropy given everything before it is exactly H, so
the expected loss of any model is at least H, and a model that learns P reaches it. The loss per
step is printed with a progress bar (plain lines when stderr is not a terminal); the curve is
written as CSV and PNG (matplotlib). With --torch, PyTorch trains the same model from the same
initial weights on the same batches (torch.autograd + torch.optim.AdamW) and both curves are
drawn, with their difference (tests/python/test_train_tiny_gpt.py checks 50 such steps).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_gpt import Config, define_tiny_gpt, init_params, torch_loss  # noqa: E402


# ---- the data: a Markov chain and its entropy rate ------------------------------------------------

@dataclass(frozen=True)
class MarkovChain:
    transitions: np.ndarray  # P [V, V], rows sum to 1
    stationary: np.ndarray  # pi [V]: pi P = pi, sum 1

    @property
    def entropy_rate(self) -> float:
        """H = -sum_i pi_i sum_j P_ij log P_ij (nats per token; 0 log 0 = 0)."""
        p = self.transitions
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        return float(-np.sum(self.stationary[:, None] * plogp))

    @property
    def unigram_entropy(self) -> float:
        """H(pi): the loss of a model that ignores the context and predicts token frequencies."""
        pi = self.stationary[self.stationary > 0]
        return float(-np.sum(pi * np.log(pi)))


def markov_chain(vocab: int, seed: int = 0, concentration: float = 0.2) -> MarkovChain:
    """A random chain with Dirichlet(concentration) rows (smaller: sparser rows, lower entropy)."""
    p = np.random.default_rng(seed).dirichlet(np.full(vocab, concentration), size=vocab)
    return MarkovChain(p, stationary_distribution(p))


def stationary_distribution(p: np.ndarray) -> np.ndarray:
    """pi with pi P = pi and sum(pi) = 1, exactly (a linear solve, not power iteration): the
    equations (P^T - I) pi = 0 are rank V-1 for an irreducible chain (Dirichlet rows are positive),
    so one of them is replaced by the normalization."""
    v = p.shape[0]
    a = p.T - np.eye(v)
    a[-1, :] = 1.0
    b = np.zeros(v)
    b[-1] = 1.0
    return np.linalg.solve(a, b)


def sample_stream(chain: MarkovChain, length: int, seed: int) -> np.ndarray:
    """`length` tokens of the chain, the first drawn from pi (so the stream is stationary)."""
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(chain.transitions, axis=1)
    uniform = rng.random(length)
    v = chain.transitions.shape[0]
    out = np.empty(length, np.int64)
    out[0] = min(int(np.searchsorted(np.cumsum(chain.stationary), uniform[0])), v - 1)
    for i in range(1, length):
        out[i] = min(int(np.searchsorted(cumulative[out[i - 1]], uniform[i])), v - 1)
    return out


def batches(stream: np.ndarray, c: Config, steps: int, seed: int) -> list:
    """Per step, (tokens, targets) i64 [batch, seq]: random windows of the stream and their next
    tokens (every target is a real next token: none ignored)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        starts = rng.integers(0, len(stream) - c.seq - 1, size=c.batch)
        windows = np.stack([stream[s:s + c.seq + 1] for s in starts])
        out.append((np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])))
    return out


# ---- training: meshfuse, and the same model in PyTorch --------------------------------------------

@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 1e-2
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    schedule: str = "linear"  # "linear": lr decays linearly to 0 over the run; "constant"

    def lr_at(self, step: int, steps: int) -> float:
        return self.lr * (1 - step / steps) if self.schedule == "linear" else self.lr


def set_lr(optimizer, lr: float):
    """The same for meshfuse.optim and torch.optim: parameter groups read and written as dicts."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_meshfuse(c: Config, params: dict, data: list, opt: AdamWConfig, on_step=None):
    """Trains with value_and_grad and meshfuse.optim.AdamW, every parameter replicated and the batch
    Shard(0) over the world (data parallel; one rank: a one-device mesh). Returns the loss per step
    and the final parameters (numpy, by name)."""
    mesh = DeviceMesh(range(meshfuse.world_size()))
    batch_placement = Shard(0) if c.batch % meshfuse.world_size() == 0 else Replicate()
    weights = [distribute_tensor(a, mesh, [Replicate()]) for a in params.values()]
    adamw = meshfuse.optim.AdamW(weights, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    fdw = FusionDefinitionWrapper(define_tiny_gpt(c))
    wrt = list(range(len(weights)))
    losses = []
    for step, (tokens, targets) in enumerate(data):
        set_lr(adamw, opt.lr_at(step, len(data)))  # a scalar input of the update: no recompile
        batch = [distribute_tensor(a, mesh, [batch_placement]) for a in (tokens, targets)]
        (loss,), grads = fdw.value_and_grad(weights + batch, wrt)
        adamw.step(grads)  # every parameter updated in place
        losses.append(float(np.asarray(loss.full_tensor())))
        if on_step:
            on_step(step, losses[-1])
    return losses, {k: np.array(w.full_tensor()) for k, w in zip(params, weights)}


def train_torch(c: Config, params: dict, data: list, opt: AdamWConfig, on_step=None):
    """The same model, data and optimizer in PyTorch (torch.autograd, torch.optim.AdamW, f32)."""
    import torch

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    adamw = torch.optim.AdamW(list(tp.values()), lr=opt.lr, betas=opt.betas, eps=opt.eps,
                              weight_decay=opt.weight_decay)
    losses = []
    for step, (tokens, targets) in enumerate(data):
        set_lr(adamw, opt.lr_at(step, len(data)))
        adamw.zero_grad()
        loss = torch_loss(c, tp, torch.from_numpy(tokens), torch.from_numpy(targets))
        loss.backward()
        adamw.step()
        losses.append(loss.item())
        if on_step:
            on_step(step, losses[-1])
    return losses, {k: v.detach().numpy().copy() for k, v in tp.items()}


# ---- reporting: a progress bar, the CSV and the plot ----------------------------------------------

class Progress:
    """When stderr is a terminal, a tqdm bar there (the loss and its gap to the floor as postfix)
    and each step's line on stdout above it; else (a pipe, CI, a log file) only the plain lines."""

    def __init__(self, steps: int, label: str, floor: float, enabled: bool = True):
        self.steps, self.label, self.floor, self.enabled = steps, label, floor, enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=steps, desc=label, unit="step", dynamic_ncols=True)

    def __call__(self, step: int, loss: float):
        if not self.enabled:
            return
        line = f"{self.label} step {step + 1}/{self.steps}  loss {loss:.4f}  (floor {self.floor:.4f})"
        if self.bar is None:
            print(line, flush=True)
            return
        self.bar.write(line)
        self.bar.set_postfix(loss=f"{loss:.4f}", gap=f"{loss - self.floor:+.4f}")
        self.bar.update()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def smooth(losses: list, window: int) -> list:
    """The mean of the last `window` losses at each step (the first ones: of what there is)."""
    out, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss - (losses[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def write_csv(path: str, curves: dict, floor: float):
    """One row per step: the step, each curve's loss, and the entropy-rate floor."""
    names = list(curves)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"{n}_loss" for n in names] + ["entropy_rate"])
        for i in range(len(curves[names[0]])):
            w.writerow([i + 1] + [f"{curves[n][i]:.7g}" for n in names] + [f"{floor:.7g}"])


def plot(path: str, curves: dict, chain: MarkovChain, window: int, title: str):
    """One panel per curve, side by side: the loss per step (light) and its moving mean, with the
    entropy rate (the floor), the unigram entropy and log V; with two curves, a last panel with
    their difference per step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(curves) + (1 if len(curves) == 2 else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.5), squeeze=False)
    v = chain.transitions.shape[0]
    levels = [(chain.entropy_rate, f"entropy rate H = {chain.entropy_rate:.4f}", "-"),
              (chain.unigram_entropy, f"unigram entropy H(pi) = {chain.unigram_entropy:.4f}", ":"),
              (math.log(v), f"log V = {math.log(v):.4f}", "--")]
    top = max(max(losses) for losses in curves.values())
    for ax, (name, losses), color in zip(axes[0], curves.items(), ["tab:blue", "tab:orange"]):
        steps = np.arange(1, len(losses) + 1)
        ax.plot(steps, losses, color=color, alpha=0.3, linewidth=0.8, label=f"{name}: loss per step")
        ax.plot(steps, smooth(losses, window), color=color, label=f"{name}: mean of {window} steps")
        for value, label, style in levels:
            ax.axhline(value, color="black", linestyle=style, linewidth=1, label=label)
        ax.set_ylim(chain.entropy_rate - 0.2, top + 0.05)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats per token)")
        ax.set_title(f"{name}: {title}", fontsize=10)
        ax.legend(fontsize=8)
    if panels == 3:
        (a, la), (b, lb) = curves.items()
        diff = np.abs(np.asarray(la) - np.asarray(lb))
        axes[0][2].semilogy(np.arange(1, len(diff) + 1), np.maximum(diff, 1e-9), color="tab:green")
        axes[0][2].set_xlabel("step")
        axes[0][2].set_ylabel(f"|{a} loss - {b} loss|")
        axes[0][2].set_title("difference per step (floor at 1e-9: equal)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- the command ----------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--schedule", choices=["linear", "constant"], default="linear",
                    help="linear: the learning rate decays linearly to 0 over the run")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--concentration", type=float, default=0.2, help="of the chain's Dirichlet rows")
    ap.add_argument("--seed", type=int, default=0, help="of the chain, the stream, the batches and the weights")
    ap.add_argument("--stream", type=int, default=100_000, help="tokens sampled from the chain")
    ap.add_argument("--window", type=int, default=25, help="steps of the moving mean (plot, final report)")
    ap.add_argument("--torch", action="store_true", help="also train the same model with PyTorch and compare")
    ap.add_argument("--out", default="tiny_gpt_loss", help="writes OUT.csv and OUT.png")
    ap.add_argument("--max-gap", type=float, default=None,
                    help="fail (exit 1) unless the final moving mean is within this many nats of the floor")
    return ap.parse_args(argv)


def compare(curves: dict, weights: dict, steps: int):
    """Prints the two losses at a few steps and the largest differences, of the losses and of the
    final weights."""
    ours, theirs = curves["meshfuse"], curves["torch"]
    shown = sorted({1, 10, 50, 100, 200, steps} & set(range(1, steps + 1)))
    print("| step | " + " | ".join(map(str, shown)) + " |\n|---|" + "---:|" * len(shown))
    for name, losses in curves.items():
        print(f"| {name} | " + " | ".join(f"{losses[i - 1]:.6f}" for i in shown) + " |")
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    weight_diff = max(float(np.max(np.abs(weights["meshfuse"][k] - weights["torch"][k]))) for k in weights["torch"])
    print(f"meshfuse vs torch over {steps} steps: largest relative loss difference {loss_diff:.2e}, "
          f"largest final weight difference {weight_diff:.2e}")


def main(argv=None) -> int:
    args = parse_args(argv)
    c = Config(vocab=args.vocab, seq=args.seq, batch=args.batch, hidden=args.hidden, heads=args.heads)
    chain = markov_chain(args.vocab, args.seed, args.concentration)
    floor = chain.entropy_rate
    data = batches(sample_stream(chain, args.stream, args.seed + 1), c, args.steps, args.seed + 2)
    params = init_params(c, args.seed)
    opt = AdamWConfig(lr=args.lr, weight_decay=args.weight_decay, schedule=args.schedule)
    main_rank = meshfuse.rank() == 0
    if main_rank:
        print(f"Markov chain over {args.vocab} tokens: entropy rate H = {floor:.4f} nats/token (the floor), "
              f"unigram entropy {chain.unigram_entropy:.4f}, log V {math.log(args.vocab):.4f}", flush=True)
    curves, weights = {}, {}
    for name, train in [("meshfuse", train_meshfuse)] + ([("torch", train_torch)] if args.torch else []):
        progress = Progress(args.steps, name, floor, enabled=main_rank)
        curves[name], weights[name] = train(c, params, data, opt, progress)
        progress.close()
    if not main_rank:
        return 0
    write_csv(args.out + ".csv", curves, floor)
    plot(args.out + ".png", curves, chain, args.window,
         f"tiny GPT, Markov chain over {args.vocab} tokens, {meshfuse.world_size()} rank(s)")
    final = smooth(curves["meshfuse"], args.window)[-1]
    print(f"final loss (mean of the last {args.window} steps) {final:.4f}: {final - floor:+.4f} nats above the "
          f"entropy rate {floor:.4f} (started at {curves['meshfuse'][0]:.4f}); wrote {args.out}.csv, {args.out}.png")
    if args.torch:
        compare(curves, weights, args.steps)
    if args.max_gap is not None and final - floor > args.max_gap:
        print(f"FAILED: the loss is {final - floor:.4f} nats above the floor (allowed {args.max_gap})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
