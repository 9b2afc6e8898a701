"""meshfuse: write a model block once, for one device; run it on DTensors across ranks.

    import meshfuse
    from meshfuse import FusionDefinition, FusionDefinitionWrapper, DataType
    from meshfuse import DeviceMesh, Shard, Replicate, distribute_tensor

    def define_fusion(fd: FusionDefinition):
        inp = fd.define_tensor([-1, h]); up_w = fd.define_tensor([4 * h, h]); down_w = ...
        fd.add_output(fd.ops.linear(fd.ops.gelu(fd.ops.linear(inp, up_w)), down_w))

    mesh = DeviceMesh(range(meshfuse.world_size()))
    fdw = FusionDefinitionWrapper(define_fusion)
    (out,) = fdw([distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w1, mesh, [Shard(0)]),
                  distribute_tensor(w2, mesh, [Shard(1)])])

Run on N ranks with ``python -m meshfuse.launch -n N script.py``. See docs/python.md.
"""

from . import _blas  # noqa: F401  (first: sets OPENBLAS_CORETYPE before _C loads OpenBLAS)
from . import _C
from ._errors import *  # noqa: F401,F403  (meshfuse.Error and one subclass per error kind)
from ._errors import Error
from . import _world
from ._world import barrier, communicator_name, cuda_available, init, is_initialized, rank, world_size
from .dtensor import DTensor, distribute_tensor
from .fusion_definition import DataType, FusionDefinition, ParallelType, TensorView
from .mesh import DeviceMesh, Partial, Placement, Replicate, Shard
from .wrapper import FusionDefinitionWrapper, Plan, compile_options
from . import optim, torch_interop  # noqa: E402  (meshfuse.optim.SGD/AdamW, torch_interop.autograd)

_world.install_excepthook()  # an uncaught exception on one rank aborts the job, not just that rank

__all__ = [
    "Error", "init", "is_initialized", "rank", "world_size", "barrier", "communicator_name", "cuda_available",
    "DataType", "ParallelType", "FusionDefinition", "TensorView",
    "DeviceMesh", "Placement", "Shard", "Replicate", "Partial", "DTensor", "distribute_tensor",
    "FusionDefinitionWrapper", "Plan", "compile_options", *_C.ERROR_KINDS,
]
