"""meshfuse's DTensor: this rank's local tensor plus where it belongs (mesh and placements).

Like ``torch.distributed.tensor.DTensor``, minus autograd: the local tensor is any numpy array
or DLPack producer (a torch tensor, ...) and is viewed without a copy. ``shape`` is the global
shape. A size the mesh does not divide is sharded as torch shards it (torch.chunk's blocks:
leading ranks ceil(n / D), trailing ones less, possibly empty), so local tensors differ in shape
from rank to rank; a DTensor of such blocks needs its global ``shape=``, as in torch.

    x = distribute_tensor(full, mesh, [Shard(0)])   # every rank passes the same full array
    x.to_local()                                    # this rank's block
    x.redistribute([Replicate()]).to_local()        # an allgather
    x.full_tensor()                                 # the global value, as numpy, on every rank
"""

from __future__ import annotations

from . import _C, _world
from ._agreement import check_same
from ._locals import converter_like, empty_like_kind, to_cpp, to_numpy
from .fusion_definition import FusionDefinition
from .mesh import (DeviceMesh, Replicate, check_in_world, global_shape, local_shape, mesh_from_cpp,
                   normalize_placements)

__all__ = ["DTensor", "distribute_tensor"]


def as_mesh(mesh, what: str) -> DeviceMesh:
    if isinstance(mesh, DeviceMesh):
        return mesh
    if isinstance(mesh, _C.DeviceMesh):
        return mesh_from_cpp(mesh)
    raise _C.MeshError(f"{what}: expected a meshfuse.DeviceMesh, got {type(mesh).__name__}")


class DTensor:
    __slots__ = ("_local", "_cpp", "_mesh", "_placements", "_shape", "_key")

    def __init__(self, local, device_mesh, placements, *, shape=None):
        """`local` is this rank's block (None, or ignored, on a rank outside the mesh, which
        must then give the global `shape`). Without `shape`, the shards are taken to be even (the
        global shape is the local one times the mesh along each Shard), as torch does; uneven
        blocks need their global `shape`, of which `local` must be this rank's block."""
        mesh = as_mesh(device_mesh, "DTensor")
        inside = _world.rank() in mesh
        if local is None or not inside:
            if shape is None:
                raise _C.ValueError("DTensor: a rank outside the mesh (or without a local tensor) must give shape=")
            placements = normalize_placements(placements, mesh, len(shape), "DTensor")
            cpp = None
            block = ()
        else:
            cpp = to_cpp(local)
            placements = normalize_placements(placements, mesh, len(cpp.shape), "DTensor")
            block = tuple(cpp.shape)
            if shape is None:
                shape = global_shape(block, mesh, placements)
            elif len(shape) != len(block) or local_shape(shape, mesh, placements, _world.rank()) != block:
                want = local_shape(shape, mesh, placements, _world.rank()) if len(shape) == len(block) else None
                raise _C.ShapeError(
                    f"DTensor: local shape {block} is not rank {_world.rank()}'s block of shape={tuple(shape)} with "
                    f"placements {list(placements)} on mesh {mesh}"
                    + (f", which is {want} (torch.chunk's blocks)" if want is not None else ""))
        shape = tuple(shape)
        self._init(local, cpp, mesh, placements, shape,
                   (block, cpp.dtype if cpp is not None else None, mesh._key, _placements_key(placements), shape))

    @classmethod
    def from_local(cls, local, device_mesh, placements, *, shape=None, run_check: bool = False) -> "DTensor":
        """A DTensor of this rank's block `local` (zero-copy).

        run_check: as torch's, the ranks of the mesh first agree on the local shape, dtype and
        placements (one small allgather over the mesh; every rank of the mesh must call it), so
        that a rank given another block raises the same meshfuse.ValueError on every rank instead
        of leaving its peers waiting in a later collective. Values are not compared.
        """
        if not run_check or _world.world_size() == 1:
            return cls(local, device_mesh, placements, shape=shape)
        mesh = as_mesh(device_mesh, "DTensor.from_local")
        if _world.rank() not in mesh:  # not part of the check, as in torch
            return cls(local, mesh, placements, shape=shape)
        team = list(mesh.devices)
        try:
            d = cls(local, mesh, placements, shape=shape)
            local_shape = list(d._cpp.shape) if d._cpp is not None else "none"
            fields = [("local shape", local_shape), ("dtype", d.dtype.short_name if d.dtype is not None else "none"),
                      ("placements", list(d.placements)), ("mesh", mesh)]
        except Exception as e:  # the other ranks are in the check: fail them too, with this error
            check_same("DTensor.from_local", [("error", f"{type(e).__name__}: {e}")], team)
            raise
        check_same("DTensor.from_local", fields, team)
        return d

    @classmethod
    def _make(cls, local, cpp, mesh, placements, shape, key) -> "DTensor":
        """Without checks: for outputs whose layout meshfuse computed."""
        self = cls.__new__(cls)
        self._init(local, cpp, mesh, placements, shape, key)
        return self

    def _init(self, local, cpp, mesh, placements, shape, key):
        self._local, self._cpp, self._mesh, self._placements, self._shape = local, cpp, mesh, placements, shape
        self._key = key  # what a FusionDefinitionWrapper caches its programs on

    def to_local(self):
        """This rank's block, as given (or, for outputs, of the kind of the inputs)."""
        return self._local

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def placements(self) -> tuple:
        return self._placements

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def dtype(self):
        """A meshfuse.DataType (None on a rank outside the mesh)."""
        return self._cpp.dtype if self._cpp is not None else None

    def full_tensor(self):
        """The global value as a numpy array, on every rank of the mesh (collective). A rank
        outside the mesh gets an empty array (shape (0,) * ndim), whatever the placements, as
        torch gives such a rank an empty local tensor and skips the communication."""
        if self._cpp is None:
            return to_numpy(self._outside_local())
        if all(p.is_replicate() for p in self._placements):
            return to_numpy(self._local)
        return to_numpy(self.redistribute([Replicate()] * self._mesh.ndim).to_local())

    def _outside_local(self):
        """What this rank (outside the mesh) holds: the empty local it was given, else one."""
        if self._local is not None:
            return self._local
        return empty_like_kind(None, _C.DataType.Float, self.ndim)

    def redistribute(self, placements) -> "DTensor":
        """The same global value with other placements (collective: every rank of the mesh calls
        it; on a rank outside the mesh it returns at once, with the new placements and an empty
        local tensor)."""
        placements = normalize_placements(placements, self._mesh, self.ndim, "redistribute")
        if placements == self._placements:
            return self
        for axis, (a, b) in enumerate(zip(self._placements, placements)):
            if b.is_partial() and not a.is_partial():
                raise _C.UnsupportedError(
                    f"redistribute: {a!r} -> {b!r} on mesh axis {axis} is not supported (a value becomes Partial "
                    "only as the result of a contraction)")
        if self._cpp is None:
            return DTensor._make(self._outside_local(), None, self._mesh, placements, self._shape,
                                 ((), None, self._mesh._key, _placements_key(placements), self._shape))
        [cpp] = _redistribution(self._mesh, self._placements, placements, self._shape, self._cpp.dtype).run(
            [self._cpp])
        return DTensor._make(converter_like(self._local, cpp.dtype)(cpp), cpp, self._mesh, placements, self._shape,
                             (tuple(cpp.shape), cpp.dtype, self._mesh._key, _placements_key(placements), self._shape))

    def __repr__(self):
        dt = self.dtype.name if self.dtype is not None else "?"
        return f"DTensor(shape={self._shape}, dtype={dt}, mesh={self._mesh}, placements={list(self._placements)})"


