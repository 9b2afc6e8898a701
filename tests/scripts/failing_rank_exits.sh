#!/usr/bin/env bash
# A rank that fails makes every other rank exit with an error instead of hanging.
# Usage: failing_rank_exits.sh MPIRUN MESHFUSE SOURCE_DIR  (ctest adds a hard timeout on top)
set -uo pipefail
mpirun=$1 meshfuse=$2 src=$3
start=$(date +%s)
out=$(timeout 60 $mpirun --oversubscribe -np 4 "$meshfuse" run --check "$src/tests/lit/hostir/tp_mlp.mf" --size t=16 \
      --inject-failure-on-rank 2 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | tail -n 12
echo "exit code $code after ${elapsed}s"
[ $code -ne 0 ] || { echo "FAIL: the run succeeded although rank 2 failed"; exit 1; }
[ $code -ne 124 ] || { echo "FAIL: the other ranks hung until the timeout"; exit 1; }
echo "$out" | grep -q "rank 2 of 4 fails: rank 2 fails on purpose" || { echo "FAIL: no message from rank 2"; exit 1; }
echo "$out" | grep -q "aborting every rank" || { echo "FAIL: no abort message"; exit 1; }
echo "OK: every rank exited after rank 2 failed"
