#!/usr/bin/env bash
# `meshfuse dump --stage=backward` (both fusions read back: print -> parse -> print) and
# `meshfuse grad-check` (exit 0 on the examples, 1 with a message when a gradient misses).
# Usage: cli_autodiff.sh MESHFUSE SOURCE_DIR
set -uo pipefail
meshfuse=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

for mf in mlp_block.mf tp_mlp.mf decoder_layer.mf; do
  if ! "$meshfuse" dump --stage=backward "$src/examples/$mf" >"$dir/bwd.mf" 2>"$dir/err"; then
    fail "dump --stage=backward $mf: $(cat "$dir/err")"
    continue
  fi
  # Comments dropped, the two fusions must read back identically.
  grep -v '^#' "$dir/bwd.mf" | grep -v '^$' >"$dir/bwd_nocomments"
  if ! "$meshfuse" print --split-input-file "$dir/bwd.mf" >"$dir/printed" 2>"$dir/err"; then
    fail "round-trip $mf: $(cat "$dir/err")"
  elif ! diff <(grep -v '^#' "$dir/printed") "$dir/bwd_nocomments" >"$dir/diff"; then
    fail "round-trip $mf differs: $(head -20 "$dir/diff")"
  else
    echo "ok   round-trip of dump --stage=backward $mf"
  fi
done
grep -q "GEMM output (linear)" <("$meshfuse" dump --stage=backward "$src/examples/mlp_block.mf" --wrt up_w) ||
  fail "the policy's saves are not in the dump"

if out=$("$meshfuse" grad-check "$src/examples/mlp_block.mf" --size t=3 --wrt up_b,down_b,inp 2>&1); then
  echo "ok   grad-check mlp_block.mf: $out"
else
  fail "grad-check mlp_block.mf: $out"
fi
# The decoder layer (layer norms, causal sdpa through reshapes/permutes, the MLP).
if out=$("$meshfuse" grad-check "$src/examples/decoder_layer.mf" --wrt ln1_w,ln2_b 2>&1); then
  echo "ok   grad-check decoder_layer.mf: $out"
else
  fail "grad-check decoder_layer.mf: $out"
fi
# A tolerance no derivative meets: exit 1 and say so.
out=$("$meshfuse" grad-check "$src/examples/mlp_block.mf" --size t=2 --wrt down_b --tolerance 0 --step 0.5 2>&1)
code=$?
if [ $code -ne 1 ] || ! grep -q "FAILED" <<<"$out"; then fail "grad-check above tolerance: status $code: $out"; else echo "ok   grad-check fails above the tolerance"; fi
out=$("$meshfuse" grad-check "$src/examples/mlp_block.mf" --wrt nope 2>&1)
code=$?
if [ $code -ne 1 ] || ! grep -q "NameError: --wrt: no input named 'nope'" <<<"$out"; then fail "unknown --wrt: $code $out"; else echo "ok   unknown --wrt"; fi
for sub in grad-check dump; do
  "$meshfuse" $sub --help | grep -q -- "--wrt" || fail "$sub --help lacks --wrt"
done
exit $((failures > 0))
