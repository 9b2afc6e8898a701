"""Seed 003's Ulysses example, written once for one device: x [batch 1, sequence 4096, hidden 512]
in f16, viewed as 8 heads, self-attention, viewed back. The seed shards the sequence by hand,
calls all_to_all before and after attention and all-gathers at the end; here x is placed
Shard(1) (the sequence), the output pinned Replicate (the seed's all_gather), and meshfuse derives
the program: one all-to-all into a split of the heads (q, k and v are the same tensor, moved
once), attention on whole sequences, and one allgather of the heads' results (the seed's second
all_to_all and its all_gather in one collective). f16 in, f16 out; attention computes in f32
(docs/kernels.md).

    python examples/python/ulysses_seed003.py             # relaunches itself on 2 ranks
    python examples/python/ulysses_seed003.py --ranks 4   # or 4 (the heads must divide)

It checks the result against the same definition run on one device (rank 0's) and against
torch's scaled_dot_product_attention in f32.
"""

import argparse

import numpy as np

import meshfuse
from meshfuse import DataType, DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

BATCH, SEQ, HIDDEN, HEADS = 1, 4096, 512, 8


def define_ulysses(seq: int = SEQ, hidden: int = HIDDEN, heads: int = HEADS, pin=None):
    """The seed's single-device code as a definition; `pin`: (mesh, placements) for the output."""

    def define(fd):
        x = fd.define_tensor([BATCH, seq, hidden], DataType.Half)
        xh = fd.ops.permute(fd.ops.reshape(x, [BATCH, seq, heads, hidden // heads]), [0, 2, 1, 3])  # BSND -> BNSD
        out = fd.ops.sdpa(xh, xh, xh)
        y = fd.ops.reshape(fd.ops.permute(out, [0, 2, 1, 3]), [BATCH, seq, hidden])
        fd.add_output(y)
        if pin is not None:  # the output's placement (the seed all-gathers: Replicate)
            y.set_device_mesh(pin)

    return define


def torch_reference(x, heads: int = HEADS):
    import torch
    import torch.nn.functional as F

    b, s, h = x.shape
    t = torch.tensor(x, dtype=torch.float32).reshape(b, s, heads, h // heads).transpose(1, 2)
    # One head at a time: torch may materialize the [s, s] scores.
    out = torch.cat([F.scaled_dot_product_attention(t[:, i:i + 1], t[:, i:i + 1], t[:, i:i + 1]) for i in range(heads)],
                    dim=1)
    return out.transpose(1, 2).reshape(b, s, h).numpy()


def main():
    from common import check, report

    n = meshfuse.world_size()
    x = np.random.default_rng(0).standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float16)
    mesh = DeviceMesh(range(n))

    sharded = FusionDefinitionWrapper(define_ulysses(pin=mesh))
    inputs = [distribute_tensor(x, mesh, [Shard(1)])]
    report(sharded.plan(inputs))
    (out,) = sharded(inputs)
    assert out.placements == (Replicate(),), out.placements
    got = out.full_tensor()
    assert got.dtype == np.float16

    # The same definition on one device (rank 0 alone), then torch in f32.
    single = FusionDefinitionWrapper(define_ulysses())
    (ref,) = single([distribute_tensor(x, DeviceMesh([0]), [Replicate()])])
    if meshfuse.rank() == 0:  # the only rank that holds the one-device result
        np.testing.assert_array_equal(got, ref.full_tensor())  # each head's attention is the same kernel run
        print(f"Ulysses example: Shard(1) on {n} ranks equals one device bit for bit", flush=True)
        check("seed 003 Ulysses example (f16)", got.astype(np.float32), torch_reference(x), tol=2e-3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks to relaunch on when not under mpirun")
    from meshfuse.launch import ensure_ranks

    ensure_ranks(parser.parse_args().ranks)
    main()
