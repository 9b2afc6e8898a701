#!/usr/bin/env bash
# A tensor larger than the machine's memory (a symbolic size bound to 2^40 rows) ends `meshfuse run`
# with a clear error on EVERY rank, naming the tensor, its dtype, shape and bytes: no std::bad_alloc,
# no segfault, no OOM kill, no hang. Nothing that large is ever touched: the sizes are refused
# before anything is allocated.
# Usage: allocation_too_large.sh MPIRUN MESHFUSE NP
set -uo pipefail
mpirun=$1 meshfuse=$2 np=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ranks=$(seq -s ', ' 0 $((np - 1)))
fail() { echo "FAIL: $*"; exit 1; }

run() {  # run FILE ARGS...: output in $out, exit status in $code
  local file=$1
  shift
  echo "+ mpirun -np $np meshfuse run $file $*"
  out=$(timeout 120 "$mpirun" --oversubscribe -np "$np" "$meshfuse" run "$file" "$@" 2>&1)
  code=$?
  echo "$out" | tail -n 12
  echo "exit code $code"
  [ $code -eq 1 ] || fail "expected exit code 1 (a reported error), got $code (124: hang, 134: abort, 137: killed, 139: segfault)"
  grep -q -i -E "bad_alloc|segmentation|signal|core dumped|out of memory|MPI_Abort" <<<"$out" &&
    fail "a crash or an abort instead of an error"
  return 0
}

expect_on_every_rank() {  # the message, on each rank, as a fixed string after "meshfuse: rank R of NP: "
  for ((r = 0; r < np; ++r)); do
    grep -qF "meshfuse: rank $r of $np: RuntimeError: $1" <<<"$out" || fail "rank $r did not say: $1"
  done
}

# 1. The input itself: ?t = 2^40 rows of 16 f32 (64 TiB), which `meshfuse run` would make whole.
cat > "$dir/rows.mf" <<MF
fusion {
  mesh @m = [$ranks]
  %x = input f32[?t, 16] @m {split(0, $np), parallelize(0, DIDx)}
  %w = input f32[16, 16] @m {}
  %y = linear(%x, %w)
  output %y
}
MF
run "$dir/rows.mf" --size t=1099511627776
expect_on_every_rank "cannot allocate input 0 (%x) whole (it is made on every rank, then sharded), a f32 tensor of shape [1099511627776, 16]: 70368744177664 bytes (64 TiB), more than the "

# 2. Small inputs, a huge intermediate: the outer product of 2^20 rows (sharded) and 2^20 columns
#    is a 2^20/np x 2^20 block of f32 on each rank (4 TiB / np). Named with the ranks that hold it.
cat > "$dir/outer.mf" <<MF
fusion {
  mesh @m = [$ranks]
  %a = input f32[?t, 1] @m {split(0, $np), parallelize(0, DIDx)}
  %b = input f32[1, ?u] @m {}
  %c = matmul(%a, %b)
  %d = relu(%c)
  output %d
}
MF
rows=$((1048576 / np))
bytes=$((rows * 1048576 * 4))
run "$dir/outer.mf" --size t=1048576 --size u=1048576
expect_on_every_rank "cannot allocate %c on ranks $ranks, a f32 tensor of shape [$rows, 1048576]: $bytes bytes ("
grep -qE "more than the [0-9.]+ [KMGT]iB of host memory" <<<"$out" || fail "the message does not say how much memory there is"
echo "OK: every rank reported the tensors it cannot allocate"
