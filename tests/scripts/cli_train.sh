#!/usr/bin/env bash
# `meshfuse train`: a progress line per step and a falling loss on one device; the same losses
# tensor-parallel on 2 ranks (examples/train_tp_mlp.mf is examples/train_mlp.mf with Megatron
# placements, so the seeded data is the same); --help; a bad --wrt is a typed error.
# Usage: cli_train.sh MPIRUN MESHFUSE SOURCE_DIR
set -uo pipefail
mpirun=$1
meshfuse=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
args=(--size t=32 --steps 8 --wrt up_w,down_w --lr 0.01)

if ! "$meshfuse" train "$src/examples/train_mlp.mf" "${args[@]}" >"$dir/one" 2>&1; then
  fail "train on one device: $(cat "$dir/one")"
fi
[[ $(grep -c '^step [0-9]*/8  loss ' "$dir/one") == 8 ]] || fail "expected 8 progress lines: $(cat "$dir/one")"
first=$(grep '^step 1/8' "$dir/one" | awk '{print $4}')
last=$(grep '^step 8/8' "$dir/one" | awk '{print $4}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"

if ! "$mpirun" --oversubscribe -np 2 "$meshfuse" train "$src/examples/train_tp_mlp.mf" "${args[@]}" >"$dir/two" 2>&1; then
  fail "train on 2 ranks: $(cat "$dir/two")"
fi
paste <(grep '^step' "$dir/one" | awk '{print $4}') <(grep '^step' "$dir/two" | awk '{print $4}') >"$dir/pairs"
[[ $(wc -l <"$dir/pairs") == 8 ]] || fail "2 ranks: expected 8 progress lines: $(cat "$dir/two")"
awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1) + 1e-7) { print; bad = 1 } } END { exit bad }' \
  "$dir/pairs" || fail "2 ranks' losses differ from one device's: $(cat "$dir/pairs")"

"$meshfuse" train --help >"$dir/help" 2>&1
grep -q -- "--optimizer" "$dir/help" && grep -q "progress\|loss per step" "$dir/help" || fail "train --help: $(cat "$dir/help")"

"$meshfuse" train "$src/examples/train_mlp.mf" --size t=4 --wrt nope >"$dir/err" 2>&1 && fail "--wrt nope was accepted"
grep -q "NameError: --wrt: no input named 'nope'" "$dir/err" || fail "--wrt nope: $(cat "$dir/err")"

[[ $failures == 0 ]] && echo "cli_train: all passed"
exit $((failures > 0))
