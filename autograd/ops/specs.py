"""One autograd Function per op spec (helios.kernels.spec) with `autograd=True`, named after it (Exp, Gelu,
Softmax, ...): forward and VJP are the spec's op functions. A new spec needs no edit here."""

from __future__ import annotations

from autograd.function import Function
from helios.kernels.spec import OpSpec, as_tuple, specs


def spec_function(spec: OpSpec) -> type[Function]:
    """A Function returning the first result of spec.forward(*args), saving what spec.saves names (statistics
    such as mean and rstd as intermediates) and returning spec.backward(*saved, dy): one gradient per arg."""

    def forward(ctx, *args):
        outputs = spec.forward(*args)
        ctx.save_for_backward(*spec.saved(args, outputs))
        return as_tuple(outputs)[0]

    def backward(ctx, dy):
        return spec.backward(*ctx.saved_tensors, dy)

    return type(spec.name.capitalize(), (Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": spec.doc})


FUNCTIONS = {spec.name: spec_function(spec) for spec in specs() if spec.autograd and spec.backward is not None}
globals().update({fn.__name__: fn for fn in FUNCTIONS.values()})
