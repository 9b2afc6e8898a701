"""A DiT block (adaLN-modulated attention and MLP) with classifier-free guidance, written for one
device, run with CFG parallelism x Ulysses (or x ring attention) on a 2x2 mesh.

The definition is one guided denoising step as diffusers spells it: the latents are duplicated
(``cat([latents, latents])``) and run with the conditioning of both branches (``[null,
prompt]``) as one batch; the noise prediction is split back into its halves with slices
(``chunk(2)``) and combined, ``uncond + s * (cond - uncond)``. Nothing in it mentions devices.
Placed with the conditioning's batch ``Shard(0)`` on mesh axis 0 (the two branches: CFG) and the
latents' tokens ``Shard(1)`` on mesh axis 1 (the sequence: Ulysses), meshfuse derives the plan:
each rank of axis 0 runs one branch, attention moves q, k and v to a split of the heads by
all-to-all over axis 1, and the guidance combine all-gathers the prediction over axis 0. The
result is placed like the latents it updates (docs/parallelisms.md "CFG parallelism").

    python examples/python/dit_cfg.py             # relaunches itself on 4 ranks
    python examples/python/dit_cfg.py --cp ring   # ring attention inside each branch instead

(tests/python/test_cfg_parallel.py imports Config, init_params, inputs, define_dit and torch_dit.)
"""

import math
from dataclasses import dataclass

import numpy as np

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor


@dataclass(frozen=True)
class Config:
    batch: int = 1  # per guidance branch; the definition's batch is 2 * batch
    seq: int = 16
    hidden: int = 32
    heads: int = 4
    freq: int = 16  # size of the sinusoidal timestep features
    guidance: float = 4.0


PARAMS = ["t_w1", "t_b1", "t_w2", "t_b2", "ada_w", "ada_b", "wq", "wk", "wv", "wo", "up_w", "up_b", "down_w",
          "down_b", "out_w"]


def param_shapes(c: Config) -> dict:
    d = c.hidden
    shapes = [[d, c.freq], [d], [d, d], [d], [6 * d, d], [6 * d], [d, d], [d, d], [d, d], [d, d], [4 * d, d], [4 * d],
              [d, 4 * d], [d], [d, d]]
    return dict(zip(PARAMS, shapes))


def define_dit(c: Config):
    """Inputs: the parameters (param_shapes' order), then the latents x [B, S, D], their timestep
    features t_freq [B, freq] and the conditioning y [2B, D] (null embeddings, then the prompt's).
    Output: the guided noise prediction [B, S, D]."""
    b2, s, d, heads = 2 * c.batch, c.seq, c.hidden, c.heads
    e = d // heads

    def define(fd):
        p = {name: fd.define_tensor(shape, name=name) for name, shape in param_shapes(c).items()}
        latents = fd.define_tensor([c.batch, s, d], name="x")
        t_feat = fd.define_tensor([c.batch, c.freq], name="t_freq")
        y = fd.define_tensor([b2, d], name="y")
        ops = fd.ops
        # Both branches as one batch: the unconditional first.
        x = ops.cat([latents, latents], 0)
        t_freq = ops.cat([t_feat, t_feat], 0)

        # Timestep embedding (an MLP of the sinusoidal features) plus the conditioning: the adaLN
        # input, and from it shift/scale/gate for the attention and the MLP.
        temb = ops.linear(ops.silu(ops.linear(t_freq, p["t_w1"], p["t_b1"])), p["t_w2"], p["t_b2"])
        mod = ops.linear(ops.silu(ops.add(temb, y)), p["ada_w"], p["ada_b"])
        chunk = [ops.slice(mod, [0, i * d], [b2, (i + 1) * d]) for i in range(6)]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunk

        def per_token(t):  # [2B, D] -> [2B, 1, D], broadcast over the tokens
            return ops.broadcast_in_dim(t, [b2, 1, d], [0, 2])

        def modulate(h, shift, scale):  # layer_norm without affine, then adaLN
            return ops.add(ops.mul(ops.layer_norm(h), per_token(ops.add(scale, 1.0))), per_token(shift))

        def to_heads(t):  # [2B, S, D] -> [2B, heads, S, e]
            return ops.permute(ops.reshape(t, [b2, s, heads, e]), [0, 2, 1, 3])

        h = modulate(x, shift_msa, scale_msa)
        q, k, v = (to_heads(ops.linear(h, p[w])) for w in ("wq", "wk", "wv"))
        attn = ops.reshape(ops.permute(ops.sdpa(q, k, v), [0, 2, 1, 3]), [b2, s, d])
        x = ops.add(x, ops.mul(per_token(gate_msa), ops.linear(attn, p["wo"])))
        h = modulate(x, shift_mlp, scale_mlp)
        mlp = ops.linear(ops.gelu(ops.linear(h, p["up_w"], p["up_b"]), approximate="tanh"), p["down_w"], p["down_b"])
        x = ops.add(x, ops.mul(per_token(gate_mlp), mlp))
        eps = ops.linear(x, p["out_w"])  # the noise prediction of both branches

        # Classifier-free guidance: the first half of the batch is the unconditional branch.
        uncond = ops.slice(eps, [0, 0, 0], [c.batch, s, d])
        cond = ops.slice(eps, [c.batch, 0, 0], [b2, s, d])
        fd.add_output(ops.add(uncond, ops.mul(ops.sub(cond, uncond), c.guidance)))

    return define


