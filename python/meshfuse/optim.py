"""Optimizers whose step is one fused meshfuse program updating parameters in place.

    opt = meshfuse.optim.AdamW([w1, w2], lr=1e-3)
    ...
    (loss,), grads = fdw.value_and_grad(inputs, wrt=[1, 2])
    opt.step(grads)          # w1, w2 (their local blocks) are updated in place

Parameters are meshfuse or torch DTensors. Each parameter group (a list of parameters, or a dict
{"params": [...], "lr": ...} overriding the defaults, as in torch.optim) is updated by ONE fusion
of pointwise ops whose outputs are aliased to the parameter and state buffers (docs/training.md):
no copy, no allocation, state placed like its parameter (ZeRO-style sharding follows from
sharded parameters), compiled once (the step count and learning rate enter as scalar inputs).
bf16/f16 parameters keep an f32 master copy and f32 state. Semantics: torch.optim.SGD (dampening
0) and torch.optim.AdamW (amsgrad off). A learning-rate schedule sets ``group["lr"]`` of
``opt.param_groups`` between steps, as in torch, without recompiling.
"""

from __future__ import annotations

import numpy as np

from . import _C, torch_interop
from ._locals import is_torch_tensor, to_cpp
from .dtensor import DTensor

__all__ = ["SGD", "AdamW"]


def _describe(x) -> str:
    return type(x).__module__ + "." + type(x).__qualname__


def _check_param(name: str, i: int, p):
    """A parameter is a floating-point meshfuse or torch DTensor (ValueError / DtypeError)."""
    if not isinstance(p, DTensor) and not torch_interop.is_torch_dtensor(p):
        raise _C.ValueError(f"{name}: params[{i}] is a {_describe(p)}, not a parameter: pass meshfuse or torch "
                            "DTensors (meshfuse.distribute_tensor / DTensor.from_local)")
    dtype = p.dtype if isinstance(p, DTensor) else _torch_dtype(p)
    if dtype not in (_C.DataType.Float, _C.DataType.BFloat16, _C.DataType.Half):
        raise _C.DtypeError(f"{name}: params[{i}] is {dtype.short_name if dtype is not None else p.dtype}: only "
                            "floating-point tensors can be optimized")


def _make_updatable(p):
    """A meshfuse DTensor's local block must be the memory the programs read and write: a
    read-only or non-contiguous numpy block (distribute_tensor gives read-only views) is replaced,
    once, by a writable copy that the DTensor then owns, so in-place updates are visible through
    to_local() and used by every later call."""
    local = p._local
    if isinstance(local, np.ndarray) and not (local.flags.writeable and local.flags.c_contiguous):
        local = np.array(local, order="C", copy=True)
        p._local, p._cpp = local, to_cpp(local)


def _torch_dtype(p):
    from ._locals import torch_dtypes
    return torch_dtypes().get(p.dtype)


def _local(p):
    return p.to_local() if isinstance(p, DTensor) else p._local_tensor


def _like(p, local):
    """A DTensor of this rank's block `local`, laid out as parameter `p` (same kind, mesh, placements)."""
    if isinstance(p, DTensor):
        return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape)
    from torch.distributed.tensor import DTensor as TorchDTensor
    return TorchDTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                   stride=p.stride())


def _f32_like(p, copy: bool):
    """An f32 block of p's local shape: zeros, or (copy) p's values."""
    local = _local(p)
    if is_torch_tensor(local):
        import torch
        return local.detach().float().clone() if copy else torch.zeros(local.shape, dtype=torch.float32)
    return np.asarray(local, dtype=np.float32).copy() if copy else np.zeros(local.shape, dtype=np.float32)


def _scalar_like(p, value: float):
    """A replicated scalar on p's mesh, of p's kind."""
    if not isinstance(p, DTensor):
        import torch
        from torch.distributed.tensor import DTensor as TorchDTensor, Replicate as TorchReplicate
        mesh = p.device_mesh
        return TorchDTensor.from_local(torch.tensor(value, dtype=torch.float32), mesh,
                                       [TorchReplicate()] * mesh.ndim, run_check=False)
    from .mesh import Replicate
    return DTensor.from_local(np.array(value, dtype=np.float32), p.device_mesh,
                              [Replicate()] * p.device_mesh.ndim)


