"""FusionDefinition: a single-device tensor program, written as in nvFuser.

    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, h], dtype=DataType.Float)   # -1: a size bound at run time
        w = fd.define_tensor([4 * h, h], dtype=DataType.Float)
        out = fd.ops.gelu(fd.ops.linear(inp, w), approximate="tanh")
        fd.add_output(out)
    print(fd)                                                   # the .mf text form

TensorViews also take a schedule that meshfuse must honor: ``tv.set_device_mesh(mesh)``,
``tv.split(axis, factor, inner_split=False)`` and ``tv.axis(i).parallelize(ParallelType.mesh_x)``.
A TensorView given a mesh this way is pinned: its DID axes are kept (none means replicated) and
sharding propagation only decides the TensorViews left open.
"""

from __future__ import annotations

from . import _C
from .mesh import from_cpp, mesh_from_cpp
from .ops import Ops

__all__ = ["FusionDefinition", "TensorView", "DataType", "ParallelType"]

DataType = _C.DataType
ParallelType = _C.ParallelType
TensorView = _C.TensorView


def _mesh(tv):
    """The meshfuse.DeviceMesh given with the schedule API; None while the tensor has none."""
    m = tv._mesh
    return None if m is None else mesh_from_cpp(m)


def _placements(tv):
    """The placements its schedule amounts to, one per mesh axis (a tuple of Shard, Replicate,
    Partial, as DTensor.placements); None while the tensor has no mesh."""
    ps = tv._placements
    return None if ps is None else tuple(from_cpp(p) for p in ps)


TensorView.mesh = property(_mesh, doc=_mesh.__doc__)
TensorView.placements = property(_placements, doc=_placements.__doc__)


class FusionDefinition:
    def __init__(self):
        self._fusion = _C.Fusion()
        self.ops = Ops(self._fusion)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._fusion.verify()  # a bad schedule fails here, at the definition, not at run time
        return False

    def define_tensor(self, shape, dtype: DataType = DataType.Float, name: str = "") -> TensorView:
        """A fusion input of global `shape` (-1: symbolic; 1: a broadcast dim)."""
        if not isinstance(dtype, DataType):
            raise _C.ValueError(f"define_tensor: dtype must be a meshfuse.DataType, got {dtype!r}")
        return self._fusion.define_tensor(list(shape), dtype, name)

    def add_output(self, tv: TensorView) -> None:
        self._fusion.add_output(tv)

    @property
    def inputs(self) -> list:
        return self._fusion.inputs

    @property
    def outputs(self) -> list:
        return self._fusion.outputs

    def __str__(self):
        return str(self._fusion)

    def __repr__(self):
        return f"FusionDefinition(\n{self._fusion})"
