"""Run a Python program on N ranks: ``python -m meshfuse.launch -n N script.py [args...]``.

A thin wrapper over OpenMPI's ``mpirun`` that sets what meshfuse's ranks need:

- ``--oversubscribe`` when N exceeds the cores (CI machines have 2),
- ``OPENBLAS_NUM_THREADS=1`` unless set (N ranks each running N BLAS threads thrash),
- ``MASTER_ADDR``/``MASTER_PORT`` for torch.distributed's rendezvous (a free local port),
- ``PYTHONPATH`` that imports this very meshfuse package on every rank,
- ``OMPI_ALLOW_RUN_AS_ROOT*`` when run as root (containers), which mpirun refuses otherwise.

``-m module`` runs a module instead of a script (``python -m meshfuse.launch -n 2 -m pytest``).
``--dry-run`` prints the command. Scripts can call ``ensure_ranks(n)`` to relaunch themselves
this way when started without mpirun, so that ``python script.py`` is the one command to run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import sys

from . import _C


def launched_by_mpi() -> bool:
    """Whether mpirun/srun started this process (decided by the C++ runtime's one reader of
    the environment, so that Python and C++ agree)."""
    return _C.launched_by_mpi()


def free_port() -> int:
    """A TCP port free on this host now (for torch.distributed's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(n: int, program: list, mpirun: str = "mpirun", extra: list | None = None) -> tuple[list, dict]:
    """(argv, environment) that run `program` (argv after the interpreter) on `n` ranks."""
    if n < 1:
        raise SystemExit(f"meshfuse.launch: -n must be at least 1, got {n}")
    exe = shutil.which(mpirun)
    if exe is None:
        raise SystemExit(f"meshfuse.launch: {mpirun!r} not found; install OpenMPI (Debian: openmpi-bin) or pass "
                         "--mpirun PATH")
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [package_parent, env.get("PYTHONPATH", "")] if p)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(free_port()))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    argv = [exe, "-np", str(n)]
    if n > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    for var in ("PYTHONPATH", "OPENBLAS_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "MESHFUSE_COMM_TIMEOUT"):
        if var in env:
            argv += ["-x", var]  # forwarded to ranks on other nodes too
    argv += list(extra or []) + [sys.executable, *program]
    return argv, env


def ensure_ranks(n: int) -> None:
    """When this script was not started by mpirun, re-run it on `n` ranks (does not return)."""
    if launched_by_mpi():
        return
    argv, env = command(n, [os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    print(f"meshfuse.launch: running on {n} ranks: {shlex.join(argv)}", file=sys.stderr, flush=True)
    os.execvpe(argv[0], argv, env)


def main(args: list | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m meshfuse.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    p.add_argument("-m", dest="module", help="run a module (like python -m) instead of a script")
    p.add_argument("--mpirun", default="mpirun", help="the mpirun to use (default: mpirun on PATH)")
    p.add_argument("--mpirun-args", default="", help="extra mpirun options, quoted as one string")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...] (or the module's args with -m)")
    ns = p.parse_args(args)
    if ns.module is None and not ns.program:
        p.error("give a script to run (or -m module)")
    program = (["-m", ns.module] if ns.module else []) + ns.program
    argv, env = command(ns.nproc, program, ns.mpirun, shlex.split(ns.mpirun_args))
    if ns.dry_run:
        print(shlex.join(argv))
        return
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main()
