#!/usr/bin/env bash
# A collective whose peer never arrives is aborted by the watchdog (MESHFUSE_COMM_TIMEOUT)
# instead of hanging. Usage: watchdog_aborts_a_hung_collective.sh MPIRUN WATCHDOG_PROBE
set -uo pipefail
mpirun=$1 probe=$2
out=$(MESHFUSE_COMM_TIMEOUT=2 timeout 60 $mpirun --oversubscribe -np 2 "$probe" 2>&1)
code=$?
echo "$out" | tail -n 8
[ $code -ne 0 ] && [ $code -ne 124 ] || { echo "FAIL: exit code $code"; exit 1; }
echo "$out" | grep -q "allreduce on team \[0, 1\] did not complete within 2 s" || { echo "FAIL: no watchdog message"; exit 1; }
echo "OK: the watchdog aborted the hung collective"
