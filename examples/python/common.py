"""Shared by the examples: rank-ordered printing and the numpy check."""

import math

import numpy as np

import meshfuse


def print_in_rank_order(text: str) -> None:
    """Each rank prints its text in turn (rank 0 first), so that the outputs do not interleave."""
    for r in range(meshfuse.world_size()):
        meshfuse.barrier()
        if meshfuse.rank() == r:
            print(f"----- rank {r} -----\n{text}", flush=True)
    meshfuse.barrier()


def report(plan) -> None:
    collectives = "\n".join(f"  {c.kind} over mesh axis {c.mesh_axis}, team {c.team}, {c.bytes} bytes: "
                            f"{c.provenance}" for c in plan.collectives()) or "  (none)"
    print_in_rank_order(f"{plan.host_ir()}collectives:\n{collectives}\noutput placements: {plan.output_placements}")


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> None:
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if meshfuse.rank() == 0:
        err = float(np.max(np.abs(got - want)))
        print(f"{name}: matches numpy on {meshfuse.world_size()} ranks (max abs error {err:.2e}) OK", flush=True)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
