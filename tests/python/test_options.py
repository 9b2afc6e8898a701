"""FusionDefinitionWrapper options: overlap= with chunks= and streams= (communication pipelined
with the GEMMs in chunks), and fsdp= (parameters gathered where used, one layer ahead). numpy is
the oracle; plan() shows the chunked or prefetched collectives (on one rank there are none)."""

import numpy as np
import pytest

import meshfuse
from meshfuse import FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

import helpers as H

R, S = Replicate(), Shard
H_ = 16


def mlp_arrays(rng):
    n = meshfuse.world_size()
    return [H.randn(rng, 8 * n, H_), H.randn(rng, 4 * H_, H_), H.randn(rng, H_, 4 * H_)]


def run(fdw, arrays, placements, mesh):
    inputs = [distribute_tensor(a, mesh, [p]) for a, p in zip(arrays, placements)]
    plan = fdw.plan(inputs)
    (out,) = fdw(inputs)
    H.assert_close(out.full_tensor(), H.mlp(*arrays))
    return plan, out


def lines_with(text, word):
    return [i for i, line in enumerate(text.splitlines()) if word in line]


@pytest.mark.parametrize("chunks", [0, 2, 4])
def test_collective_overlap_runs_each_collective_in_chunks(chunks, rng, world_mesh):
    """Sequence parallelism: the allgather before the first GEMM and the reduce-scatter after the
    second each become `chunks` smaller collectives (0: one per device) beside the GEMMs."""
    n = meshfuse.world_size()
    arrays = mlp_arrays(rng)
    fdw = FusionDefinitionWrapper(H.define_mlp(H_), overlap="collective", chunks=chunks)
    plan, out = run(fdw, arrays, [S(0), S(0), S(1)], world_mesh)
    assert out.placements == (S(0),)
    c = chunks or n
    assert H.kinds(plan) == H.expect(["allgather"] * c + ["reduce_scatter"] * c)
    gathers = [g.bytes for g in plan.collectives() if g.kind == "allgather"]
    assert gathers == H.expect([8 * H_ * 4 // c] * c)  # chunks of this rank's [8, 16] f32 block


def test_ring_overlap_moves_blocks_between_neighbours(rng, world_mesh):
    n = meshfuse.world_size()
    arrays = mlp_arrays(rng)
    plan, out = run(FusionDefinitionWrapper(H.define_mlp(H_), overlap="ring"), arrays, [S(0), S(0), S(1)], world_mesh)
    assert out.placements == (S(0),)
    # The allgather's ring and the reduce-scatter's: n - 1 steps each (one chunk per device).
    assert H.kinds(plan) == ["send_recv"] * (2 * (n - 1))


@pytest.mark.parametrize("streams", [1, 3])
def test_streams_sets_the_pool_the_chunks_run_on(streams, rng, world_mesh):
    """Tensor parallelism: the GEMM + allreduce pair runs as 4 chunks over `streams` streams."""
    arrays = mlp_arrays(rng)
    fdw = FusionDefinitionWrapper(H.define_mlp(H_), overlap="collective", chunks=4, streams=streams)
    plan, out = run(fdw, arrays, [R, S(0), S(1)], world_mesh)
    assert out.placements == (R,)
    assert H.kinds(plan) == H.expect(["allreduce"] * 4)
    if meshfuse.world_size() > 1:
        assert f"stream 1 + i % {streams}" in plan.host_ir()


@pytest.mark.parametrize("fsdp", [True, False], ids=["fsdp", "sequence_parallel"])
def test_fsdp_gathers_the_parameters_instead_of_the_activations(fsdp, rng, world_mesh):
    """Everything Shard(0): with fsdp each weight is all-gathered (on a communication stream, the
    second one before the first GEMM runs: prefetched one layer ahead) and the activations stay
    sharded; without it, the same placements move the activation instead."""
    arrays = mlp_arrays(rng)
    plan, out = run(FusionDefinitionWrapper(H.define_mlp(H_), fsdp=fsdp), arrays, [S(0)] * 3, world_mesh)
    if meshfuse.world_size() == 1:
        assert H.kinds(plan) == []
        return
    sources = [c.source for c in plan.collectives()]
    if fsdp:
        assert H.kinds(plan) == ["allgather", "allgather"] and sources == ["%1", "%2"]  # up_w, down_w
        assert out.placements == (S(0),)
        ir = plan.host_ir()
        first_gemm, gathers = lines_with(ir, "gemm")[0], lines_with(ir, "allgather")
        assert gathers[1] < first_gemm, ir
        assert all(ir.splitlines()[g - 1].strip() == "stream 1" for g in gathers), ir
    else:
        assert sources[0] == "%0"  # the input activation is gathered


def test_device_cpu_and_auto_run_where_they_say(rng, world_mesh):
    """device="cpu" runs on the CPU backend; "auto" picks CUDA only where a GPU is usable. Either
    way numpy arrays go in and come out (outputs in device memory are downloaded)."""
    arrays = mlp_arrays(rng)
    for device in ("cpu", "auto"):
        fdw = FusionDefinitionWrapper(H.define_mlp(H_), device=device)
        run(fdw, arrays, [R, S(0), S(1)], world_mesh)
        expected = "cuda" if device == "auto" and meshfuse.cuda_available() else "cpu"
        assert fdw.device == expected


def test_device_is_checked(rng, world_mesh):
    with pytest.raises(meshfuse.ValueError, match="device must be one of 'auto', 'cpu', 'cuda', got 'tpu'"):
        FusionDefinitionWrapper(H.define_mlp(H_), device="tpu")
    if meshfuse.cuda_available():
        return
    # Without a GPU, asking for one is an error on every rank (no rank is left waiting).
    fdw = FusionDefinitionWrapper(H.define_mlp(H_), device="cuda")
    with pytest.raises(meshfuse.RuntimeError, match="no CUDA device"):
        run(fdw, mlp_arrays(rng), [R, S(0), S(1)], world_mesh)


def test_compile_options_come_from_the_one_table():
    """meshfuse.compile_options() is the C++ table the CLI's flags come from too: names, types,
    choices and defaults, and FusionDefinitionWrapper's docstring lists them."""
    options = {o["name"]: o for o in meshfuse.compile_options()}
    assert list(options) == ["overlap", "chunks", "streams", "ring_groups", "fsdp", "plan", "cp"]
    assert options["overlap"]["type"] == "choice"
    assert options["overlap"]["choices"] == ["none", "collective", "ring"]
    assert options["overlap"]["default"] == "none"
    assert options["chunks"]["default"] == 0 and options["chunks"]["type"] == "count"
    assert options["fsdp"]["default"] is False and options["fsdp"]["type"] == "flag"
    for name in options:
        assert f"{name}=" in FusionDefinitionWrapper.__init__.__doc__


def test_unknown_compile_option_is_a_type_error_listing_the_options():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'overlapp' \(compile options: overlap, chunks"):
        FusionDefinitionWrapper(H.define_mlp(H_), overlapp="ring")


@pytest.mark.parametrize("kwargs, message", [
    (dict(overlap="zigzag"), "overlap algorithm 'zigzag': expected none, collective or ring"),
    (dict(streams=0), "streams '0': expected a whole number >= 1"),
    (dict(chunks=-1), "chunks '-1': expected a whole number >= 0"),
    (dict(cp="sideways"), "context parallelism 'sideways': expected auto"),
])
def test_bad_compile_option_values_are_value_errors_at_construction(kwargs, message):
    """Checked when the wrapper is made, before any definition runs, in the table's own words."""
    with pytest.raises(meshfuse.ValueError, match=message):
        FusionDefinitionWrapper(H.define_mlp(H_), **kwargs)
