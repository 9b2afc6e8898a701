"""OpenBLAS's kernel choice, made before meshfuse's extension loads Debian's OpenBLAS.

OpenBLAS picks its GEMM kernels once, when the library loads, from the CPU it recognizes. The
OpenBLAS 0.3.21 of Debian 12 does not know every recent CPU and may fall back to older kernels: on
an Emerald Rapids Xeon its generic SSE3 ("Prescott") kernels, 5x slower than its AVX-512 ones.
When ``OPENBLAS_CORETYPE`` is not set, meshfuse sets it from the CPU's features (Linux
``/proc/cpuinfo``); a value the user set is kept. docs/kernels.md.
"""

import os

# The OpenBLAS core for a set of CPU flags, most capable first: (core, flags it needs).
_CORES = (
    ("Cooperlake", {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_bf16"}),
    ("SkylakeX", {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}),
    ("Haswell", {"avx2", "fma"}),
)


def core_for(flags) -> str:
    """The OpenBLAS core type for CPU feature flags ('' when none of ours applies)."""
    flags = set(flags)
    for core, needs in _CORES:
        if needs <= flags:
            return core
    return ""


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set:
    """The feature flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def choose_openblas_core(environ=os.environ) -> str:
    """Sets OPENBLAS_CORETYPE from the CPU when it is unset; returns the value in effect."""
    if "OPENBLAS_CORETYPE" not in environ:
        core = core_for(cpu_flags())
        if core:
            environ["OPENBLAS_CORETYPE"] = core
    return environ.get("OPENBLAS_CORETYPE", "")


choose_openblas_core()  # on import: meshfuse/__init__.py imports this module before _C
