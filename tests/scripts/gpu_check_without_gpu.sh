#!/usr/bin/env bash
# scripts/gpu-check's logic where there is no GPU: the stage scripts parse (bash -n), a bad stage
# name prints the usage (exit 2), and every stage -- and `all` -- stops at once with exit 3 and
# "no CUDA device" (the driver's reason in OUT/device.txt), running nothing else. On a machine
# with a GPU this test is skipped (exit 77): there the stages run for real.
# Usage: gpu_check_without_gpu.sh SOURCE_DIR UNIT_TESTS CUDA_MPI_TESTS CUDA_BENCHMARKS
set -uo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
ln -s "$2" "$tmp/bin/meshfuse_unit_tests"
ln -s "$3" "$tmp/bin/meshfuse_cuda_mpi_tests"
ln -s "$4" "$tmp/bin/cuda_benchmarks"
if "$4" --describe >/dev/null 2>&1; then
  echo "a CUDA device is present: scripts/gpu-check runs for real here"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
bash -n "$src/scripts/gpu-check" || fail "scripts/gpu-check does not parse"
"$src/scripts/gpu-check" no-such-stage >"$tmp/usage" 2>&1
[ $? -eq 2 ] || fail "a bad stage name should exit 2"
grep -q "smoke" "$tmp/usage" || fail "the usage should list the stages: $(cat "$tmp/usage")"
for stage in smoke ops sanitize bench; do
  out=$tmp/out-$stage
  MESHFUSE_GPU_BIN=$tmp/bin "$src/scripts/gpu-check" "$stage" "$out" >"$tmp/$stage.log" 2>&1
  rc=$?
  [ $rc -eq 3 ] || fail "stage $stage: exit $rc, expected 3 (no CUDA device):"$'\n'"$(cat "$tmp/$stage.log")"
  grep -q "no CUDA device" "$tmp/$stage.log" || fail "stage $stage does not say 'no CUDA device': $(cat "$tmp/$stage.log")"
  grep -q "^no CUDA device: " "$out/device.txt" || fail "stage $stage: $out/device.txt lacks the reason"
  [ -f "$out/run.txt" ] || fail "stage $stage: no run.txt"
  # Nothing ran: no step logs, no JUnit of steps.
  [ -z "$(ls "$out"/*.log 2>/dev/null)" ] || fail "stage $stage ran steps without a device: $(ls "$out")"
done
MESHFUSE_GPU_BIN=$tmp/bin OUT=$tmp/out-all "$src/scripts/gpu-check" all >"$tmp/all.log" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "all: exit $rc, expected 3: $(cat "$tmp/all.log")"
[ -f "$tmp/out-all/smoke/device.txt" ] || fail "all: OUT/smoke/device.txt missing"
[ ! -e "$tmp/out-all/ops" ] || fail "all: went on to the ops stage without a device"
echo "every stage stops with 'no CUDA device' (exit 3): $(head -n 1 "$tmp/out-all/smoke/device.txt")"
