"""A tiny GPT's forward and loss as one meshfuse definition: token embedding plus learned
positions, two pre-norm decoder layers (causal attention, GELU MLP), a final layer norm, the LM
head and cross-entropy against the next tokens. value_and_grad gives the loss and the gradient of
every parameter; they are compared with the same model in PyTorch (torch.autograd).

    python examples/python/tiny_gpt.py        # one rank; under mpirun -np N: the batch Shard(0)

(tests/python/test_tiny_gpt.py imports define_tiny_gpt, init_params and torch_loss.)
"""

import math
from dataclasses import dataclass

import numpy as np

import meshfuse
from meshfuse import DataType, DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor


@dataclass(frozen=True)
class Config:
    vocab: int = 32
    seq: int = 8
    batch: int = 2
    hidden: int = 16
    heads: int = 2
    layers: int = 2


LAYER_PARAMS = ["ln1_w", "ln1_b", "wq", "wk", "wv", "wo", "ln2_w", "ln2_b", "up_w", "up_b", "down_w", "down_b"]


def layer_param_shapes(c: Config) -> dict:
    """One decoder layer's parameters (LAYER_PARAMS) and their shapes."""
    h = c.hidden
    return dict(zip(LAYER_PARAMS, [[h], [h], [h, h], [h, h], [h, h], [h, h], [h], [h], [4 * h, h], [4 * h], [h, 4 * h],
                                   [h]]))


def param_shapes(c: Config) -> dict:
    h = c.hidden
    shapes = {"wte": [c.vocab, h], "wpe": [c.seq, h]}
    for layer in range(c.layers):
        shapes.update({f"l{layer}.{name}": shape for name, shape in layer_param_shapes(c).items()})
    shapes.update({"lnf_w": [h], "lnf_b": [h], "head": [c.vocab, h]})
    return shapes


def decoder_layer(ops, c: Config, x, w: dict):
    """One pre-norm decoder layer on x [batch, seq, hidden] (w: LAYER_PARAMS by name): causal
    multi-head attention and a GELU MLP, each added to the residual."""
    b, s, h, heads = c.batch, c.seq, c.hidden, c.heads

    def to_heads(t):  # [b, s, h] -> [b, heads, s, e]
        return ops.permute(ops.reshape(t, [b, s, heads, h // heads]), [0, 2, 1, 3])

    a = ops.layer_norm(x, w["ln1_w"], w["ln1_b"])
    q, k, v = (to_heads(ops.linear(a, w[n])) for n in ("wq", "wk", "wv"))
    attn = ops.reshape(ops.permute(ops.sdpa(q, k, v, is_causal=True), [0, 2, 1, 3]), [b, s, h])
    x = ops.add(x, ops.linear(attn, w["wo"]))
    m = ops.gelu(ops.linear(ops.layer_norm(x, w["ln2_w"], w["ln2_b"]), w["up_w"], w["up_b"]), approximate="tanh")
    return ops.add(x, ops.linear(m, w["down_w"], w["down_b"]))


def define_tiny_gpt(c: Config):
    """The definition: inputs are the parameters (in param_shapes' order), then the tokens and
    the targets (i64 [batch, seq]); the output is the mean cross-entropy."""
    b, s, h = c.batch, c.seq, c.hidden

    def define(fd):
        p = {name: fd.define_tensor(shape, name=name.replace(".", "_")) for name, shape in param_shapes(c).items()}
        tokens = fd.define_tensor([b, s], DataType.Int64, name="tokens")
        targets = fd.define_tensor([b, s], DataType.Int64, name="targets")
        ops = fd.ops
        x = ops.add(ops.embedding(p["wte"], tokens), ops.broadcast_in_dim(p["wpe"], [1, s, h], [1, 2]))
        for layer in range(c.layers):
            x = decoder_layer(ops, c, x, {n: p[f"l{layer}.{n}"] for n in LAYER_PARAMS})
        logits = ops.linear(ops.layer_norm(x, p["lnf_w"], p["lnf_b"]), p["head"])
        fd.add_output(ops.cross_entropy(ops.reshape(logits, [b * s, c.vocab]), ops.reshape(targets, [b * s])))

    return define


def init_params(c: Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(c).items():
        if name.endswith(("_w",)) and len(shape) == 1:
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)  # norm weights near 1
        elif len(shape) == 1:
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
    return out


def batch(c: Config, seed: int = 1):
    """A token stream and its next tokens (the last target of each row ignored: -100)."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, c.vocab, size=(c.batch, c.seq + 1))
    tokens, targets = stream[:, :-1].astype(np.int64), stream[:, 1:].astype(np.int64)
    targets[:, -1] = -100
    return tokens, targets


def torch_decoder_layer(c: Config, x, w: dict):
    """decoder_layer in PyTorch (w: torch tensors by name)."""
    import torch.nn.functional as F

    b, s, h, heads = c.batch, c.seq, c.hidden, c.heads
    a = F.layer_norm(x, (h,), w["ln1_w"], w["ln1_b"])
    q, k, v = (F.linear(a, w[n]).reshape(b, s, heads, h // heads).transpose(1, 2) for n in ("wq", "wk", "wv"))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
    x = x + F.linear(attn, w["wo"])
    m = F.gelu(F.linear(F.layer_norm(x, (h,), w["ln2_w"], w["ln2_b"]), w["up_w"], w["up_b"]), approximate="tanh")
    return x + F.linear(m, w["down_w"], w["down_b"])


def torch_loss(c: Config, params: dict, tokens, targets):
    """The same model in PyTorch (params: torch tensors by name)."""
    import torch.nn.functional as F

    b, s, h = c.batch, c.seq, c.hidden
    x = F.embedding(tokens, params["wte"]) + params["wpe"]
    for layer in range(c.layers):
        x = torch_decoder_layer(c, x, {n: params[f"l{layer}.{n}"] for n in LAYER_PARAMS})
    logits = F.linear(F.layer_norm(x, (h,), params["lnf_w"], params["lnf_b"]), params["head"])
    return F.cross_entropy(logits.reshape(b * s, c.vocab), targets.reshape(b * s))


def main():
    import torch

    n = meshfuse.world_size()
    c = Config(batch=2 * n)
    params = init_params(c)
    tokens, targets = batch(c)
    mesh = DeviceMesh(range(n))
    inputs = [distribute_tensor(a, mesh, [Replicate()]) for a in params.values()]
    inputs += [distribute_tensor(a, mesh, [Shard(0)]) for a in (tokens, targets)]  # the batch: data parallel
    fdw = FusionDefinitionWrapper(define_tiny_gpt(c))
    (loss,), grads = fdw.value_and_grad(inputs, list(range(len(params))))

    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    want = torch_loss(c, tp, torch.tensor(tokens), torch.tensor(targets))
    want.backward()
    loss = float(np.asarray(loss.full_tensor()))
    worst = max(float(np.max(np.abs(np.asarray(g.full_tensor(), np.float64) - tp[k].grad.numpy())))
                for k, g in zip(params, grads))
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    assert worst < 1e-4, worst
    if meshfuse.rank() == 0:
        print(f"tiny GPT: loss {loss:.6f} (torch {want.item():.6f}), {len(grads)} parameter gradients match "
              f"torch.autograd on {n} rank(s) (max abs error {worst:.2e}) OK", flush=True)


if __name__ == "__main__":
    main()