def _placements_key(placements) -> tuple:
    return tuple((p.kind, p.dim) for p in placements)


# Redistribution is a one-op fusion, `out = set(x)` with `out` pinned to the new placements, run
# by the same compiler and runtime as everything else. Process-wide caches, like torch's: one
# executor per (mesh, from, to, rank, dtype) and one prepared call per global shape.
_REDISTRIBUTORS: dict = {}
_PREPARED: dict = {}


def _redistribution(mesh, src, dst, shape, dtype) -> _C.Prepared:
    key = (mesh._key, _placements_key(src), _placements_key(dst), len(shape), dtype)
    prepared = _PREPARED.get((key, shape))
    if prepared is None:
        executor = _REDISTRIBUTORS.get(key)
        if executor is None:
            fd = FusionDefinition()
            x = fd.define_tensor([-1] * len(shape), dtype, name="x")
            y = fd.ops.set(x)
            y._set_placements(mesh, list(dst))
            fd.add_output(y)
            # Pure communication of host arrays: the CPU backend (a GPU would only add copies).
            executor = _REDISTRIBUTORS[key] = _C.Executor(fd._fusion, device="cpu")
        prepared = _PREPARED[(key, shape)] = executor.prepare([(mesh, list(src), list(shape), dtype)])
    return prepared


def distribute_tensor(tensor, device_mesh, placements) -> DTensor:
    """Every rank passes the same full `tensor` (numpy array or DLPack producer); each keeps its
    block as a DTensor whose local tensor has the kind of `tensor` (torch.chunk's blocks where a
    mesh axis does not divide a dim: uneven, possibly empty). A Partial axis gives the value to
    the rank at index 0 along that axis and zeros to the others."""
    mesh = as_mesh(device_mesh, "distribute_tensor")
    full = to_cpp(tensor)
    placements = normalize_placements(placements, mesh, len(full.shape), "distribute_tensor")
    check_in_world(mesh, _world.world_size(), "distribute_tensor")
    block = _C.shard_for_rank(full, mesh, list(placements), _world.rank())
    if block is None:  # this rank is outside the mesh
        return DTensor(empty_like_kind(tensor, full.dtype, len(full.shape)), mesh, placements, shape=full.shape)
    return DTensor(converter_like(tensor)(block), mesh, placements, shape=full.shape)
