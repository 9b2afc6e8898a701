"""Partial values (pending sums) meeting Python scalars and replicated tensors: the result must be
that of the summed value (numpy is the oracle). A linear op (scaling, negation) may stay Partial;
anything else, adding a scalar included, needs the sum first, or each rank's share of the
scalar is counted once per rank."""

import numpy as np
import pytest

from meshfuse import Partial, Replicate, Shard

import helpers as H

R, S = Replicate(), Shard

def partial_case(name, build, oracle, marks=()):
    return pytest.param(build, oracle, id=name, marks=marks)


@pytest.mark.parametrize("build,oracle", [
    partial_case("x + 1", lambda fd, x: x + 1, lambda x: x + 1),
    partial_case("1 + x", lambda fd, x: 1 + x, lambda x: 1 + x),
    partial_case("add(x, 1.0)", lambda fd, x: fd.ops.add(x, 1.0), lambda x: x + 1),
    partial_case("x - 1", lambda fd, x: x - 1, lambda x: x - 1),
    partial_case("1 - x", lambda fd, x: 1 - x, lambda x: 1 - x),
    partial_case("2 / x", lambda fd, x: 2 / x, lambda x: 2 / x),
    partial_case("x * 3", lambda fd, x: x * 3, lambda x: x * 3),
    partial_case("x / 2", lambda fd, x: x / 2, lambda x: x / 2),
    partial_case("-x", lambda fd, x: -x, lambda x: -x),
    partial_case("x ** 2", lambda fd, x: x ** 2, lambda x: x ** 2),
    partial_case("maximum(x, 0)", lambda fd, x: fd.ops.maximum(x, 0.0), lambda x: np.maximum(x, 0)),
])
def test_a_partial_input_with_a_scalar(build, oracle):
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)  # nonzero: 2 / x is defined
    (out,), _, _ = H.run(lambda fd: fd.add_output(build(fd, fd.define_tensor([2, 3]))), [x], [[Partial()]])
    H.assert_close(out, oracle(x.astype(np.float64)))


@pytest.mark.parametrize("build,oracle", [
    partial_case("y / x", lambda x, y: y / x, lambda x, y: y / x),
    partial_case("x / y", lambda x, y: x / y, lambda x, y: x / y),
    partial_case("y - x", lambda x, y: y - x, lambda x, y: y - x),
])
def test_a_partial_input_with_a_replicated_one(build, oracle):
    x, y = np.arange(1, 7, dtype=np.float32).reshape(2, 3), np.full((2, 3), 6, dtype=np.float32)
    (out,), _, _ = H.run(lambda fd: fd.add_output(build(fd.define_tensor([2, 3]), fd.define_tensor([2, 3]))), [x, y],
                         [[Partial()], [R]])
    H.assert_close(out, oracle(x.astype(np.float64), y))


@pytest.mark.parametrize("build,oracle", [
    partial_case("linear + 1.0", lambda fd, y: y + 1.0, lambda y: y + 1.0),
    partial_case("gelu(linear - 0.5)", lambda fd, y: fd.ops.gelu(y - 0.5), lambda y: H.gelu(y - 0.5)),
    partial_case("linear * 2.0", lambda fd, y: y * 2.0, lambda y: y * 2.0),
])
def test_a_row_parallel_linear_then_a_scalar(build, oracle, rng):
    """linear(x Shard(1), w Shard(1)) contracts the sharded dim: its result is a Partial sum."""
    x, w = H.randn(rng, 8, 16), H.randn(rng, 4, 16)

    def define(fd):
        fd.add_output(build(fd, fd.ops.linear(fd.define_tensor([8, 16]), fd.define_tensor([4, 16]))))

    (out,), plan, _ = H.run(define, [x, w], [[S(1)], [S(1)]])
    H.assert_close(out, oracle(x.astype(np.float64) @ w.T))
    assert H.kinds(plan) == H.expect(["allreduce"])


def test_a_replicated_value_added_to_a_pending_sum_stays_pending_through_a_sum(rng):
    """(x Partial + r Replicate).sum(1): the plan search makes r a pending sum locally (rank 0 keeps
    it, the others hold zeros, as DTensor's redistribute to Partial does), so one allreduce of the
    [8] result serves, not one of the [8, 16] x (placement fuzzer, s1-w2-c98)."""
    x, r = H.randn(rng, 8, 16), H.randn(rng, 8, 16)

    def define(fd):
        fd.add_output(fd.ops.sum(fd.define_tensor([8, 16]) + fd.define_tensor([8, 16]), [1]))

    (out,), plan, _ = H.run(define, [x, r], [[Partial()], [R]])
    H.assert_close(out, (x.astype(np.float64) + r).sum(1))
    assert H.kinds(plan) == H.expect(["allreduce"])
    assert [c.bytes for c in plan.collectives()] == H.expect([8 * 4])
