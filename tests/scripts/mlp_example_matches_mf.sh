#!/usr/bin/env bash
# The C++ API example (examples/mlp_block.cpp) and the .mf demo (examples/mlp_block.mf) are the
# same GPT-style MLP block: the example prints exactly what `meshfuse print` prints for the file,
# and its result equals `meshfuse run --reference` of the file (same seeded inputs) bit for bit.
# Usage: mlp_example_matches_mf.sh MLP_EXAMPLE MESHFUSE SOURCE_DIR
set -uo pipefail
example=$1 meshfuse=$2 src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$example" 32 "$dir/example.npy" >"$dir/example.txt" || fail "mlp_example exited with $?"
cat "$dir/example.txt"
"$meshfuse" print "$src/examples/mlp_block.mf" >"$dir/mf.txt" || fail "meshfuse print failed"
# The example's fusion: its lines up to the closing brace.
sed -n '1,/^}$/p' "$dir/example.txt" >"$dir/example_fusion.txt"
diff "$dir/example_fusion.txt" "$dir/mf.txt" || fail "the C++-built fusion differs from examples/mlp_block.mf (above)"
grep -qx 'output %out: f32\[32, 64\]  sum -\{0,1\}[0-9.]*' "$dir/example.txt" || fail "no output line for %out [32, 64]"

"$meshfuse" run --reference "$src/examples/mlp_block.mf" --size t=32 --save-outputs "$dir/cli" >/dev/null ||
  fail "meshfuse run failed"
cmp "$dir/example.npy" "$dir/cli/output0.npy" || fail "mlp_example and meshfuse run computed different outputs"
echo "OK: mlp_example builds examples/mlp_block.mf's fusion and computes the same output"
