#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of a collective (no exception, no message of its own: as
# the OOM killer or a scheduler would) makes every other rank exit within MESHFUSE_COMM_TIMEOUT, with
# a non-zero status and a message naming the killed rank.
#
# Usage: killed_rank.sh MPIRUN NP MODE LAUNCHER KILL_LIBRARY -- PROGRAM...
#   MODE     mpirun: OpenMPI's default, where mpirun itself ends the job when a rank dies by a
#                    signal ("mpirun noticed that process rank K ... exited on signal 9");
#            noabort: mpirun --mca orte_abort_on_non_zero_status 0, which does not end the job when
#                    a rank dies: meshfuse's own watchdog (MESHFUSE_COMM_TIMEOUT) must;
#            recovery: mpirun --enable-recovery (ORTE's process-failure recovery), which lets the
#                    job go on without the dead rank: meshfuse's watchdog must end it. Under it
#                    OpenMPI 4.1's mpirun exits 0 even after MPI_Abort(..., 1) (its own note says
#                    "MPI_ABORT was invoked on rank R ... with errorcode 1"): nothing a rank does
#                    makes that status non-zero, so the status is not checked in this mode.
#   LAUNCHER mpirun: PROGRAM runs under MPIRUN directly; launch: under `python -m meshfuse.launch`.
#   KILL_LIBRARY  the PMPI library (kill_in_collective.c) that kills rank NP-1 right after it
#            issued its KILL_AT-th allreduce (environment; default 1), or "self" when PROGRAM kills
#            itself (killed_rank_probe.py).
# The killed rank is the last one, NP-1.
set -uo pipefail
mpirun=$1 np=$2 mode=$3 launcher=$4 library=$5
shift 5
[ "$1" = "--" ] && shift
killed=$((np - 1))
timeout_s=10
export MESHFUSE_COMM_TIMEOUT=$timeout_s OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

opts=(--oversubscribe -x MESHFUSE_COMM_TIMEOUT -x OPENBLAS_NUM_THREADS)
[ -n "${PYTHONPATH:-}" ] && opts+=(-x PYTHONPATH)
[ "$mode" = noabort ] && opts+=(--mca orte_abort_on_non_zero_status 0)
[ "$mode" = recovery ] && opts+=(--enable-recovery)
if [ "$library" = self ]; then
  opts+=(-x "MESHFUSE_TEST_KILL_RANK=$killed")
else
  # Killed in the program's allreduce (not in an earlier allgather of the input check).
  # KILL_AT: which allreduce (meshfuse run's first one is its check that every rank can allocate).
  opts+=(-x "LD_PRELOAD=$library" -x "MESHFUSE_TEST_KILL_RANK=$killed" -x MESHFUSE_TEST_KILL_IN=MPI_Iallreduce
         -x "MESHFUSE_TEST_KILL_AT=${KILL_AT:-1}")
fi
if [ "$launcher" = launch ]; then
  cmd=("${PYTHON:-python3}" -m meshfuse.launch -n "$np" --mpirun "$mpirun" --mpirun-args "${opts[*]}" "$@")
else
  cmd=("$mpirun" -np "$np" "${opts[@]}" "$@")
fi
echo "+ ${cmd[*]}"
now() { date +%s.%N; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
start=$(now)
# A hard stop far beyond the watchdog: a hang shows as exit code 124.
out=$(timeout 120 "${cmd[@]}" 2>&1)
code=$?
elapsed=$(awk -v a="$(now)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')
echo "$out" | tail -n 25
echo "exit code $code after ${elapsed}s (MESHFUSE_COMM_TIMEOUT=$timeout_s, mode $mode, $np ranks, rank $killed killed)"

fail() { echo "FAIL: $*"; exit 1; }
[ $code -ne 124 ] || fail "the surviving ranks hung"
if [ "$mode" = recovery ]; then
  # (mpirun's own note "MPI_ABORT was invoked on rank R" is not reliable in this mode either: it
  # often fails to unpack it, "ORTE_ERROR_LOG: Data unpack would read past end of buffer".)
  grep -q "meshfuse: aborting every rank (MPI_Abort)" <<<"$out" ||
    fail "no rank aborted the job (mpirun's status under --enable-recovery is 0 either way)"
else
  [ $code -ne 0 ] || fail "the job exited 0 although rank $killed was killed"
fi
grep -q "rank $killed .*SIGKILL" <<<"$out" || fail "rank $killed was not killed where the test meant it to be"
# A rank that never joined the call leaves no peer able to finish it. (Killed right after it issued
# the allreduce, its contribution may already be on its way: then some peers, depending on MPI's
# algorithm, legitimately complete, and the rest wait.)
if [ "$library" = self ]; then
  grep -q -E "rank [0-9]+ finished" <<<"$out" && fail "a rank finished a call whose collective lacked rank $killed"
fi
# The job must end within the timeout (plus start-up, and the seconds mpirun takes to tear down).
limit=$((timeout_s + 25))
lt "$elapsed" "$limit" || fail "took ${elapsed}s, more than ${limit}s"
# Who names the dead rank: mpirun ("process rank K ... exited on signal 9"), or meshfuse's watchdog
# (its message names the collective and its team, and, with the report of missing peers, the rank).
by_mpirun="process rank $killed .*exited on signal 9"
by_meshfuse="(did not complete within $timeout_s s \(MESHFUSE_COMM_TIMEOUT\).*|rank $killed .*(not arrived|missing|did not arrive))"
if [ "$mode" = mpirun ]; then
  grep -q -E "$by_mpirun" <<<"$out" || fail "no message from mpirun naming rank $killed"
  # mpirun, not the watchdog, ended the job: well before the timeout.
  lt "$elapsed" "$timeout_s" || fail "mpirun took ${elapsed}s to end the job"
else
  grep -q -E "$by_meshfuse" <<<"$out" || fail "no message from meshfuse's watchdog"
  team=$(seq -s ', ' 0 $((np - 1)))
  grep -q -E "^meshfuse: rank [0-9]+ of $np fails: .*(on team \[$team\]|rank $killed .*(not arrived|missing|did not arrive))" \
    <<<"$out" || fail "the watchdog's message names neither the team with rank $killed nor rank $killed"
  grep -q "meshfuse: rank [0-9]* of $np fails" <<<"$out" || fail "no surviving rank reported the failure"
fi
echo "OK: rank $killed killed mid-collective; the job ended in ${elapsed}s with code $code"
