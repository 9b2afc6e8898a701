"""FusionDefinitionWrapper: run a single-device definition on DTensors (the seed's user API).

    def define_fusion(fd):
        inp = fd.define_tensor([-1, h]); up_w = fd.define_tensor([4 * h, h]); ...
        fd.add_output(out)

    fdw = FusionDefinitionWrapper(define_fusion)
    out_dtensors = fdw(inp_dtensors)     # meshfuse DTensors or torch DTensors
    fdw.plan(inp_dtensors).host_ir()     # what this rank runs, without running it

The inputs' meshes and placements decide the multi-device program: meshfuse propagates the
shardings, inserts the collectives and runs this rank's host program. torch DTensors in give
torch DTensors out, on the same torch DeviceMesh when the output lies on an input's mesh.

Programs are cached per call signature (every input's shape, dtype, placements and mesh); a
cached call converts the local tensors (zero-copy), runs the C++ program with the GIL
released, and wraps the outputs.
"""

from __future__ import annotations

import threading

from . import _C, _world
from ._agreement import check_same
from ._locals import converter_like, empty_like_kind, require_bfloat16_support, to_cpp
from .dtensor import DTensor, _placements_key
from .fusion_definition import FusionDefinition
from .mesh import check_in_world, from_cpp, local_shape, mesh_from_cpp
from . import torch_interop

__all__ = ["FusionDefinitionWrapper", "Plan"]


class Plan:
    """What meshfuse compiled for one call signature (``fdw.plan(inputs)``)."""

    def __init__(self, program: _C.CompiledProgram):
        self._program = program
        layouts = program.output_layouts
        self.output_meshes = [mesh_from_cpp(m) if m is not None else None for m, _ in layouts]
        self.output_placements = [tuple(from_cpp(p) for p in ps) for _, ps in layouts]
        self.output_shapes = [tuple(s) for s in program.output_shapes]
        self.output_dtypes = program.output_dtypes

    def host_ir(self, rank: int | None = None) -> str:
        """The host program `rank` (default: this rank) runs, as text."""
        return self._program.host_ir(rank)

    def collectives(self, rank: int | None = None) -> list:
        """The communications of `rank`'s host program, in order: each has ``kind`` (allgather,
        reduce_scatter, allreduce, all_to_all, send_recv, broadcast, reduce, gather, scatter),
        ``mesh_axis``, ``team`` (global ranks), ``root`` (the root's global rank for broadcast,
        scatter, gather and reduce, else None), ``bytes`` (what this rank contributes),
        ``tensor``/``source`` (names) and ``provenance`` (why it exists)."""
        return self._program.collectives(rank)

    def peak_memory(self, rank: int | None = None) -> int:
        """The bytes `rank` (default: this rank) holds at its peak while running, inputs included
        (from the host program's allocations, as ``meshfuse collectives`` reports it)."""
        return self._program.peak_memory(rank)

    def attention_blocks(self, rank: int | None = None) -> list:
        """Per ring attention of `rank`'s program, its causal work: ``steps`` (the ring's steps),
        ``chunk`` (rows of a sequence chunk), ``attended`` and ``skipped`` (pairs of a query chunk
        and a key chunk it computes, or skips as entirely masked), each counted for one of its
        ``head_groups`` (one ring per group of heads, every group attending the same pairs).
        docs/parallelisms.md."""
        return self._program.attention_blocks(rank)

    def fusion_ir(self, stage: str = "decomposed") -> str:
        """The fusion IR after a pipeline stage (see ``Plan.stages``)."""
        return self._program.stage(stage)

    stages = _C.CompiledProgram.stage_names

    def __repr__(self):
        return (f"Plan(outputs={[list(p) for p in self.output_placements]}, "
                f"collectives={[c.kind for c in self.collectives()]})")


