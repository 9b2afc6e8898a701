#!/usr/bin/env bash
# print -> parse -> print is the identity on every .mf file in the tree (except tests/lit/errors,
# and fuzz/regressions, which hold invalid programs on purpose: the fuzzers replay those). Usage: roundtrip_every_mf.sh MESHFUSE SOURCE_DIR
set -euo pipefail
meshfuse=$1
cd "$2"
checked=0
while IFS= read -r f; do
  first=$("$meshfuse" print --split-input-file "$f")
  second=$(printf '%s\n' "$first" | "$meshfuse" print --split-input-file -)
  if [ "$first" != "$second" ]; then
    echo "FAIL: $f does not round-trip:"
    diff <(printf '%s\n' "$first") <(printf '%s\n' "$second") || true
    exit 1
  fi
  checked=$((checked + 1))
done < <(find . -name '*.mf' -not -path './build*' -not -path './tests/lit/errors/*' -not -path './fuzz/regressions/*' | sort)
[ "$checked" -gt 0 ] || { echo "FAIL: no .mf files found"; exit 1; }
echo "$checked .mf files round-trip"
