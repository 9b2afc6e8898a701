#!/usr/bin/env bash
# The compile-time half of "every op has a gradient rule": src/autodiff/grad_rules.cpp compiled
# against a grad_rules.def that misses an op's line (or lists two ops out of order) must fail to
# compile with the static_assert's message, as adding an op to ops.def without a rule would.
# Usage: grad_rule_missing_fails_to_compile.sh CXX SOURCE_DIR
set -uo pipefail
cxx=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/meshfuse/ir"
failures=0

# compile DEF_FILE EXPECTED: grad_rules.cpp with DEF_FILE as meshfuse/ir/grad_rules.def.
compile() {
  cp "$1" "$dir/meshfuse/ir/grad_rules.def"
  local out
  out=$("$cxx" -std=gnu++20 -fsyntax-only -I "$dir" -I "$src/include" -I "$src/src" "$src/src/autodiff/grad_rules.cpp" 2>&1)
  local code=$?
  if [ -z "$2" ]; then
    [ $code -eq 0 ] && echo "ok   the complete list compiles" || { echo "FAIL the complete list: $out"; failures=$((failures + 1)); }
  elif [ $code -ne 0 ] && grep -qF "$2" <<<"$out"; then
    echo "ok   $3"
  else
    echo "FAIL $3: status $code, want an error containing '$2': $(grep -m3 error <<<"$out")"
    failures=$((failures + 1))
  fi
}

def="$src/include/meshfuse/ir/grad_rules.def"
compile "$def" "" "complete"
grep -v '^MESHFUSE_GRAD(Sdpa,' "$def" >"$dir/missing.def"
compile "$dir/missing.def" "an op of ops.def has no gradient rule" "a missing rule fails to compile"
# Swap the Add and Sub lines: same count, wrong order.
awk '/^MESHFUSE_GRAD\(Add,/{held=$0; next} {print} /^MESHFUSE_GRAD\(Sub,/{print held}' "$def" >"$dir/swapped.def"
compile "$dir/swapped.def" "grad_rules.def must list the ops of ops.def in the same order" "rules out of order fail to compile"
exit $((failures > 0))
