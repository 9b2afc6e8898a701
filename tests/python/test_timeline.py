"""Timelines of FusionDefinitionWrapper calls (trace=True), on however many ranks pytest runs."""
import json

import numpy as np
import pytest

import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Shard, distribute_tensor


def test_timeline_of_an_overlapped_call(tmp_path):
    """trace=True records this rank's tasks; write_trace gathers every rank's into Perfetto JSON."""

    def define(fd):
        x = fd.define_tensor([-1, 16])
        w = fd.define_tensor([32, 16])
        fd.add_output(fd.ops.linear(x, w))

    n = meshfuse.world_size()
    mesh = DeviceMesh(range(n))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8 * n, 16)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    fdw = FusionDefinitionWrapper(define, overlap="collective", trace=True)
    (out,) = fdw([distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(w, mesh, [Shard(0)])])
    np.testing.assert_allclose(out.full_tensor(), x @ w.T, rtol=1e-4, atol=1e-4)
    events = fdw.last_trace()
    assert any(e.kind == "compute" for e in events)
    assert all(e.end_us >= e.begin_us for e in events)
    if n > 1:
        assert any(e.kind == "communication" and e.stream != 0 for e in events), "collectives run beside compute"
    path = str(tmp_path / "trace.json") if meshfuse.rank() == 0 else "unused"
    fractions = fdw.write_trace(path)
    if meshfuse.rank() == 0:
        assert len(fractions) == n
        trace = json.load(open(path))
        assert {e["pid"] for e in trace["traceEvents"]} == set(range(n))
    with pytest.raises(meshfuse.ValueError, match="create it with trace=True"):
        FusionDefinitionWrapper(define).last_trace()