class _Call:
    """One cached call signature: the prepared C++ program and how to wrap its outputs."""

    __slots__ = ("prepared", "plan", "outputs", "torch_out", "bfloat16_outputs", "checked")

    def __init__(self, prepared: _C.Prepared, torch_meshes: list | None):
        self.prepared = prepared
        self.plan = Plan(prepared.program)
        self.torch_out = torch_meshes is not None
        self.checked = False  # whether the ranks agreed on this signature (check_inputs="first")
        self.outputs = []  # per output: mesh, placements, global shape, dtype, DTensor key, torch layout
        p = self.plan
        self.bfloat16_outputs = [i for i, dtype in enumerate(p.output_dtypes) if dtype == _C.DataType.BFloat16]
        for mesh, ps, shape, dtype in zip(p.output_meshes, p.output_placements, p.output_shapes, p.output_dtypes):
            torch_layout = None
            if self.torch_out:
                torch_layout = torch_interop.TorchLayout(torch_interop.torch_mesh_for(mesh, torch_meshes),
                                                         torch_interop.placements_to_torch(ps), shape)
            key = (local_shape(shape, mesh, ps, _world.rank()), dtype, mesh._key, _placements_key(ps), shape)
            self.outputs.append((mesh, ps, shape, dtype, key, torch_layout))


CHECK_INPUTS = ("first", "always", "never")
DEVICES = ("auto", "cpu", "cuda")


