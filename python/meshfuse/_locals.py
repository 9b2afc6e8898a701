"""Local tensors of any kind <-> meshfuse's C++ Tensor, zero-copy through DLPack.

A DTensor's local tensor is whatever the user gave: a numpy array, a torch tensor or any DLPack
producer. meshfuse views it without a copy and returns outputs of the same kind (numpy in,
numpy out; torch in, torch out). The one exception is bfloat16, which numpy lacks: a bfloat16
output of numpy inputs is a torch tensor (what nvFuser returns too), so torch is imported for
it, and only for it; without torch such a program is a DtypeError when it is compiled.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C

_NUMPY_DTYPES = {
    np.dtype(np.float32): _C.DataType.Float,
    np.dtype(np.float16): _C.DataType.Half,
    np.dtype(np.int64): _C.DataType.Int64,
    np.dtype(np.bool_): _C.DataType.Bool,
}


def is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_cpp(local) -> _C.Tensor:
    """A C++ view of `local` (made contiguous first if it is not)."""
    if isinstance(local, np.ndarray):
        if not local.flags.c_contiguous or not local.flags.writeable:
            # numpy cannot export read-only arrays through (unversioned) DLPack: copy those.
            local = np.array(local, order="C", copy=True)
        if local.dtype not in _NUMPY_DTYPES:
            raise _C.DtypeError(
                f"unsupported numpy dtype {local.dtype}: meshfuse takes float32, float16, int64 and bool arrays "
                "(cast float64 data with .astype(numpy.float32))")
        return _C.Tensor.from_dlpack(local)
    if is_torch_tensor(local):
        torch = sys.modules["torch"]
        if local.requires_grad:
            local = local.detach()
        if not local.is_contiguous():
            local = local.contiguous()
        return _C.Tensor.from_dlpack(torch.utils.dlpack.to_dlpack(local))
    if isinstance(local, _C.Tensor):
        return local
    return _C.Tensor.from_dlpack(local)


def torch_module():
    """torch, imported if it is installed but not imported yet; None when it is not installed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        import torch
    except ImportError:
        return None
    return torch


def require_bfloat16_support(what: str) -> None:
    """Raises the DtypeError of a bfloat16 tensor that must become numpy-like without torch."""
    if torch_module() is None:
        raise _C.DtypeError(
            f"{what} is bfloat16, which numpy cannot represent, and torch (whose tensors meshfuse returns for "
            "bfloat16) is not installed: cast it to DataType.Float in the definition (fd.ops.cast), or install "
            "torch")


def converter_like(local, dtype: _C.DataType | None = None):
    """A function making a C++ Tensor (of `dtype`, when known) into a tensor of `local`'s kind:
    numpy for unknown kinds, except that bfloat16, which numpy lacks, becomes torch."""
    if is_torch_tensor(local):
        return sys.modules["torch"].from_dlpack
    if dtype == _C.DataType.BFloat16:
        torch = torch_module()
        if torch is None:
            require_bfloat16_support("a tensor")
        return torch.from_dlpack
    return np.from_dlpack


def to_numpy(local) -> np.ndarray:
    """`local` as a numpy array (bfloat16, which numpy lacks, becomes float32)."""
    if isinstance(local, np.ndarray):
        return local
    if is_torch_tensor(local):
        t = local.detach().cpu()
        if t.dtype == sys.modules["torch"].bfloat16:
            t = t.float()
        return t.numpy()
    if isinstance(local, _C.Tensor) and local.dtype == _C.DataType.BFloat16:
        return to_numpy(converter_like(None, local.dtype)(local))
    return np.from_dlpack(local)


def empty_like_kind(like, dtype: _C.DataType, ndim: int):
    """An empty local tensor of `like`'s kind: what a rank outside a tensor's mesh holds."""
    if is_torch_tensor(like) or dtype == _C.DataType.BFloat16:
        torch = torch_module()
        if torch is None:
            require_bfloat16_support("a tensor")
        tdt = {v: k for k, v in torch_dtypes().items()}[dtype]
        return torch.empty((0,) * ndim, dtype=tdt)
    ndt = {v: k for k, v in _NUMPY_DTYPES.items()}.get(dtype, np.dtype(np.float32))
    return np.empty((0,) * ndim, dtype=ndt)


def torch_dtypes() -> dict:
    torch = torch_module()
    return {torch.float32: _C.DataType.Float, torch.bfloat16: _C.DataType.BFloat16,
            torch.float16: _C.DataType.Half, torch.int64: _C.DataType.Int64, torch.bool: _C.DataType.Bool}