def init_params(c: Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {name: ((rng.standard_normal(shape) / math.sqrt(shape[-1])) if len(shape) == 2 else
                   0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in param_shapes(c).items()}


def inputs(c: Config, seed: int = 1) -> tuple:
    """x, t_freq, y for one denoising step: the latents, their timestep's sinusoidal features, and
    the conditioning of both branches (the null embedding, zeros, then the prompt's)."""
    rng = np.random.default_rng(seed)
    latents = rng.standard_normal((c.batch, c.seq, c.hidden)).astype(np.float32)
    t = rng.uniform(0, 1000, size=c.batch)
    freqs = np.exp(-math.log(10000) * np.arange(c.freq // 2) / (c.freq // 2))
    t_freq = np.concatenate([np.cos(t[:, None] * freqs), np.sin(t[:, None] * freqs)], axis=1).astype(np.float32)
    prompt = rng.standard_normal((c.batch, c.hidden)).astype(np.float32)
    return latents, t_freq, np.concatenate([np.zeros_like(prompt), prompt])


def torch_dit(c: Config, p: dict, x, t_freq, y):
    """The same computation in PyTorch (p: torch tensors by name)."""
    import torch.nn.functional as F

    import torch

    b2, s, d = 2 * c.batch, c.seq, c.hidden
    x, t_freq = torch.cat([x, x]), torch.cat([t_freq, t_freq])
    temb = F.linear(F.silu(F.linear(t_freq, p["t_w1"], p["t_b1"])), p["t_w2"], p["t_b2"])
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
        F.linear(F.silu(temb + y), p["ada_w"], p["ada_b"]).unsqueeze(1).chunk(6, dim=2)

    def modulate(h, shift, scale):
        return F.layer_norm(h, (d,)) * (1 + scale) + shift

    h = modulate(x, shift_msa, scale_msa)
    q, k, v = (F.linear(h, p[w]).reshape(b2, s, c.heads, -1).transpose(1, 2) for w in ("wq", "wk", "wv"))
    attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b2, s, d)
    x = x + gate_msa * F.linear(attn, p["wo"])
    h = modulate(x, shift_mlp, scale_mlp)
    x = x + gate_mlp * F.linear(F.gelu(F.linear(h, p["up_w"], p["up_b"]), approximate="tanh"), p["down_w"],
                                p["down_b"])
    uncond, cond = F.linear(x, p["out_w"]).chunk(2)
    return uncond + c.guidance * (cond - uncond)


# CFG on mesh axis 0 (the branches: the conditioning's batch), Ulysses on mesh axis 1 (the
# latents' tokens).
CFG_X_ULYSSES = {"x": [Replicate(), Shard(1)], "t_freq": [Replicate(), Replicate()], "y": [Shard(0), Replicate()]}


def main():
    import argparse

    import torch

    from common import check, report

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", choices=["ulysses", "ring"], default="ulysses",
                        help="context parallelism over the sequence axis (default: %(default)s)")
    args = parser.parse_args()
    c = Config()
    params = init_params(c)
    data = dict(zip(["x", "t_freq", "y"], inputs(c)))
    mesh = DeviceMesh([[0, 1], [2, 3]])  # [cfg, sequence]
    placed = [distribute_tensor(a, mesh, [Replicate(), Replicate()]) for a in params.values()]
    placed += [distribute_tensor(a, mesh, CFG_X_ULYSSES[name]) for name, a in data.items()]
    fdw = FusionDefinitionWrapper(define_dit(c), cp=args.cp)
    report(fdw.plan(placed))
    (out,) = fdw(placed)
    f64 = {k: torch.tensor(v, dtype=torch.float64) for k, v in {**params, **data}.items()}
    want = torch_dit(c, f64, f64["x"], f64["t_freq"], f64["y"]).numpy()
    check(f"DiT block with CFG x {'Ulysses' if args.cp == 'ulysses' else 'ring attention'}", out.full_tensor(), want)


if __name__ == "__main__":
    from meshfuse.launch import ensure_ranks

    ensure_ranks(4)
    main()
