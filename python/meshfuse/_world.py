"""The process's place in the job: rank and world size from meshfuse's communicator.

Under ``mpirun``/``srun`` the communicator is MPI over every launched rank (MPI is initialized
on first use unless someone, e.g. mpi4py, did it already; then meshfuse leaves finalizing to
them); otherwise it is a world of one. Every function initializes it on first use, so calling
``init()`` is optional.

An exception that no one catches ends one rank; its peers would wait for it in their next
collective (until MESHFUSE_COMM_TIMEOUT). So, as ``python -m mpi4py`` does, meshfuse's
``sys.excepthook`` prints the traceback under the rank's name and then aborts the whole job
(MPI_Abort) when a multi-rank world is initialized, and otherwise leaves the exception to the
hook it replaced.
"""

import sys

from . import _C

__all__ = ["init", "is_initialized", "rank", "world_size", "barrier", "communicator_name", "cuda_available"]


def init() -> None:
    """Creates the communicator (idempotent)."""
    _C.init()


def is_initialized() -> bool:
    return _C.is_initialized()


def rank() -> int:
    """This process's global rank."""
    return _C.rank()


def world_size() -> int:
    """The number of ranks in the job."""
    return _C.world_size()


def barrier() -> None:
    """Waits for every rank (a rank that never arrives makes the others abort after
    MESHFUSE_COMM_TIMEOUT seconds instead of hanging)."""
    _C.barrier()


def communicator_name() -> str:
    """``"mpi"`` or ``"self"``."""
    return _C.communicator_name()


def cuda_available() -> bool:
    """Whether a CUDA device is usable here (and meshfuse was built with its CUDA backend):
    FusionDefinitionWrapper(device="auto") then runs on it."""
    return _C.cuda_available()


def _abort_on_uncaught_exception(previous):
    def hook(exc_type, exc, tb):
        if not _C.is_initialized() or _C.world_size() == 1:
            return previous(exc_type, exc, tb)
        r, n = _C.rank(), _C.world_size()
        sys.stdout.flush()
        print(f"meshfuse: rank {r} of {n} raised an exception that nothing caught:", file=sys.stderr)
        previous(exc_type, exc, tb)
        sys.stderr.flush()
        _C.abort(f"uncaught {exc_type.__name__}: {exc}")  # MPI_Abort: every rank exits now

    hook.previous = previous  # chained: the hook this one replaced
    hook.meshfuse_aborts = True
    return hook


def install_excepthook() -> None:
    """Makes an uncaught exception on one rank of a multi-rank world abort every rank (idempotent)."""
    if not getattr(sys.excepthook, "meshfuse_aborts", False):
        sys.excepthook = _abort_on_uncaught_exception(sys.excepthook)