class FusionDefinitionWrapper:
    def __init__(self, define_fusion, *, trace: bool = False, check_inputs: str = "first",
                 abort_on_failure: bool = True, device: str = "auto", **compile_options):
        """`define_fusion(fd)` defines the single-device program (called once, lazily).

        compile_options: the options of the compiler, as keyword arguments (the CLI's --NAME flags
            come from the same table; meshfuse.compile_options() lists them with their defaults):
{compile_options}
        trace: record each call's timeline; see last_trace() and write_trace().
        check_inputs: whether the ranks first agree that they were given the same inputs (shapes,
            dtypes, placements, meshes; not values), so that a rank given other inputs makes every
            rank raise the same meshfuse.ValueError instead of leaving the others waiting in a
            collective: "first" (default) on the first call of each signature, "always" on every
            call (one allgather of 16 bytes per rank), "never". Only in multi-rank worlds.
        abort_on_failure: in a multi-rank world, a failure once this rank's program is running (its
            inputs were accepted) ends the whole job with this rank's message (MPI_Abort), since
            the other ranks may be waiting for it in a collective; False raises the error on this
            rank only, and the others then wait until MESHFUSE_COMM_TIMEOUT. Errors in the inputs
            are raised either way.
        device: where the programs run: "cpu" (generated LLVM kernels, BLAS), "cuda" (NVRTC
            kernels, cuBLASLt, NCCL or host-staged MPI between ranks), or "auto" (default: cuda when
            a GPU is present). Inputs and outputs stay host arrays (numpy, or CPU torch tensors);
            "cuda" on a machine without a GPU raises meshfuse.RuntimeError at the first call.
        """
        if check_inputs not in CHECK_INPUTS:
            raise _C.ValueError(f"check_inputs must be one of {', '.join(map(repr, CHECK_INPUTS))}, got {check_inputs!r}")
        if device not in DEVICES:
            raise _C.ValueError(f"device must be one of {', '.join(map(repr, DEVICES))}, got {device!r}")
        self._check_inputs = check_inputs
        self._run_check = None  # check_inputs, or "never" in a world of one rank (known at the first call)
        self._define_fusion = define_fusion
        known = [o["name"] for o in _C.compile_options()]
        for name in compile_options:
            if name not in known:
                raise TypeError(f"FusionDefinitionWrapper() got an unexpected keyword argument {name!r} "
                                f"(compile options: {', '.join(known)})")
        _C.check_compile_options(compile_options)
        self._options = dict(compile_options=compile_options, trace=trace, abort_on_failure=abort_on_failure,
                             device=device)
        self._fd = None
        self._executor = None
        self._calls: dict = {}
        self._autodiff: dict = {}  # (input signature, wrt, save_all) -> _Autodiff
        self._last = None  # the call signature used last
        # Cached calls take no lock (Prepared.run is thread-safe); defining and compiling do, so
        # that threads calling one wrapper build one definition, one executor, one program each.
        self._compiling = threading.RLock()

    @property
    def definition(self) -> FusionDefinition:
        if self._fd is None:
            with self._compiling:
                if self._fd is None:
                    fd = FusionDefinition()
                    with fd:
                        self._define_fusion(fd)
                    self._fd = fd
        return self._fd

    def __call__(self, inputs) -> list:
        """Runs on this rank's blocks of `inputs` (a list of DTensors); returns the outputs."""
        if self._run_check is None:
            self._run_check = self._check_inputs if _world.world_size() > 1 else "never"
        call, locals_ = self._call_for(inputs, self._run_check)
        self._last = call
        return _wrap_outputs(call, call.prepared.run(locals_), inputs)

    def value_and_grad(self, inputs, wrt, grad_outputs=None, *, save_all: bool = False):
        """(outputs, grads): runs the definition on `inputs` and its reverse-mode derivative.

        wrt: indices of the inputs to differentiate with respect to (floating-point ones).
        grad_outputs: one DTensor per output, the seed of its vector-Jacobian product (for
            loss.backward(g)); None needs a single scalar output, whose seed is 1.
        save_all: keep every intermediate backward reads (default: GEMM and attention outputs
            are kept, cheap pointwise ops are recomputed in backward).

        The forward (extended with what backward needs) and the backward are ordinary fusions,
        run like any call: sharded inputs give derived gradient collectives. Each gradient is a
        DTensor on its input's mesh with its input's placements. See docs/training.md.
        """
        return self._autodiff_for(inputs, wrt, save_all).run(inputs, grad_outputs)

    def grad_plans(self, inputs, wrt, grad_outputs=None, *, save_all: bool = False) -> tuple:
        """(forward Plan, backward Plan) of value_and_grad(inputs, wrt, grad_outputs): what each
        rank runs, its collectives included. Runs the forward (the backward's inputs are its
        outputs), not the backward. ``saves`` on the returned backward Plan lists what backward
        reads and what it recomputes."""
        ad = self._autodiff_for(inputs, wrt, save_all)
        outs = ad.forward(inputs)
        args = ad.backward_args(inputs, outs, grad_outputs)
        bwd = ad.backward.plan(args)
        bwd.saves = ad.saves
        return ad.forward.plan(inputs), bwd

    def _autodiff_for(self, inputs, wrt, save_all):
        wrt = _check_wrt(wrt, len(self.definition.inputs))
        key = (self._signature(inputs)[0], wrt, save_all)
        ad = self._autodiff.get(key)
        if ad is None:
            with self._compiling:
                ad = self._autodiff.get(key)
                if ad is None:
                    ad = self._autodiff[key] = _Autodiff(self, inputs, wrt, save_all)
        return ad

    def last_trace(self) -> list:
        """This rank's timeline of the last call (needs trace=True): TraceEvents with name, kind
        (compute, communication, copy), stream, begin_us and end_us."""
        if not self._options["trace"]:
            raise _C.ValueError("this FusionDefinitionWrapper does not record timelines: create it with trace=True")
        return list(self._last.prepared.last_trace) if self._last is not None else []

    def write_trace(self, path: str):
        """Writes every rank's timeline of the last call to `path` (on rank 0) as Chrome/Perfetto
        trace JSON. Every rank must call it. Returns, on rank 0, each rank's fraction of
        communication time hidden behind compute (None on other ranks)."""
        return _C.write_trace(path, self.last_trace())

    def plan(self, inputs, wrt=None, *, optimizer=None, save_all: bool = False):
        """Compiles for `inputs`' signature without running; the returned Plan shows the program.

        With `wrt` (input indices), the plan of a whole training step (a TrainingPlan): the
        forward, the backward of the single scalar output and, with `optimizer` (a meshfuse.optim
        optimizer), its fused updates; ``collectives()`` entries then carry ``.phase``
        ("forward", "backward", "optimizer") and ``host_ir()`` shows every program. Runs the
        forward (the backward's inputs are its outputs)."""
        if wrt is None:
            if optimizer is not None:
                raise _C.ValueError("plan: an optimizer needs wrt (the inputs it trains)")
            return self._call_for(inputs)[0].plan
        from .training_plan import TrainingPlan
        fwd, bwd = self.grad_plans(inputs, wrt, save_all=save_all)
        programs = [("forward", fwd), ("backward", bwd)]
        if optimizer is not None:
            programs += [("optimizer", g.plan()) for g in optimizer.param_groups]
        return TrainingPlan(programs)

    @property
    def device(self) -> str:
        """Where the programs run: "cpu" or "cuda" ("auto" resolved); creates the backend if no
        call has yet."""
        with self._compiling:
            return self._executor_locked().device

    @property
    def cache_size(self) -> int:
        """Call signatures seen so far."""
        return len(self._calls)

    # ---- internals -------------------------------------------------------------------------

    def _call_for(self, inputs, check: str = "never"):
        """(the cached call of `inputs`' signature, compiled if new; their local tensors). With
        `check` "first"/"always", the ranks agree on the inputs first (see check_inputs)."""
        if check == "never":
            key, locals_, torch_meshes = self._signature(inputs)
            call = self._calls.get(key)
        else:
            try:
                key, locals_, torch_meshes = self._signature(inputs)
                call = self._calls.get(key)
                fields = None
                if check == "always" or call is None or not call.checked:
                    fields = self._describe(inputs, locals_)
            except Exception as e:  # the other ranks are in the check: fail them too, with this error
                check_same("FusionDefinitionWrapper", [("error", f"{type(e).__name__}: {e}")])
                raise
            if fields is not None:
                check_same("FusionDefinitionWrapper", fields)
                if call is not None:
                    call.checked = True
        if call is None:
            call = self._compile(key, inputs, locals_, torch_meshes)
            call.checked = check != "never"
        if call.bfloat16_outputs:  # numpy has no bfloat16: these outputs need torch (before running)
            i = call.bfloat16_outputs[0]
            require_bfloat16_support(f"output {i} ({self.definition.outputs[i].name})")
        return call, locals_

    def _signature(self, inputs):
        """(cache key, local tensors, torch meshes or None) of a list of DTensors."""
        if not isinstance(inputs, (list, tuple)):
            raise _C.ValueError(f"a FusionDefinitionWrapper takes a list of DTensors, got {type(inputs).__name__}")
        keys, locals_, torch_meshes = [], [], None
        for i, x in enumerate(inputs):
            if type(x) is DTensor:
                keys.append(x._key)
                locals_.append(x._cpp)
            elif torch_interop.is_torch_dtensor(x):
                spec = x._spec
                local = x._local_tensor
                # The global shape too: torch's shards may be uneven, so a local shape alone does not
                # tell 8 rows (4 + 4) from 7 (4 + 3), and ranks must not disagree on a cache hit.
                keys.append((tuple(local.shape), local.dtype, spec.mesh, spec.placements, spec.shape))
                try:
                    locals_.append(to_cpp(local))
                except _C.Error as e:
                    raise type(e)(f"input {i}: {e}") from None
                if torch_meshes is None:
                    torch_meshes = []
                if spec.mesh not in torch_meshes:
                    torch_meshes.append(spec.mesh)
            else:
                raise _C.ValueError(
                    f"input {i}: expected a meshfuse.DTensor or a torch.distributed.tensor.DTensor, "
                    f"got {type(x).__name__}")
        return tuple(keys), locals_, torch_meshes

    def _describe(self, inputs, locals_) -> list:
        """What this rank was given, as (label, value) strings that equal those of every other rank
        when the call is consistent: a rank outside an input's mesh (no local) states the dtype the
        definition expects; a local shape is stated only where it contradicts the global shape."""
        defined = self.definition.inputs
        fields = [("number of inputs", str(len(inputs)))]
        for i, (x, local) in enumerate(zip(inputs, locals_)):
            mesh, ps, shape = _layout(x)
            tv = defined[i] if i < len(defined) else None
            label = f"input {i}" + (f" ({tv.name})" if tv is not None else "")
            inside = local is not None and _world.rank() in mesh
            dtype = local.dtype if inside else (tv.dtype if tv is not None else None)
            value = f"{dtype.short_name if dtype is not None else '?'}{list(shape)} {list(ps)} on mesh {mesh}"
            if inside:
                want = local_shape(shape, mesh, ps, _world.rank())
                if tuple(local.shape) != want:
                    value += f" with local shape {list(local.shape)} (not {list(want)})"
            fields.append((label, value))
        return fields

    def _compile(self, key, inputs, locals_, torch_meshes) -> _Call:
        with self._compiling:
            call = self._calls.get(key)  # compiled by another thread meanwhile?
            return call if call is not None else self._compile_locked(key, inputs, locals_, torch_meshes)

    def _executor_locked(self):
        """The C++ executor (made on first use: it picks the backend); `_compiling` held."""
        if self._executor is None:
            self._executor = _C.Executor(self.definition._fusion, **self._options)
        return self._executor

    def _compile_locked(self, key, inputs, locals_, torch_meshes) -> _Call:
        executor = self._executor_locked()
        layouts = []
        for i, (x, local) in enumerate(zip(inputs, locals_)):
            mesh, ps, shape = _layout(x)
            check_in_world(mesh, _world.world_size(), f"input {i}")
            # A rank outside the input's mesh holds no local: any dtype keys the executor's cache.
            dtype = local.dtype if local is not None else _C.DataType.Float
            layouts.append((mesh, list(ps), list(shape), dtype))
        prepared = executor.prepare(layouts)  # checks the number of inputs, static sizes
        call = _Call(prepared, torch_meshes)
        self._calls[key] = call
        return call


