"""The process's place in the job: rank and world size from meshfuse's communicator.

Under ``mpirun``/``srun`` the communicator is MPI over every launched rank (MPI is initialized
on first use unless someone, e.g. mpi4py, did it already; then meshfuse leaves finalizing to
them); otherwise it is a world of one. Every function initializes it on first use, so calling
``init()`` is optional.
"""

from . import _C

__all__ = ["init", "is_initialized", "rank", "world_size", "barrier", "communicator_name"]


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
