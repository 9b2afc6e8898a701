"""examples/python/train_tiny_gpt.py: the Markov chain's stationary distribution and entropy rate;
50 AdamW steps of the tiny GPT with meshfuse against the same model, initial weights, batches and
optimizer in PyTorch (torch.autograd + torch.optim.AdamW): the same loss curve and final weights;
the command itself (plain progress lines when not on a terminal, a tqdm bar when it is, the CSV
and the PNG)."""

import csv
import io
import math
import os
import sys

import numpy as np
import pytest

import meshfuse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import train_tiny_gpt as T  # noqa: E402

# The acceptance run: small enough for CI (a few seconds, mostly compiling the three programs).
CONFIG = T.Config(vocab=16, seq=8, batch=4, hidden=16, heads=2)
STEPS = 50
# Tolerances (20x what was measured: the largest relative loss difference over the 50 steps was
# 2.4e-7, the largest weight difference 9.5e-7): f32 kernels that sum in another order than
# torch's, carried through 50 AdamW updates.
LOSS_RTOL, WEIGHT_ATOL = 5e-6, 2e-5


def test_stationary_distribution_and_entropy_rate():
    chain = T.markov_chain(8, seed=3, concentration=0.5)
    p, pi = chain.transitions, chain.stationary
    np.testing.assert_allclose(pi @ p, pi, atol=1e-12)
    assert abs(pi.sum() - 1) < 1e-12 and (pi > 0).all()
    # The entropy rate against the empirical conditional entropy of a long sampled stream.
    stream = T.sample_stream(chain, 50_000, seed=4)
    counts = np.zeros_like(p)
    np.add.at(counts, (stream[:-1], stream[1:]), 1)
    rows = counts.sum(1, keepdims=True)
    empirical = -np.sum(counts * np.log(np.where(counts > 0, counts / rows, 1.0))) / counts.sum()
    assert abs(empirical - chain.entropy_rate) < 0.02, (empirical, chain.entropy_rate)
    assert chain.entropy_rate < chain.unigram_entropy < math.log(8)
    # A deterministic chain (one cycle) has entropy rate 0; a uniform one log V.
    cycle = np.roll(np.eye(4), 1, axis=1)
    assert T.MarkovChain(cycle, T.stationary_distribution(cycle)).entropy_rate == 0
    uniform = np.full((4, 4), 0.25)
    assert abs(T.MarkovChain(uniform, T.stationary_distribution(uniform)).entropy_rate - math.log(4)) < 1e-12


@pytest.mark.world(1)  # the single-rank acceptance run; tests/python/test_training.py trains sharded
def test_fifty_adamw_steps_match_pytorch():
    """Single rank (the acceptance test of issue 16): same initial weights, batches and AdamW."""
    import torch

    torch.set_num_threads(1)
    chain = T.markov_chain(CONFIG.vocab, seed=0)
    data = T.batches(T.sample_stream(chain, 5_000, seed=1), CONFIG, STEPS, seed=2)
    params = T.init_params(CONFIG, seed=0)
    opt = T.AdamWConfig(lr=1e-2, weight_decay=0.01)
    ours, our_weights = T.train_meshfuse(CONFIG, params, data, opt)
    theirs, their_weights = T.train_torch(CONFIG, params, data, opt)
    np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL, atol=0)
    for name in params:
        np.testing.assert_allclose(our_weights[name], their_weights[name], rtol=0, atol=WEIGHT_ATOL, err_msg=name)
        assert not np.allclose(our_weights[name], params[name], rtol=0, atol=1e-3), f"{name} did not train"
    assert ours[-1] < ours[0] - 0.4  # it learns: log 16 = 2.77 at the start


@pytest.mark.world(1, 2)
def test_command_writes_the_curve_and_prints_plain_lines(tmp_path, capsys):
    """The command (data parallel on 2 ranks), with --torch, and --max-gap making "approaches the
    floor" an exit status: 3 steps are far from it."""
    out = str(tmp_path / "curve")
    status = T.main(["--steps", "3", "--batch", "4", "--seq", "8", "--hidden", "16", "--stream", "2000",
                     "--out", out, "--torch", "--max-gap", "0.05"])
    if meshfuse.rank() != 0:
        assert status == 0
        return
    assert status == 1
    text = capsys.readouterr().out
    assert "Markov chain over 16 tokens: entropy rate H = " in text
    for name in ("meshfuse", "torch"):
        assert f"{name} step 3/3  loss " in text  # stderr is not a terminal here: plain lines, no bar
    assert "meshfuse vs torch over 3 steps: largest relative loss difference" in text
    assert "FAILED: the loss is " in text and "nats above the floor (allowed 0.05)" in text
    rows = list(csv.reader(open(out + ".csv")))
    assert rows[0] == ["step", "meshfuse_loss", "torch_loss", "entropy_rate"] and len(rows) == 4
    assert open(out + ".png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_on_a_terminal(monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    p = T.Progress(2, "meshfuse", floor=1.5)
    p(0, 2.25)
    p(1, 2.0)
    p.close()
    assert "meshfuse step 2/2  loss 2.0000  (floor 1.5000)" in capsys.readouterr().out  # a line per step
    bar = term.getvalue()
    assert "2/2" in bar and "gap=+0.5000, loss=2.0000" in bar  # tqdm's bar, with the gap to the floor
