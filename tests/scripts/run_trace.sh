#!/usr/bin/env bash
# `meshfuse run --trace FILE` writes valid Chrome-trace JSON holding every rank's compute and
# communication events (of a warm run: a warm-up run goes first).
# Usage: run_trace.sh MPIRUN MESHFUSE SOURCE_DIR PYTHON
set -uo pipefail
mpirun=("$1" --oversubscribe)
meshfuse=$2 src=$3 python=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(timeout 120 "${mpirun[@]}" -np 2 "$meshfuse" run --check --trace "$tmp/trace.json" --overlap=ring --chunks=2 \
      --size t=64 "$src/examples/sp_mlp.mf" 2>&1)
code=$?
echo "$out" | grep -E "timeline|rank [01]:|check"
[ $code -eq 0 ] || { echo "FAIL: exit $code"; echo "$out" | tail; exit 1; }
grep -q "== timeline of every rank (a warm run, after one warm-up run) written to $tmp/trace.json" <<<"$out" ||
  { echo "FAIL: no timeline line"; exit 1; }
"$python" - "$tmp/trace.json" <<'PY' || exit 1
import json, sys
with open(sys.argv[1]) as f:
    trace = json.load(f)  # valid JSON, or this raises
events = trace["traceEvents"]
spans = [e for e in events if e.get("ph") == "X"]
assert spans, "no duration events"
for e in spans:
    assert e["name"] and e["cat"] in ("compute", "communication", "copy", "wait"), e
    assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["pid"] in (0, 1), e
for rank in (0, 1):
    cats = {e["cat"] for e in spans if e["pid"] == rank}
    assert {"compute", "communication"} <= cats, f"rank {rank} has only {cats}"
    names = [e for e in events if e.get("ph") == "M" and e["pid"] == rank and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == f"rank {rank}", names
print(f"OK: {len(spans)} events; both ranks have compute and communication events")
PY
