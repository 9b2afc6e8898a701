#!/usr/bin/env bash
# Bad input to the `meshfuse` CLI: each case must exit with status 1 (a user error, reported on
# stderr with the expected text), never crash (abort, segfault), hang or exit 0.
# Usage: cli_errors.sh MESHFUSE
set -uo pipefail
meshfuse=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# expect_exit WANT NAME EXPECTED_STDERR_TEXT ARGS...: runs `meshfuse ARGS` (with a time limit) and
# wants exit status WANT: 1 (a meshfuse user error) or "usage" (CLI11's own usage-error status:
# non-zero, not a hang (124), not a crash (>128)).
expect_exit() {
  local want=$1 name=$2 text=$3
  shift 3
  local out code bad=0
  out=$(timeout 60 "$meshfuse" "$@" 2>&1 >/dev/null)
  code=$?
  if [ "$want" = usage ]; then
    if [ $code -eq 0 ] || [ $code -eq 124 ] || [ $code -gt 128 ]; then bad=1; fi
  elif [ $code -ne "$want" ]; then
    bad=1
  fi
  if [ $bad -eq 1 ]; then
    echo "FAIL $name: exit status $code (want $want; 124 = hung, >128 = crashed): $out"
    failures=$((failures + 1))
  elif ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: stderr lacks '$text': $out"
    failures=$((failures + 1))
  else
    echo "ok   $name: $out"
  fi
}
expect_error() { expect_exit 1 "$@"; }

# write NAME: the .mf text on stdin goes to $dir/NAME.mf.
write() { cat >"$dir/$1.mf"; }

write one <<'MF'
fusion {
  %a = input f32[4]
  %b = neg(%a)
  output %b
}
MF
expect_error save-outputs-unwritable "RuntimeError: --save-outputs /proc/nope: cannot create the directory" \
  run "$dir/one.mf" --save-outputs /proc/nope

# Element counts that overflow an int64 (they used to abort, wrap to 0 or hang).
for shape in "4611686018427387904, 4611686018427387904" "3037000500, 3037000500" "4294967296, 4294967297"; do
  printf 'fusion {\n  %%a = input f32[%s]\n  %%b = neg(%%a)\n  output %%b\n}\n' "$shape" >"$dir/big.mf"
  expect_error "overflow [$shape]" "ShapeError: $dir/big.mf:2:3: input %a: shape [$shape] of f32 has more elements" \
    run "$dir/big.mf"
done
write sym <<'MF'
fusion {
  %a = input f32[?t, ?u]
  %b = neg(%a)
  output %b
}
MF
expect_error symbolic-overflow "ShapeError: input %a: shape [4294967296, 4294967297] of f32 has more elements" \
  run "$dir/sym.mf" --size t=4294967296 --size u=4294967297

# A mesh nested 50,000 deep (used to overflow the parser's stack).
{
  printf 'fusion {\n  mesh @m = '
  head -c 50000 /dev/zero | tr '\0' '['
  printf 0
  head -c 50000 /dev/zero | tr '\0' ']'
  printf '\n}\n'
} >"$dir/deep.mf"
expect_error deep-mesh "MeshError: $dir/deep.mf:2:16: malformed mesh: nested more than 3 deep" print "$dir/deep.mf"

# --rank outside the fusion's meshes, --size for a size the fusion lacks.
write tp <<'MF'
fusion {
  mesh @tp = [0, 1]
  %x = input f32[?t, 8] @tp {}
  %w = input f32[6, 8] @tp {split(0, 2), parallelize(0, DIDx)}
  %y = linear(%x, %w)
  output %y
}
MF
for stage in hostir kernels llvm propagated; do
  expect_error "dump --stage=$stage --rank=99" "ValueError: --rank 99: no mesh of the fusion holds rank 99 (its ranks: 0, 1" \
    dump --stage=$stage --rank=99 "$dir/tp.mf"
done
expect_error "dump --stage=kernels --rank=-1" "ValueError: --rank -1: no mesh of the fusion holds rank -1 (its ranks: 0, 1)" \
  dump --stage=kernels --rank=-1 "$dir/tp.mf"
