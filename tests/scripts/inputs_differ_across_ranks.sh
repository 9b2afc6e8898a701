#!/usr/bin/env bash
# Ranks given inputs that differ where they must agree (dtype, placement, global shape) fail with
# one message naming the input and which ranks had what, instead of entering different
# collectives. `meshfuse run` gives every rank the same inputs, so the last rank is started as its
# own app context (mpirun's MPMD syntax "A : B") with another program or another --size.
# Usage: inputs_differ_across_ranks.sh MPIRUN MESHFUSE NP
set -uo pipefail
mpirun=$1 meshfuse=$2 np=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
last=$((np - 1))
ranks=$(seq -s ', ' 0 $((np - 1)))
others=$(seq -s ', ' 0 $((np - 2)))
[ "$np" -eq 2 ] && others_text="rank $others" || others_text="ranks $others"
fail() { echo "FAIL: $*"; exit 1; }

mlp() {  # mlp DTYPE INPUT_SCHEDULE: the tensor-parallel MLP on all NP ranks
  cat <<MF
fusion {
  mesh @tp = [$ranks]
  %inp = input $1[?t, 64] @tp {$2}
  %up_w = input $1[256, 64] @tp {split(0, $np), parallelize(0, DIDx)}
  %down_w = input $1[64, 256] @tp {split(1, $np), parallelize(1, DIDx)}
  %up = linear(%inp, %up_w)
  %act = gelu(%up, approximate="tanh")
  %out = linear(%act, %down_w)
  output %out
}
MF
}
mlp f32 "" > "$dir/usual.mf"

expect() {  # expect WHAT ODD_MF ODD_SIZE DIFFERENCE
  local what=$1 odd=$2 size=$3 want=$4
  echo "--- the last rank has another $what"
  out=$(timeout 120 "$mpirun" --oversubscribe -np $((np - 1)) "$meshfuse" run "$dir/usual.mf" --size t=16 : \
        -np 1 "$meshfuse" run "$odd" --size "t=$size" 2>&1)
  code=$?
  grep -v "^$" <<<"$out" | head -n 4
  echo "exit code $code"
  [ $code -ne 0 ] && [ $code -ne 124 ] || fail "exit code $code (124: the ranks hung)"
  grep -qF "MultiDeviceExecutor: the ranks disagree: $want" <<<"$out" || fail "expected: $want"
  grep -q "== ran on" <<<"$out" && fail "the program ran"
  return 0
}

mlp bf16 "" > "$dir/bf16.mf"
expect dtype "$dir/bf16.mf" 16 "input 0 (%inp) dtype is bf16 on rank $last but f32 on $others_text"
mlp f32 "split(0, $np), parallelize(0, DIDx)" > "$dir/sharded.mf"
expect placement "$dir/sharded.mf" 16 \
  "input 0 (%inp) placements is [Shard(0)] on mesh [$ranks] on rank $last but [Replicate()] on mesh [$ranks] on $others_text"
expect "global shape" "$dir/usual.mf" 8 "input 0 (%inp) global shape is [8, 64] on rank $last but [16, 64] on $others_text"
echo "OK: every disagreement was named"
