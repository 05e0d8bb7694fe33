"""Parameters and the flat parameter arena: one device buffer for all of a model's parameters, one for grads.

With every parameter a view into one buffer, the optimizer, the gradient norm and zero_grad are each a
single dispatch over the arena instead of one per tensor.
"""

from __future__ import annotations

import numpy as np

from autograd.tensors import Tensor

ALIGN = 4  # floats: views start on 16-byte boundaries (minStorageBufferOffsetAlignment) and vec4 lanes


class Parameter(Tensor):
    """A leaf tensor that requires grad. `decay` says whether AdamW's weight decay applies to it."""

    __slots__ = ("decay",)

    def __init__(self, array: np.ndarray, decay: bool | None = None):
        array = np.ascontiguousarray(array, dtype=np.float32)
        super().__init__(array, requires_grad=True)
        self.decay = array.ndim >= 2 if decay is None else decay


class ParameterArena:
    """Packs parameters into one params buffer, one grads buffer and a per-element weight-decay mask."""

    def __init__(self, named: list[tuple[str, Parameter]]):
        from helios import runtime as rt

        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.offsets: list[int] = []
        total = 0
        for p in self.params:
            self.offsets.append(total)
            total += -(-p.numel() // ALIGN) * ALIGN
        self.size = max(total, ALIGN)
        host = np.zeros(self.size, np.float32)
        mask = np.zeros(self.size, np.float32)
        for p, off in zip(self.params, self.offsets):
            host[off:off + p.numel()] = p.numpy().reshape(-1)
            mask[off:off + p.numel()] = 1.0 if p.decay else 0.0
        self.data = rt.from_numpy(host)
        self.grads = rt.zeros(self.size)
        self.decay_mask = rt.from_numpy(mask)
        for p, off in zip(self.params, self.offsets):
            old = p.data
            p.data = self.data.view(off, p.shape)
            p.grad = Tensor(self.grads.view(off, p.shape))
            p._grad_owned = True
            old.release()

    def zero_grad(self) -> None:
        from helios import runtime as rt

        rt.fill(self.grads, 0.0)
        for p in self.params:
            p.grad._version.value += 1

    def numel(self) -> int:
        return sum(p.numel() for p in self.params)
