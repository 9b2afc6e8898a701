#!/usr/bin/env bash
# `meshfuse run` on fewer ranks than the fusion's mesh names fails with the world size and the
# mesh size (and how to launch it), instead of running or hanging.
# Usage: world_size_mismatch.sh MPIRUN MESHFUSE SOURCE_DIR  (ctest adds a hard timeout on top)
set -uo pipefail
mpirun=$1 meshfuse=$2 src=$3
out=$(timeout 60 $mpirun --oversubscribe -np 2 "$meshfuse" run --check "$src/tests/lit/hostir/tp_mlp.mf" --size t=16 2>&1)
code=$?
echo "$out" | tail -n 8
echo "exit code $code"
[ $code -ne 0 ] || { echo "FAIL: a 4-device mesh ran on 2 ranks"; exit 1; }
[ $code -ne 124 ] || { echo "FAIL: the ranks hung until the timeout"; exit 1; }
want="MeshError: world size 2 but the meshes of the fusion name ranks up to 3: launch with mpirun -np 4"
echo "$out" | grep -qF "$want" || { echo "FAIL: expected '$want'"; exit 1; }
echo "OK: the 4-device mesh was refused on 2 ranks"
