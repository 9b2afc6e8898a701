#!/usr/bin/env bash
# A real hung collective: every waiting rank reports ONE message naming the host-IR node it is
# blocked in, its position in its team's collective sequence, and the peer that has not arrived
# with the node that peer should be at. Usage: hang_report_names_positions.sh MPIRUN PROBE NP
set -uo pipefail
mpirun=$1 probe=$2 np=$3
last=$((np - 1))
start=$(date +%s)
out=$(MESHFUSE_COMM_TIMEOUT=3 timeout 90 $mpirun --oversubscribe -np "$np" "$probe" 2>&1)
code=$?
echo "$out" | tail -n 20
echo "exit code $code after $(( $(date +%s) - start ))s"
[ $code -ne 0 ] && [ $code -ne 124 ] || { echo "FAIL: exit code $code"; exit 1; }
team=$(seq -s ', ' 0 $last)
reports=0
for r in $(seq 0 $((last - 1))); do
  line=$(echo "$out" | grep "meshfuse: rank $r of $np fails:") || continue
  reports=$((reports + 1))
  [ "$(echo "$line" | wc -l)" -eq 1 ] || { echo "FAIL: rank $r printed more than one report"; exit 1; }
  for want in "allreduce on team \[$team\] did not complete within 3 s (MESHFUSE_COMM_TIMEOUT)" \
              "rank $r is blocked in \`comm h0 allreduce" "collective #0 of team \[$team\]" \
              "not arrived: rank $last should be at \`comm h0 allreduce" "(still in an earlier run)"; do
    echo "$line" | grep -q -- "$want" || { echo "FAIL: rank $r's report lacks: $want"; exit 1; }
  done
done
# MPI_Abort may take a rank down before it prints (its grace period ends first): most must print.
[ $reports -ge 1 ] || { echo "FAIL: no rank reported the hang"; exit 1; }
echo "$out" | grep -q "second run finished" && { echo "FAIL: a run completed without its peer"; exit 1; }
echo "OK: $reports of $last waiting ranks reported the hang with positions"
