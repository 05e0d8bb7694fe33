"""One autograd Function per op spec (helios.kernels.spec) with `autograd=True`, named after it (Exp, Gelu,
Softmax, LayerNorm, ...): forward and VJP are the spec's op functions. Scalars are keyword arguments of `apply`;
gradients the spec says have sinks (a norm's dw and db) are added straight into the parameters' gradient arena
(`ctx.grad_sink`), so accumulating them costs no dispatch. A new spec needs no edit here."""

from __future__ import annotations

from autograd.function import ACCUMULATED, Function
from helios.kernels.spec import OpSpec, as_tuple, specs


def spec_function(spec: OpSpec) -> type[Function]:
    """A Function returning the first result of spec.forward(*args, **scalars), saving what spec.saves names
    (statistics such as mean and rstd as intermediates) and returning spec.backward(*saved, dy): one gradient
    per arg, ACCUMULATED for one written into its sink."""
    sunk = [(k, g) for k, g in enumerate(spec.grads) if g in spec.sinks]

    def forward(ctx, *args, **scalars):
        if len(args) > len(spec.args):  # scalars given positionally, in the spec's order
            scalars |= dict(zip(spec.scalars, args[len(spec.args):], strict=False))
            args = args[:len(spec.args)]
        ctx.scalars = spec.grad_kwargs(scalars)
        ctx.flags = {flag: args[spec.args.index(arg)] is not None for arg, flag in spec.optional.items()}
        outputs = spec.forward(*args, **scalars)
        ctx.save_for_backward(*spec.saved(args, outputs))
        return as_tuple(outputs)[0]

    def backward(ctx, dy):
        sinks = {f"{g}_out": ctx.grad_sink(k) for k, g in sunk}
        extra = {**sinks, "accumulate": True} if sunk else {}
        grads = list(as_tuple(spec.backward(*ctx.saved_tensors, dy, **ctx.scalars, **ctx.flags, **extra)))
        for k, g in sunk:
            if not ctx.needs_input_grad[k]:
                grads[k] = None
            elif sinks[f"{g}_out"] is not None:
                grads[k] = ACCUMULATED
        return tuple(grads)

    name = "".join(part.capitalize() for part in spec.name.split("_"))
    return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward),
                                    "__doc__": spec.doc})


FUNCTIONS = {spec.name: spec_function(spec) for spec in specs() if spec.autograd and spec.backward is not None}
globals().update({fn.__name__: fn for fn in FUNCTIONS.values()})
