#!/usr/bin/env bash
# A rank that fails in the middle of a program run through the C++ API (MultiDeviceExecutor)
# makes every rank exit with its message within seconds, not when the watchdog fires.
# Usage: failing_rank_mid_program.sh MPIRUN FAILING_RANK_PROBE
set -uo pipefail
mpirun=$1 probe=$2
start=$(date +%s)
# The watchdog would only fire after 300 s: an exit well before that is the executor's doing.
out=$(MESHFUSE_COMM_TIMEOUT=300 timeout 120 $mpirun --oversubscribe -np 4 "$probe" 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | tail -n 8
echo "exit code $code after ${elapsed}s"
[ $code -ne 0 ] || { echo "FAIL: the run succeeded although rank 2 failed"; exit 1; }
[ $code -ne 124 ] || { echo "FAIL: the other ranks hung"; exit 1; }
[ $elapsed -le 60 ] || { echo "FAIL: took ${elapsed}s: the ranks waited instead of aborting"; exit 1; }
echo "$out" | grep -q "rank 2 of 4 fails: .*segment launch 2 fails on purpose" || { echo "FAIL: no message from rank 2"; exit 1; }
echo "$out" | grep -q "rank [0-3] \(finished\|caught\)" && { echo "FAIL: a rank finished a program whose allreduce lacked rank 2"; exit 1; }
echo "OK: every rank exited after rank 2 failed mid-program"