def compile_options() -> list[dict]:
    """The compiler's options, which FusionDefinitionWrapper takes as keyword arguments (and the
    CLI as --NAME flags): one dict per option with its name, type ("choice", "count" or "flag"),
    choices, default and help, from the one C++ table (meshfuse/options.h)."""
    convert = {"flag": lambda v: v == "true", "count": int, "choice": str}
    return [dict(o, default=convert[o["type"]](o["default"])) for o in _C.compile_options()]


def _compile_options_doc() -> str:
    """The compile options' part of FusionDefinitionWrapper's docstring, from the C++ table."""
    import textwrap
    lines = []
    for o in compile_options():
        choices = f" ({' | '.join(o['choices'])})" if o["choices"] else ""
        text = f"{o['name']}={o['default']!r}{choices}: {o['help']}."
        lines += textwrap.wrap(text, width=96, initial_indent=" " * 12, subsequent_indent=" " * 16)
    return "\n".join(lines)


FusionDefinitionWrapper.__init__.__doc__ = FusionDefinitionWrapper.__init__.__doc__.replace(
    "{compile_options}", _compile_options_doc())


def _check_wrt(wrt, n_inputs: int) -> tuple:
    if isinstance(wrt, int):
        wrt = [wrt]
    wrt = tuple(wrt)
    for i in wrt:
        if not isinstance(i, int) or not 0 <= i < n_inputs:
            raise _C.ValueError(f"value_and_grad: wrt must list input indices in [0, {n_inputs}), got {i!r}")
    if len(set(wrt)) != len(wrt) or not wrt:
        raise _C.ValueError(f"value_and_grad: wrt must list distinct input indices, got {list(wrt)}")
    return wrt


