"""torch.distributed.tensor.DTensor <-> meshfuse: meshes, placements and local tensors.

Only used when torch is already imported by the caller; meshfuse itself never needs torch.

``init_process_group()`` starts torch.distributed (gloo) on the ranks meshfuse runs on, so that
torch DTensors and meshfuse agree on who is rank r. Under ``python -m meshfuse.launch`` the
rendezvous address comes from the environment; under a plain ``mpirun`` rank 0 picks a free
port and tells the others over MPI (mpi4py).
"""

from __future__ import annotations

import os
import sys

from . import _C, _world
from .mesh import DeviceMesh, Partial, Replicate, Shard

__all__ = ["init_process_group", "is_torch_dtensor", "mesh_from_torch", "placements_from_torch",
           "placements_to_torch", "torch_mesh_for", "TorchLayout", "make_dtensor", "autograd"]


def autograd(fdw):
    """A callable running `fdw` inside torch's autograd (a torch.autograd.Function): forward runs
    meshfuse's forward program, ``loss.backward()`` its backward program (see _torch_autograd)."""
    from ._torch_autograd import autograd as make
    return make(fdw)


def _dtensor_module():
    return sys.modules.get("torch.distributed.tensor")


def is_torch_dtensor(x) -> bool:
    mod = _dtensor_module()
    return mod is not None and isinstance(x, mod.DTensor)


_MESHES: dict = {}  # torch DeviceMesh -> meshfuse DeviceMesh (torch meshes hash by value)


def mesh_from_torch(torch_mesh) -> DeviceMesh:
    mesh = _MESHES.get(torch_mesh)
    if mesh is None:
        if torch_mesh.device_type != "cpu":
            raise _C.UnsupportedError(
                f"a torch DeviceMesh of device type {torch_mesh.device_type!r}: meshfuse's Python runtime takes "
                "CPU tensors (gloo)")
        mesh = _MESHES[torch_mesh] = DeviceMesh(torch_mesh.mesh.tolist())
    return mesh


def _placement_from_torch(p):
    mod = _dtensor_module()
    name = type(p).__name__
    if name == "_StridedShard":  # a subclass of Shard with an interleaved layout
        raise _C.UnsupportedError(f"torch placement {p!r} (strided sharding) is not supported")
    if isinstance(p, mod.Shard):
        return Shard(p.dim)
    if isinstance(p, mod.Replicate):
        return Replicate()
    if isinstance(p, mod.Partial):
        if p.reduce_op != "sum":
            raise _C.UnsupportedError(f"torch placement {p!r}: only Partial sums are supported")
        return Partial()
    raise _C.UnsupportedError(f"torch placement {p!r} is not supported")


def placements_from_torch(placements) -> tuple:
    return tuple(_placement_from_torch(p) for p in placements)


def placements_to_torch(placements) -> tuple:
    mod = _dtensor_module()
    out = []
    for p in placements:
        if p.kind == "shard":
            out.append(mod.Shard(p.dim))
        elif p.kind == "replicate":
            out.append(mod.Replicate())
        else:
            out.append(mod.Partial("sum"))
    return tuple(out)


def torch_mesh_for(mesh: DeviceMesh, known: list):
    """The torch DeviceMesh of `mesh`: one of the inputs' (`known`) when equal, else a new one
    (creating one is collective over the world, which every rank does since all compile alike)."""
    for tm in known:
        if mesh_from_torch(tm) == mesh:
            return tm
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

    tm = TorchDeviceMesh("cpu", mesh.mesh.tolist())
    _MESHES[tm] = mesh
    return tm


class TorchLayout:
    """Where a torch DTensor output lies: mesh, placements, global shape (and its spec, cached)."""

    __slots__ = ("mesh", "placements", "shape", "stride", "_specs")

    def __init__(self, mesh, placements: tuple, shape: tuple):
        self.mesh, self.placements, self.shape = mesh, placements, tuple(shape)
        stride, acc = [], 1
        for s in reversed(self.shape):
            stride.append(acc)
            acc *= s
        self.stride = tuple(reversed(stride))
        self._specs = {}

    def spec(self, dtype):
        spec = self._specs.get(dtype)
        if spec is None:
            import torch
            from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

            spec = self._specs[dtype] = DTensorSpec(self.mesh, self.placements,
                                                    TensorMeta(torch.Size(self.shape), self.stride, dtype))
        return spec


def make_dtensor(local, layout: TorchLayout):
    """A torch DTensor of `local` (this rank's block, contiguous) lying as `layout` says.

    DTensor.from_local() costs ~17 us per call (it runs an autograd Function); building the
    DTensor from its cached spec costs ~1.5 us. meshfuse's outputs do not join torch's autograd
    graph either way. Falls back to from_local() where torch lacks the spec classes.
    """
    mod = _dtensor_module()
    try:
        return mod.DTensor(local, layout.spec(local.dtype), requires_grad=False)
    except (ImportError, TypeError):
        return mod.DTensor.from_local(local, layout.mesh, layout.placements, run_check=False,
                                      shape=layout.shape, stride=layout.stride)


def init_process_group(backend: str = "gloo") -> None:
    """torch.distributed.init_process_group over meshfuse's ranks (no-op when already done)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank, size = _world.rank(), _world.world_size()
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT")
    if port is None:
        from .launch import free_port  # here: importing launch with the package upsets `python -m meshfuse.launch`

        if size == 1:
            port = str(free_port())
        else:
            from mpi4py import MPI  # MPI is initialized by meshfuse already; mpi4py then leaves it be

            port = MPI.COMM_WORLD.bcast(str(free_port()) if rank == 0 else None, root=0)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)
