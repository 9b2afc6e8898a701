#!/usr/bin/env bash
# `meshfuse run` needs exactly the ranks up to the largest device id of ALL meshes of the fusion:
# an input on [0, 1] moved to the stage [2, 3] runs on 4 ranks, and on 2 ranks it is refused up
# front (it used to fail inside a send to a rank that does not exist).
# Usage: run_world_size.sh MPIRUN MESHFUSE
set -uo pipefail
mpirun=("$1" --oversubscribe)
meshfuse=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/two_stages.mf" <<'MF'
fusion {
  mesh @a = [0, 1]
  mesh @b = [2, 3]
  %x = input f32[8, 12] @a {split(0, 2), parallelize(0, DIDx)}
  %y = set(%x) : f32[8, 12] @b {split(0, 2), parallelize(0, DIDx)}
  %z = relu(%y)
  output %z
}
MF
out=$(timeout 120 "${mpirun[@]}" -np 4 "$meshfuse" run --check "$tmp/two_stages.mf" 2>&1)
code=$?
echo "$out" | grep -E "^(output|check|meshfuse)"
[ $code -eq 0 ] && grep -q "^check passed" <<<"$out" || { echo "FAIL: -np 4 should run (exit $code)"; exit 1; }
out=$(timeout 120 "${mpirun[@]}" -np 2 "$meshfuse" run --check "$tmp/two_stages.mf" 2>&1)
code=$?
echo "$out" | grep "^meshfuse"
[ $code -ne 0 ] && [ $code -ne 124 ] || { echo "FAIL: -np 2 should be refused (exit $code)"; exit 1; }
grep -qF "MeshError: world size 2 but the meshes of its tensors name ranks up to 3: launch with mpirun -np 4" <<<"$out" ||
  { echo "FAIL: no world-size message"; exit 1; }
! grep -q "peer rank" <<<"$out" || { echo "FAIL: it got as far as a send to a missing rank"; exit 1; }
echo "OK: the world size counts every mesh"