def _wrapper_of(fusion, owner: FusionDefinitionWrapper | None) -> FusionDefinitionWrapper:
    """A wrapper around an already built C++ fusion, with `owner`'s options (or the defaults)."""
    if owner is None:
        w = FusionDefinitionWrapper(lambda fd: None)
    else:
        o = owner._options
        w = FusionDefinitionWrapper(lambda fd: None, check_inputs=owner._check_inputs, trace=o["trace"],
                                    abort_on_failure=o["abort_on_failure"], device=o["device"],
                                    **o["compile_options"])
    fd = FusionDefinition.__new__(FusionDefinition)
    fd._fusion = fusion
    fd.ops = None  # built, not to be extended
    w._fd = fd
    return w


class _Autodiff:
    """The forward-with-saves and backward wrappers of one (input signature, wrt)."""

    def __init__(self, owner: FusionDefinitionWrapper, inputs, wrt, save_all):
        layouts = []
        for x in inputs:
            mesh, ps, _ = _layout(x)
            layouts.append((mesh, list(ps)))
        outputs = list(range(len(owner.definition.outputs)))
        fwd, bwd, self.sources, self.saves = _C.differentiate(owner.definition._fusion, outputs, list(wrt), layouts,
                                                              save_all)
        self.output_names = [tv.name for tv in owner.definition.outputs]
        self.forward = _wrapper_of(fwd, owner)
        self.backward = _wrapper_of(bwd, owner)
        self.n_outputs = len(outputs)

    def run(self, inputs, grad_outputs):
        outs = self.forward(inputs)
        return outs[:self.n_outputs], self.backward(self.backward_args(inputs, outs, grad_outputs))

    def backward_args(self, inputs, outs, grad_outputs) -> list:
        """The backward's inputs: saved forward inputs and outputs, then the seeds."""
        seeds = self._seeds(outs[:self.n_outputs], grad_outputs)
        return [inputs[index] if kind == "input" else outs[index] if kind == "output" else seeds[index]
                for kind, index, _ in self.sources]

    def _seeds(self, values, grad_outputs) -> list:
        if grad_outputs is None:
            if len(values) != 1 or tuple(values[0].shape) != ():
                shapes = ", ".join(f"output {i} ({n}) has shape {list(v.shape)}"
                                   for i, (n, v) in enumerate(zip(self.output_names, values)))
                raise _C.ValueError(f"value_and_grad: without grad_outputs the definition must have one scalar "
                                    f"output (its seed is 1), but {shapes}: pass grad_outputs, one per output")
            return [_ones_like_scalar(values[0])]
        if not isinstance(grad_outputs, (list, tuple)) or len(grad_outputs) != len(values):
            n = len(grad_outputs) if isinstance(grad_outputs, (list, tuple)) else type(grad_outputs).__name__
            raise _C.ValueError(f"value_and_grad: grad_outputs must list one DTensor per output ({len(values)}), got {n}")
        for i, (g, v) in enumerate(zip(grad_outputs, values)):
            if tuple(g.shape) != tuple(v.shape):
                raise _C.ShapeError(f"value_and_grad: grad_outputs[{i}] has shape {list(g.shape)} but output {i} "
                                    f"({self.output_names[i]}) has shape {list(v.shape)}")
        return list(grad_outputs)


