"""``fd.ops``: one Python function per op of meshfuse's op table, generated from it.

Each function takes the op's operands then its attributes, by position or by name, in the
table's order (which follows PyTorch: ``linear(x, weight, bias=None)``,
``layer_norm(x, weight=None, bias=None, eps=1e-5)``, ``sdpa(query, key, value, is_causal=False)``,
``softmax(x, dim)``, ``reshape(x, shape)``). Operands are TensorViews or, for pointwise ops,
Python numbers. Passing ``None`` for an attribute keeps its default. ``sdpa(..., scale=None)``
(the default, as in torch) means 1/sqrt(head size); the op table spells that default 0, so an
explicit ``scale=0`` is rejected rather than silently read as 1/sqrt(head size). The reductions ``sum``, ``max`` and ``mean`` also take
torch's ``keepdim``, and a single int (or ``dim=``) for ``dims``. ``help(fd.ops.linear)`` shows a signature.
"""

from __future__ import annotations

import inspect

from . import _C

# Reductions take torch's keepdim, which is not an attribute of the op: it re-inserts the
# reduced dims with a broadcast_in_dim (C++ ops::sum/max/mean).
_REDUCTIONS = frozenset({"sum", "max", "mean"})
# Names a torch or nvFuser user may reach for, mapped to the table's attribute names.
_ATTR_ALIASES = {"reshape": {"new_shape": "shape"}, "permute": {"permutation": "dims"},
                 **{r: {"dim": "dims"} for r in _REDUCTIONS}}
# Attributes whose table default is a sentinel meaning "derive it": Python shows torch's None, and
# refuses the sentinel itself, which a user would read literally (scale=0: every score 0).
_NONE_DEFAULTS = {op: {"scale": "1/sqrt(head size)"} for op in ("sdpa", "sdpa_lse", "sdpa_grad")}


def _signature(schema) -> inspect.Signature:
    params, seen_default, keyword_only = [], False, False
    for o in schema["operands"]:
        default = None if o["optional"] else inspect.Parameter.empty
        seen_default |= o["optional"]
        params.append(inspect.Parameter(o["name"], inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    for a in schema["attrs"]:
        default = inspect.Parameter.empty if a["required"] else a["default"]
        if a["name"] in _NONE_DEFAULTS.get(schema["name"], {}):
            default = None
        # A required attribute after an optional operand can only be given by name (sdpa_grad's
        # wrt after lse and delta), and so can every attribute after it.
        keyword_only |= a["required"] and seen_default
        kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        seen_default |= not a["required"]
        params.append(inspect.Parameter(a["name"], kind, default=default))
    if schema["name"] in _REDUCTIONS:
        params.append(inspect.Parameter("keepdim", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False))
    return inspect.Signature(params)


def _make_op(schema):
    name = schema["name"]
    sig = _signature(schema)
    operand_names = [o["name"] for o in schema["operands"]]
    attr_names = [a["name"] for a in schema["attrs"]]
    aliases = _ATTR_ALIASES.get(name, {})
    sentinels = {a["name"]: (a["default"], _NONE_DEFAULTS[name][a["name"]]) for a in schema["attrs"]
                 if a["name"] in _NONE_DEFAULTS.get(name, {})}

    def op(self, *args, **kwargs):
        for alias, real in aliases.items():
            if alias in kwargs:
                kwargs[real] = kwargs.pop(alias)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        for attr, (sentinel, meaning) in sentinels.items():
            if a[attr] is not None and a[attr] == sentinel:
                raise _C.ValueError(f"{name}: {attr}={a[attr]!r} is not supported (meshfuse reads it as the default, "
                                    f"{meaning}): pass {attr}=None for that, or a nonzero {attr}")
        if name in _REDUCTIONS:
            dims = [a["dims"]] if isinstance(a["dims"], int) else a["dims"]  # torch's sum(x, 1)
            return _C.reduce(name, a["x"], dims, a["keepdim"])
        return _C.apply(self._fusion, name, [a[n] for n in operand_names], {n: a[n] for n in attr_names})

    op.__name__ = op.__qualname__ = name
    op.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *sig.parameters.values()])
    op.__doc__ = f"meshfuse op `{name}{sig}` (see include/meshfuse/ir/ops.def for its semantics)."
    return op


class Ops:
    """The ops of one FusionDefinition (``fd.ops``); generated from the op table."""

    def __init__(self, fusion: _C.Fusion):
        self._fusion = fusion


for _schema in _C.op_schemas():
    setattr(Ops, _schema["name"], _make_op(_schema))
del _schema
