"""A rank killed with SIGKILL while its peers are inside a collective, through Python: every rank
runs a tensor-parallel MLP (GEMMs, then an allreduce over all ranks) once to warm up, then again;
rank MESHFUSE_TEST_KILL_RANK does not join the second call: with --kill-self it sends itself
SIGKILL a moment after the others have gone into the call (they are then waiting in its
allreduce); without, the PMPI library kill_in_collective.c kills it right after it issued the
allreduce. The test (tests/scripts/killed_rank.sh) checks that the survivors exit, promptly,
with a message naming the dead rank.

    mpirun -np 4 python killed_rank_probe.py --kill-self    (MESHFUSE_TEST_KILL_RANK=3)
"""

import os
import signal
import sys
import time

import numpy as np

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

H = 32


def define(fd):
    x = fd.define_tensor([-1, H])
    up_w = fd.define_tensor([4 * H, H])
    down_w = fd.define_tensor([H, 4 * H])
    fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, up_w), approximate="tanh"), down_w))


def main():
    kill_self = "--kill-self" in sys.argv[1:]
    victim = int(os.environ["MESHFUSE_TEST_KILL_RANK"])
    rank, n = meshfuse.rank(), meshfuse.world_size()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(16, H), (4 * H, H), (H, 4 * H)]]
    mesh = DeviceMesh(list(range(n)))
    inputs = [distribute_tensor(a, mesh, [p]) for a, p in zip(arrays, [Replicate(), Shard(0), Shard(1)])]
    fdw = FusionDefinitionWrapper(define)
    if kill_self:
        fdw(inputs)  # warm: kernels compiled and the ranks agreed on the inputs
        meshfuse.barrier()
        if rank == victim:
            time.sleep(1)  # the others are in the call by now, waiting in its allreduce for this rank
            print(f"killed_rank_probe: rank {rank} sends itself SIGKILL while its peers wait in a collective",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    (out,) = fdw(inputs)
    print(f"rank {rank} finished: {out.to_local().shape}", flush=True)


if __name__ == "__main__":
    main()