def _ones_like_scalar(value):
    """The seed 1 of a scalar output, replicated on the output's mesh, of its kind and dtype."""
    if torch_interop.is_torch_dtensor(value):
        import torch
        from torch.distributed.tensor import DTensor as TorchDTensor, Replicate as TorchReplicate
        mesh = value.device_mesh
        return TorchDTensor.from_local(torch.ones((), dtype=value.dtype), mesh, [TorchReplicate()] * mesh.ndim,
                                       run_check=False)
    from .dtensor import distribute_tensor
    from .mesh import Replicate
    import numpy as np
    local = value.to_local()
    if value.dtype == _C.DataType.BFloat16:
        import torch
        one = torch.ones((), dtype=torch.bfloat16)
    else:
        one = np.ones((), dtype=np.asarray(local).dtype if local is not None else np.float32)
    return distribute_tensor(one, value.device_mesh, [Replicate()] * value.device_mesh.ndim)


def _layout(x) -> tuple:
    """(meshfuse DeviceMesh, placements, global shape) of a meshfuse or torch DTensor."""
    if type(x) is DTensor:
        return x.device_mesh, x.placements, x.shape
    return (torch_interop.mesh_from_torch(x.device_mesh), torch_interop.placements_from_torch(x.placements),
            tuple(x.shape))


def _wrap_outputs(call: _Call, outs: list, inputs) -> list:
    if call.torch_out:
        return _wrap_torch(call, outs)
    like = inputs[0]._local if inputs else None
    convert = converter_like(like)
    result = []
    for i, (out, (mesh, ps, shape, dtype, key, _)) in enumerate(zip(outs, call.outputs)):
        if out is None:  # this rank is outside the output's mesh: an empty local, as in torch
            result.append(DTensor._make(empty_like_kind(like, dtype, len(shape)), None, mesh, ps, shape, key))
        else:
            c = convert if i not in call.bfloat16_outputs else converter_like(like, dtype)
            result.append(DTensor._make(c(out), out, mesh, ps, shape, key))
    return result


def _wrap_torch(call: _Call, outs: list) -> list:
    import torch

    result = []
    for out, (mesh, ps, shape, dtype, key, torch_layout) in zip(outs, call.outputs):
        local = torch.from_dlpack(out) if out is not None else \
            empty_like_kind(torch.empty(0), dtype, len(shape))
        result.append(torch_interop.make_dtensor(local, torch_layout))
    return result
