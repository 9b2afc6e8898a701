"""meshfuse.torch_interop.autograd: a fusion as a torch.autograd.Function.

    f = meshfuse.torch_interop.autograd(fdw)
    (loss,) = f(x, w1, w2)        # meshfuse's forward program (extended with what backward needs)
    loss.backward()               # meshfuse's backward program; w1.grad, w2.grad filled
    torch_optimizer.step()

The inputs are plain torch tensors (one rank: they run on a one-device mesh) or torch DTensors
(any mesh and placements). Gradients are computed for the inputs that require them, each laid out
as its input. The saved tensors are the forward program's extra outputs, held by the autograd
graph until backward runs.
"""

from __future__ import annotations

from . import _C


def autograd(fdw):
    """A callable running `fdw` (a FusionDefinitionWrapper) inside torch's autograd: returns the
    definition's outputs as a tuple of torch tensors (DTensors for DTensor inputs)."""
    import torch

    from . import torch_interop
    from .dtensor import DTensor
    from .mesh import DeviceMesh, Replicate

    one_device = DeviceMesh([0])

    def as_meshfuse(x):
        """A plain tensor as a replicated DTensor on a one-device mesh; DTensors as they are."""
        if torch_interop.is_torch_dtensor(x):
            return x
        if not isinstance(x, torch.Tensor):
            raise _C.ValueError(f"torch_interop.autograd: inputs must be torch tensors or DTensors, got "
                                f"{type(x).__name__}")
        return DTensor.from_local(x.detach(), one_device, [Replicate()])

    def as_torch(y, plain: bool):
        return y.to_local() if plain and isinstance(y, DTensor) else y

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            plain = not any(torch_interop.is_torch_dtensor(x) for x in inputs)
            args = [as_meshfuse(x) for x in inputs]
            wrt = [i for i, need in enumerate(ctx.needs_input_grad) if need]
            ctx.plain, ctx.wrt, ctx.n_inputs = plain, wrt, len(inputs)
            if not wrt:  # nothing to differentiate: the plain forward program
                return tuple(as_torch(y, plain) for y in fdw(args))
            ad = fdw._autodiff_for(args, wrt, False)
            outs = ad.forward(args)
            ctx.ad, ctx.args, ctx.outs = ad, args, outs
            return tuple(as_torch(y, plain) for y in outs[:ad.n_outputs])

        @staticmethod
        def backward(ctx, *grad_outputs):
            seeds = []
            for g, y in zip(grad_outputs, ctx.outs[:ctx.ad.n_outputs]):
                if g is None:  # an output the loss does not use: a zero seed
                    g = torch.zeros(tuple(y.shape), dtype=as_torch(y, ctx.plain).dtype) if ctx.plain else \
                        torch.zeros_like(y)
                seeds.append(as_meshfuse(g.contiguous()) if ctx.plain else g)
            grads = ctx.ad.backward(ctx.ad.backward_args(ctx.args, ctx.outs, seeds))
            result = [None] * ctx.n_inputs
            for i, g in zip(ctx.wrt, grads):
                result[i] = as_torch(g, ctx.plain)
            ctx.ad = ctx.args = ctx.outs = None  # the saved tensors go with the graph
            return tuple(result)

    def call(*inputs):
        return _Function.apply(*inputs)

    return call
