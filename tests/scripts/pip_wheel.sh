#!/usr/bin/env bash
# `pip install .` works: scikit-build-core builds a wheel from the source tree (CUDA left out to
# save time; the main build compiles it), the wheel installs into an empty directory, and the
# installed package (not the build tree's) runs a sharded fusion against numpy.
# Usage: pip_wheel.sh PYTHON SOURCE_DIR   (PYTHON: the venv's, which has scikit-build-core)
set -euo pipefail
python=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "building the wheel (a few minutes without a warm ccache)"
"$python" -m pip wheel "$src" --no-deps --no-build-isolation -q -w "$tmp/wheel" \
  -C cmake.define.MESHFUSE_CUDA=OFF -C build-dir="$tmp/build"
"$python" -m pip install -q --no-deps --target "$tmp/site" "$tmp"/wheel/meshfuse-*.whl
cd "$tmp"
PYTHONPATH="$tmp/site" "$python" - "$tmp/site" <<'PY'
import os, sys
import numpy as np
import meshfuse
from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

site = sys.argv[1]
assert os.path.realpath(meshfuse.__file__).startswith(os.path.realpath(site)), meshfuse.__file__

def define(fd):
    x = fd.define_tensor([-1, 8])
    w = fd.define_tensor([16, 8])
    fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))

rng = np.random.default_rng(0)
x = rng.standard_normal((4, 8), dtype=np.float32)
w = rng.standard_normal((16, 8), dtype=np.float32)
mesh = DeviceMesh([0])
out = FusionDefinitionWrapper(define)([distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w, mesh, [Shard(0)])])
np.testing.assert_allclose(out[0].full_tensor(), np.maximum(x @ w.T, 0), rtol=1e-5, atol=1e-5)
print("OK: the wheel's meshfuse (from", os.path.dirname(meshfuse.__file__) + ") matches numpy")
PY
