"""Device meshes and DTensor placements, with torch.distributed's spelling.

A ``DeviceMesh`` is an N-d array of ranks. A placements list has one entry per mesh axis, in
axis order, as in torch: ``[Shard(0), Replicate()]`` on a 2x2 mesh shards dim 0 over mesh
axis 0 and replicates over axis 1. In the schedule API, mesh axis -1 (the last) is
``ParallelType.mesh_x``, axis -2 ``mesh_y``, axis -3 ``mesh_z``.

Both compare and hash by value, so they can key caches and be compared with ``==``.
"""

from __future__ import annotations

from . import _C

__all__ = ["DeviceMesh", "Placement", "Shard", "Replicate", "Partial"]


def _flatten(ranks):
    """(flat list of ints, shape) of a nested sequence, range, numpy array or torch tensor of ranks."""
    if hasattr(ranks, "tolist"):  # numpy arrays, torch tensors
        ranks = ranks.tolist()
    if isinstance(ranks, int):
        return [ranks], []
    if isinstance(ranks, range):
        ranks = list(ranks)
    if not isinstance(ranks, (list, tuple)) or len(ranks) == 0:
        raise _C.MeshError(f"a device mesh needs a non-empty (nested) list of ranks, got {ranks!r}")
    if all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return list(ranks), [len(ranks)]
    parts = [_flatten(r) for r in ranks]
    inner = parts[0][1]
    if any(p[1] != inner for p in parts) or not inner:
        raise _C.MeshError(f"a device mesh must be rectangular (every row of the same shape), got {ranks!r}")
    return [d for p in parts for d in p[0]], [len(parts), *inner]


class DeviceMesh(_C.DeviceMesh):
    """An N-d array of ranks (1 to 3 dims).

    ``DeviceMesh([0, 1, 2, 3])``, ``DeviceMesh([[0, 1], [2, 3]])`` and
    ``DeviceMesh([0, 1, 2, 3], shape=(2, 2))`` are meshes; the last two are equal.
    Raises ``meshfuse.MeshError`` on a malformed mesh (duplicate or negative ranks, wrong size).
    """

    def __init__(self, ranks, shape=None):
        devices, nested_shape = _flatten(ranks)
        super().__init__(devices, list(nested_shape if shape is None else shape))
        # Hashed on every cached call (as part of a call signature): compute it once.
        self._key = (tuple(self.devices), self.shape)
        self._hash = hash(self._key)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _C.DeviceMesh) and _C.DeviceMesh.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    @property
    def mesh(self):
        """The ranks as a numpy array of the mesh's shape (torch's ``DeviceMesh.mesh``)."""
        import numpy as np

        return np.asarray(self.devices, dtype=np.int64).reshape(self.shape)

    def __reduce__(self):
        return (DeviceMesh, (list(self.devices), list(self.shape)))

    def __repr__(self):
        return f"DeviceMesh({self})"


class Placement(_C.Placement):
    """How a tensor lies along one mesh axis: ``Shard(d)``, ``Replicate()`` or ``Partial()``."""

    def is_shard(self, dim=None):
        return self.kind == "shard" and (dim is None or self.dim == dim)

    def is_replicate(self):
        return self.kind == "replicate"

    def is_partial(self):
        return self.kind == "partial"

    def __reduce__(self):
        return (from_cpp, (_C.Placement(self.kind, self.dim),))


class Shard(Placement):
    """Dim ``dim`` (negative counts from the end) is split evenly across the mesh axis."""

    def __init__(self, dim: int):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise _C.PlacementError(f"Shard(dim) takes an int, got {dim!r}")
        super().__init__("shard", dim)

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Every rank along the mesh axis holds the whole tensor."""

    def __init__(self):
        super().__init__("replicate", 0)

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Every rank along the mesh axis holds a partial sum; the tensor is their sum."""

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op != "sum":
            raise _C.UnsupportedError(f"Partial(reduce_op={reduce_op!r}): only 'sum' is supported")
        super().__init__("partial", 0)

    def __repr__(self):
        return "Partial()"


def from_cpp(p: _C.Placement) -> Placement:
    """The Python class of a placement that came back from C++."""
    if p.kind == "shard":
        return Shard(p.dim)
    return Replicate() if p.kind == "replicate" else Partial()


def mesh_from_cpp(m: _C.DeviceMesh) -> DeviceMesh:
    return m if isinstance(m, DeviceMesh) else DeviceMesh(list(m.devices), list(m.shape))


def normalize_placements(placements, mesh: DeviceMesh, ndim: int, what: str) -> tuple:
    """Checks `placements` against the mesh and a tensor of `ndim` dims; Shard dims made >= 0."""
    if isinstance(placements, _C.Placement):
        placements = [placements]
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise _C.PlacementError(
            f"{what}: {len(placements)} placements {list(placements)} for a {mesh.ndim}-d mesh {mesh}: "
            "give one placement per mesh axis")
    out = []
    for p in placements:
        if not isinstance(p, _C.Placement):
            raise _C.PlacementError(f"{what}: {p!r} is not a placement (Shard(d), Replicate() or Partial())")
        if p.kind == "shard":
            if not -ndim <= p.dim < ndim:
                raise _C.PlacementError(
                    f"{what}: {p!r} names dim {p.dim} but the tensor has {ndim} dims")
            p = Shard(p.dim % ndim)
        elif not isinstance(p, Placement):
            p = from_cpp(p)
        out.append(p)
    return tuple(out)


def global_shape(local_shape, mesh: DeviceMesh, placements) -> tuple:
    """The global shape of even shards: each Shard(d) multiplies dim d by its mesh axis' size
    (what torch's DTensor.from_local assumes without shape=; uneven shards need the shape)."""
    shape = list(local_shape)
    for axis, p in enumerate(placements):
        if p.kind == "shard":
            shape[p.dim] *= mesh.size(axis)
    return tuple(shape)


def local_shape(shape, mesh: DeviceMesh, placements, rank: int) -> tuple:
    """The shape of the block of a tensor of global `shape` that `rank` holds: torch.chunk's
    blocks, as torch's DTensor cuts them (leading ranks ceil(n / D), trailing ones less, possibly
    empty; several Shard(d) of one dim nest in mesh-axis order). A rank outside the mesh gets the
    largest block. The compiler's own rule (placement.h: localBlock)."""
    return tuple(_C.local_shape(list(shape), mesh, list(placements), rank))


def check_in_world(mesh: DeviceMesh, world_size: int, what: str):
    """Rejects a mesh that names ranks this world lacks (the same words as the executor's check)."""
    missing = [d for d in mesh.devices if d >= world_size]
    if missing:
        raise _C.MeshError(
            f"{what}: mesh {mesh} names device {missing[0]} but the world has {world_size} ranks "
            f"(world size {world_size} < mesh size {mesh.size()}; launch with mpirun -np {mesh.size()})")