expect_error "collectives --rank=99" "ValueError: --rank 99: no mesh of the fusion holds rank 99 (its ranks: 0, 1)" \
  collectives --rank=99 "$dir/tp.mf"
expect_error "dump --rank=1 of a fusion without meshes" "--rank 1: no mesh of the fusion holds rank 1 (its ranks: 0" \
  dump --rank=1 "$dir/one.mf"
expect_error "run --size q=4" "ValueError: --size q=4: the fusion has no size ?q (its symbolic sizes: ?t)" \
  dump --size q=4 "$dir/tp.mf"
expect_error "run --size t=4 (no symbolic sizes)" "ValueError: --size t=4: the fusion has no size ?t (it has no symbolic sizes)" \
  run --size t=4 "$dir/one.mf"
# A symbolic size that a reshape cannot produce: a ShapeError naming the reshape.
write reshape <<'MF'
fusion {
  %a = input f32[?t, 8]
  %b = reshape(%a, shape=[-1, 3])
  output %b
}
MF
expect_error symbolic-reshape "ShapeError: %b = reshape(%a, shape=[-1, 3]): size ?t*8/3 is not an integer for ?t = 4" \
  run --size t=4 "$dir/reshape.mf"
# Two symbolic sizes an op requires equal, bound differently: the op and both tensors.
write add <<'MF'
fusion {
  %a = input f32[?t]
  %b = input f32[?u]
  %c = add(%a, %b)
  output %c
}
MF
expect_error symbolic-mismatch "ShapeError: %c = add(%a, %b): dim 0 mismatch: %a has ?t = 4 but %b has ?u = 5" \
  run --size t=4 --size u=5 "$dir/add.mf"
# --device=cuda runs on the CUDA backend or says why not (never silently elsewhere).
out=$(timeout 60 "$meshfuse" run --device=cuda "$dir/one.mf" 2>&1)
code=$?
if { [ $code -eq 0 ] && grep -q "cuda backend" <<<"$out"; } ||
  { [ $code -eq 1 ] && grep -q "RuntimeError: no CUDA device: " <<<"$out"; }; then
  echo "ok   run --device=cuda: $(head -1 <<<"$out")"
else
  echo "FAIL run --device=cuda: exit $code: $out"
  failures=$((failures + 1))
fi
write noout <<'MF'
fusion {
  %a = input f32[4]
  %b = neg(%a)
}
MF
expect_error no-outputs "ValueError: $dir/noout.mf:4:1: the fusion has no outputs" run "$dir/noout.mf"

# Files that are not .mf text.
mkdir -p "$dir/a_directory"
expect_error directory "RuntimeError: cannot read $dir/a_directory: it is a directory, not a .mf file" \
  print "$dir/a_directory"
expect_error missing-file "RuntimeError: cannot open $dir/missing.mf: No such file or directory" print "$dir/missing.mf"
printf '\xef\xbb\xbffusion {\n}\n' >"$dir/bom.mf"
expect_error byte-order-mark 'bom.mf:1:1: the file starts with a UTF-8 byte-order mark (bytes \xEF\xBB\xBF)' \
  print "$dir/bom.mf"

# Compile options with bad values: CLI11 reports them as usage errors (its own exit status, not 1)
# with the message of the option table that Python's keyword arguments use too.
expect_usage_error() { expect_exit usage "$@"; }
expect_usage_error chunks-not-a-number "--chunks: chunks 'x': expected a whole number >= 0" opt --pass=propagate-shardings --chunks x "$dir/one.mf"
expect_usage_error streams-zero "--streams: streams '0': expected a whole number >= 1" dump --streams 0 "$dir/one.mf"
expect_usage_error overlap-unknown "--overlap: zigzag not in {none,collective,ring}" collectives --overlap zigzag "$dir/one.mf"

[ $failures -eq 0 ] || { echo "$failures case(s) failed"; exit 1; }
echo "every bad input gave a clear error (exit status 1, or CLI11's for a bad flag)"