class _Group:
    """One parameter group: its options, its fused update program and its state. Reads like a
    torch.optim parameter group (``group["lr"]``, ``group["params"]``); only "lr" can be set, since
    it enters the program as a scalar input each step while the other options are compiled in."""

    def __init__(self, kind: str, name: str, params: list, user_options: dict, options: dict):
        from .wrapper import _wrapper_of
        self.kind, self.name, self.params, self.options = kind, name, params, options
        self._user_options = user_options
        types = [(list(p.shape), p.dtype if isinstance(p, DTensor) else _torch_dtype(p)) for p in params]
        fusion, self.layout, self.state_names, self.scalar_names = _C.optimizer_step(kind, options, types)
        self.program = _wrapper_of(fusion, None)
        self.state = []  # per parameter: {"master": ..., "exp_avg": ...}, made at the first step
        self.steps = 0

    def __getitem__(self, key: str):
        return self.params if key == "params" else self._user_options[key]

    def __setitem__(self, key: str, value):
        if key != "lr":
            raise _C.ValueError(f"{self.name}: only a parameter group's 'lr' can change between steps (the other "
                                f"options are compiled into its update program), not {key!r}")
        self._user_options["lr"] = self.options["lr"] = float(value)

    def keys(self):
        return ["params"] + list(self._user_options)

    def _init_state(self):
        for p, (has_master, _, _) in zip(self.params, self.layout):
            s = {"master": _like(p, _f32_like(p, copy=True))} if has_master else {}
            for name in self.state_names:
                s[name] = _like(p, _f32_like(p, copy=False))
            self.state.append(s)

    def _args(self, grads: list) -> list:
        args = []
        for p, g, s in zip(self.params, grads, self.state):
            args += [p] + ([s["master"]] if "master" in s else []) + [g] + [s[n] for n in self.state_names]
        scalars = _C.optimizer_scalars(self.kind, self.options, self.steps + 1)
        return args + [_scalar_like(self.params[0], v) for v in scalars]

    def plan(self):
        """The update's Plan (gradients are laid out as their parameters: those stand in)."""
        if not self.state:
            self._init_state()
        return self.program.plan(self._args(self.params))

    def step(self, grads: list):
        if not self.state:
            self._init_state()
        self.program(self._args(grads))  # every output is aliased to its input: parameters and state change in place
        self.steps += 1


class _Optimizer:
    _kind = ""
    _name = ""

    def __init__(self, params, defaults: dict):
        params = list(params)
        if not params:
            raise _C.ValueError(f"{self._name}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        index = 0
        for g in groups:
            if not isinstance(g, dict) or "params" not in g:
                raise _C.ValueError(f"{self._name}: parameter groups must all be dicts with 'params'")
            ps = list(g["params"])
            for p in ps:
                _check_param(self._name, index, p)
                if isinstance(p, DTensor):
                    _make_updatable(p)
                index += 1
            options = dict(defaults)
            options.update({k: v for k, v in g.items() if k != "params"})
            self.param_groups.append(_Group(self._kind, self._name, ps, options, self._cpp_options(options)))

    @staticmethod
    def _cpp_options(options: dict) -> dict:
        return options

    @property
    def state(self) -> list:
        """Per parameter (groups in order): its state DTensors by name ("master", "exp_avg", ...)."""
        return [s for g in self.param_groups for s in g.state]

    def step(self, grads):
        """Updates every parameter in place with `grads` (one DTensor per parameter, in order,
        laid out as its parameter): one fused program per parameter group."""
        grads = list(grads)
        n = sum(len(g.params) for g in self.param_groups)
        if len(grads) != n:
            raise _C.ValueError(f"{self._name}.step: got {len(grads)} gradients for {n} parameters")
        at = 0
        for g in self.param_groups:
            mine = grads[at:at + len(g.params)]
            for i, (p, d) in enumerate(zip(g.params, mine)):
                if tuple(d.shape) != tuple(p.shape):
                    raise _C.ShapeError(f"{self._name}.step: grads[{at + i}] has shape {list(d.shape)} but its "
                                        f"parameter has shape {list(p.shape)}")
            g.step(mine)
            at += len(g.params)


class SGD(_Optimizer):
    """torch.optim.SGD (dampening 0): d = g + weight_decay p; b = momentum b + d; d = d + momentum b
    (nesterov) or b; p -= lr d."""

    _kind, _name = "sgd", "SGD"

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))


class AdamW(_Optimizer):
    """torch.optim.AdamW: decoupled weight decay, bias-corrected moments; eps may be 0."""

    _kind, _name = "adamw", "AdamW"

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @staticmethod
    def _cpp_options(options: dict) -> dict:
        o = dict(options)
        o["beta1"], o["beta2"] = o.pop("betas")
        return o
