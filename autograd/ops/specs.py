"""One autograd Function per op spec (helios.kernels.contract.spec) with `autograd=True`, in `FUNCTIONS` under
the spec's name (`FUNCTIONS["gelu"]`, a Function class named Gelu): forward and VJP are the spec's op functions.
Scalars are keyword arguments of `apply`; gradients the spec says have sinks (a norm's dw and db) are added straight
into the parameters' gradient arena (`ctx.grad_sink`), so accumulating them costs no dispatch; gradients the spec says
fold (`folds`: a norm's dx) are computed as their own plus the one already pending for that input (`ctx.pending_grad`,
returned as `Folded`), which saves the engine's add. Index arguments
(`indices`: ids, targets) get no gradient, and keyword arguments that only backward takes (`backward_kwargs`, read
from its signature: the embedding's sorted plan) are kept from `apply` for it. A backward that can skip gradients
(`needs`: matmul's, the embedding's) computes only those its inputs need. A new spec needs no edit here."""

from __future__ import annotations

from autograd.function import ACCUMULATED, Folded, Function
from helios.kernels.contract.spec import OpSpec, as_tuple, specs


def _fits(pending, inp) -> bool:
    """Whether a pending gradient can be folded into the gradient of input `inp`: same shape and dtype."""
    return tuple(pending.shape) == tuple(inp.operand.shape) and pending.dtype == inp.operand.dtype


def spec_function(spec: OpSpec) -> type[Function]:
    """A Function returning the first result of spec.forward(*args, **scalars), saving what spec.saves names
    (statistics such as mean and rstd as intermediates) and returning spec.backward(*saved, dy): one gradient
    per float arg (None for index args), ACCUMULATED for one written into its sink, Folded for one that includes the
    gradient pending for its input (spec.folds)."""
    floats = [k for k, a in enumerate(spec.args) if a not in spec.indices]  # the arg each gradient belongs to
    sunk = [(k, g) for k, g in zip(floats, spec.grads, strict=True) if g in spec.sinks]
    folded = [(spec.args.index(a), kw) for a, kw in spec.folds.items()]  # (arg index, backward keyword)
    backward_only = spec.backward_kwargs  # read from backward's signature once, not at every apply

    def forward(ctx, *args, **scalars):
        if len(args) > len(spec.args):  # scalars given positionally, in the spec's order
            scalars |= dict(zip(spec.scalars, args[len(spec.args):], strict=False))
            args = args[:len(spec.args)]
        ctx.backward_kwargs = {k: scalars.pop(k) for k in backward_only if k in scalars}
        ctx.scalars = spec.grad_kwargs(scalars)
        ctx.flags = {flag: args[spec.args.index(arg)] is not None for arg, flag in spec.optional.items()}
        outputs = spec.forward(*args, **scalars)
        ctx.save_for_backward(*spec.saved(args, outputs))
        return as_tuple(outputs)[0]

    def backward(ctx, dy):
        sinks = {f"{g}_out": ctx.grad_sink(k) for k, g in sunk}
        extra = {**sinks, "accumulate": True} if sunk else {}
        if spec.needs:  # compute only the gradients the inputs need
            extra["needs"] = tuple(bool(ctx.needs_input_grad[k]) for k in floats)
        pending = {k: ctx.pending_grad(k) for k, _ in folded}
        pending = {k: p for k, p in pending.items() if p is not None and _fits(p, ctx.inputs[k])}
        extra |= {kw: pending[k] for k, kw in folded if k in pending}
        computed = as_tuple(spec.backward(*ctx.saved_tensors, dy, **ctx.scalars, **ctx.flags, **ctx.backward_kwargs,
                                          **extra))
        grads = [None] * len(spec.args)
        for k, g in zip(floats, computed, strict=True):
            grads[k] = g
        for k, g in sunk:
            if not ctx.needs_input_grad[k]:
                grads[k] = None
            elif sinks[f"{g}_out"] is not None:
                grads[k] = ACCUMULATED
        for k in pending:
            grads[k] = Folded(grads[k]) if grads[k] is not None else None
        return tuple(grads)

    name = "".join(part.capitalize() for part in spec.name.split("_"))
    return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward),
                                    "__doc__": spec.doc})


# Spec name -> its Function: derived from the registry, so a new spec needs no line here (and no module-level name:
# callers index this table).
FUNCTIONS: dict[str, type[Function]] = {spec.name: spec_function(spec) for spec in specs() if spec.derives_function}
