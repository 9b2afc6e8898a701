"""meshfuse picks OpenBLAS's kernels from the CPU's features when OPENBLAS_CORETYPE is unset
(python/meshfuse/_blas.py): Debian's OpenBLAS falls back to generic kernels on CPUs it does not
know. A value the user set is kept."""

import os
import subprocess
import sys

from meshfuse import _blas


def test_core_for_cpu_flags():
    avx512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
    assert _blas.core_for(avx512 | {"avx512_bf16"}) == "Cooperlake"
    assert _blas.core_for(avx512) == "SkylakeX"
    assert _blas.core_for({"avx2", "fma", "sse3"}) == "Haswell"
    assert _blas.core_for({"sse3", "avx"}) == ""


def test_cpu_flags_reads_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert _blas.cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    assert _blas.cpu_flags(str(tmp_path / "missing")) == set()


def test_a_value_the_user_set_is_kept():
    env = {"OPENBLAS_CORETYPE": "Haswell"}
    assert _blas.choose_openblas_core(env) == "Haswell"
    env = {}
    chosen = _blas.choose_openblas_core(env)
    assert env.get("OPENBLAS_CORETYPE", "") == chosen == _blas.core_for(_blas.cpu_flags())


def test_importing_meshfuse_sets_it_before_openblas_loads():
    """In a fresh process without the variable, importing meshfuse leaves the CPU's choice set."""
    # (Not an MPI process: without mpirun's variables the child cannot mistake itself for a rank.)
    env = {k: v for k, v in os.environ.items()
           if k != "OPENBLAS_CORETYPE" and not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    code = "import os, meshfuse; print(os.environ.get('OPENBLAS_CORETYPE', ''))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _blas.core_for(_blas.cpu_flags())
