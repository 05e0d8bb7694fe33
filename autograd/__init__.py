"""A tape-based reverse-mode autograd over helios: every op's forward and VJP are lazy GPU work.

    import autograd
    x = autograd.tensor(np.ones((3, 4)), requires_grad=True)
    y = autograd.functional.gelu(x).sum(axis=None)
    y.backward(); x.grad.numpy()
"""

from autograd import functional
from autograd.engine import run_backward
from autograd.function import ACCUMULATED, Context, Folded, Function
from autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from autograd.parameter import Parameter, ParameterArena
from autograd.tensors import Tensor, tensor


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool = False):
    """d(outputs)/d(inputs) as a tuple of Tensors (None where an input is unreachable); `.grad` untouched."""
    from helios import runtime as rt

    outputs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    inputs = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
    if grad_outputs is None:
        for o in outputs:
            if o.numel() != 1:
                raise RuntimeError(f"grad() needs grad_outputs for non-scalar outputs (got shape {o.shape})")
        seeds = [rt.full(o.shape, 1.0) for o in outputs]
        unit = True
    else:
        grad_outputs = grad_outputs if isinstance(grad_outputs, list | tuple) else [grad_outputs]
        seeds = [g.data for g in grad_outputs]
        unit = False
    captured = run_backward(outputs, seeds, retain_graph=retain_graph, capture=inputs, unit_seed=unit)
    return tuple(Tensor(captured[id(t)]) if id(t) in captured else None for t in inputs)


__all__ = [
    "ACCUMULATED", "Context", "Folded", "Function", "Parameter", "ParameterArena", "Tensor", "enable_grad",
    "functional", "grad", "is_grad_enabled", "no_grad", "set_grad_enabled", "tensor",
]
