#!/usr/bin/env bash
# `meshfuse run --check` passes sharded programs whose only difference from single-device
# execution is summation order, and prints the tolerance it used.
# (That wrong programs fail: ReferenceComparison.* unit tests.)
# Usage: run_check_tolerance.sh MPIRUN MESHFUSE SOURCE_DIR
set -uo pipefail
mpirun=("$1" --oversubscribe)
meshfuse=$2 src=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NP ARGS...
  local np=$1
  shift
  local out code
  out=$(timeout 120 "${mpirun[@]}" -np "$np" "$meshfuse" run --check "$@" 2>&1)
  code=$?
  if [ $code -ne 0 ] || ! grep -q "^check passed" <<<"$out" ||
    ! grep -q "allowed per element 16 eps x (max|ref| + |ref|)" <<<"$out"; then
    echo "FAIL (exit $code): -np $np $*"
    echo "$out" | tail -n 8
    failures=$((failures + 1))
  else
    echo "ok   -np $np $*: $(grep 'vs single device' <<<"$out" | head -1)"
  fi
}
check 4 --seed 1 "$src/examples/decoder_layer.mf"
check 4 --overlap=collective --chunks=2 "$src/examples/decoder_layer.mf"
check 2 --size t=64 --overlap=ring --chunks=4 "$src/examples/sp_mlp.mf"
# bf16 tensor parallelism: partial sums are rounded to bf16 before the allreduce.
cat >"$tmp/bf16_tp.mf" <<'MF'
fusion {
  mesh @tp = [0, 1, 2, 3]
  %inp = input bf16[?t, 64] @tp {}
  %up_w = input bf16[256, 64] @tp {split(0, 4), parallelize(0, DIDx)}
  %down_w = input bf16[64, 256] @tp {split(1, 4), parallelize(1, DIDx)}
  %up = linear(%inp, %up_w)
  %act = gelu(%up, approximate="tanh")
  %out = linear(%act, %down_w)
  output %out
}
MF
check 4 --size t=128 "$tmp/bf16_tp.mf"
# Sequence parallelism with the first GEMM scheduled in four Stream chunks.
cat >"$tmp/sched.mf" <<'MF'
fusion {
  mesh @sp = [0, 1]
  %inp = input f32[?t, 64] @sp {split(0, 2), parallelize(0, DIDx)}
  %up_w = input f32[256, 64] @sp {split(0, 2), parallelize(0, DIDx)}
  %down_w = input f32[64, 256] @sp {split(1, 2), parallelize(1, DIDx)}
  %up = linear(%inp, %up_w) : f32[?t, 256, r64] {split(0, 4), parallelize(0, Stream)}
  %act = gelu(%up, approximate="tanh")
  %out = linear(%act, %down_w)
  output %out
}
MF
check 2 --size t=64 "$tmp/sched.mf"
[ $failures -eq 0 ] || exit 1
echo "every --check passed"
