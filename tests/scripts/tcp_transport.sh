#!/usr/bin/env bash
# The 2x2 data x tensor parallel MLP with OpenMPI restricted to TCP, as between separate nodes:
# the ob1 messaging layer over the tcp transport (and self) only, on the loopback interface; no
# shared memory (vader, coll/sm) and no UCX. Its result must match single-device execution.
# Usage: tcp_transport.sh MPIRUN MESHFUSE SOURCE_DIR
set -uo pipefail
mpirun=$1 meshfuse=$2 src=$3
tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca coll ^sm,han --mca osc ^sm,ucx)
# btl_base_verbose makes each rank say which transport reaches each peer: the proof that TCP carried it.
cmd=("$mpirun" --oversubscribe -np 4 "${tcp[@]}" --mca btl_base_verbose 30 "$meshfuse" run --check
     "$src/tests/lit/hostir/dp_tp.mf" --size t=32)
echo "+ ${cmd[*]}"
out=$(timeout 120 "${cmd[@]}" 2>&1)
code=$?
grep -v -E "btl|mca:" <<<"$out" | tail -n 12
echo "exit code $code"
fail() { echo "FAIL: $*"; exit 1; }
[ $code -eq 0 ] || fail "exit code $code"
grep -q "== ran on 4 ranks (mpi communicator" <<<"$out" || fail "not run on 4 ranks over MPI"
grep -q "allreduce .*team \[0, 1\]" <<<"$out" || fail "no allreduce over the tensor-parallel pair [0, 1]"
grep -q "check passed" <<<"$out" || fail "the result does not match single-device execution"
# ob1's BML says which transport carries each peer's messages.
grep -q "mca: bml: Using tcp btl for send to" <<<"$out" || fail "no peer was reached over the tcp transport"
grep -q -E "mca: bml: Using (vader|sm|smcuda) btl" <<<"$out" && fail "a peer was reached over shared memory"
echo "OK: the 2x2 DP x TP program over TCP matches single-device execution"
