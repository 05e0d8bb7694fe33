"""Parameters and the flat parameter arena: one device buffer for all of a model's parameters, one for grads.

With every parameter a view into one buffer, the optimizer, the gradient norm and zero_grad are each a
single dispatch over the arena instead of one per tensor.
"""

from __future__ import annotations

import numpy as np

from autograd.tensors import Tensor

ALIGN = 4  # floats: views start on 16-byte boundaries (minStorageBufferOffsetAlignment) and vec4 lanes


class Parameter(Tensor):
    """A leaf tensor that requires grad. `decay` says whether AdamW's weight decay applies to it.

    `data` is the fp32 master; with mixed precision `working` is its half copy (a view of the arena's
    working buffer, rewritten by the fused AdamW), and ops compute with it (`operand`). Gradients stay fp32."""

    __slots__ = ("decay", "working")

    def __init__(self, array: np.ndarray, decay: bool | None = None):
        array = np.ascontiguousarray(array, dtype=np.float32)
        super().__init__(array, requires_grad=True)
        self.decay = array.ndim >= 2 if decay is None else decay
        self.working = None

    @property
    def operand(self):
        return self.working if self.working is not None else self.data


class ParameterArena:
    """Packs parameters into one params buffer, one grads buffer and a per-element weight-decay mask."""

    def __init__(self, named: list[tuple[str, Parameter]], align: int = ALIGN):
        from helios import runtime as rt

        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.offsets: list[int] = []
        total = 0
        for p in self.params:
            self.offsets.append(total)
            total += -(-p.numel() // align) * align
        self.size = max(total, align)
        self.align = align
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

        self.working = None  # the half working copy (set_working_dtype), None in fp32

    @property
    def working_dtype(self) -> str:
        """"f32", "bf16" or "fp16": the dtype the model computes with."""
        from helios.kernels.dtypes import FLOAT_DTYPES

        return "f32" if self.working is None else FLOAT_DTYPES[self.working.dtype]

    def set_working_dtype(self, dtype: str) -> None:
        """Compute in dtype: "f32" (the masters themselves) or "bf16"/"fp16" (a half working copy of the
        masters that every forward and backward reads; master weights, gradients and optimizer state stay
        fp32). The copy is made now from the masters and kept current by AdamW."""
        from helios import runtime as rt
        from helios.kernels.dtypes import NUMPY

        if dtype not in NUMPY:
            raise ValueError(f"working dtype must be one of {', '.join(NUMPY)}, got {dtype!r}")
        if dtype != "f32" and any(off % 8 for off in self.offsets):
            raise ValueError(f"a half working copy needs arena entries aligned to 8 elements (16 bytes); this "
                             f"arena was packed with align={self.align}: pack_parameters(align=8)")
        if self.working is not None:
            self.working.release()
            self.working = None
        if dtype != "f32":
            self.working = rt.empty((self.size,), NUMPY[dtype])
        for p, off in zip(self.params, self.offsets):
            p.working = self.working.view(off, p.shape) if self.working is not None else None
            p._version.value += 1  # what forward saved of the old operand must not be used
        self.refresh_working()

    def refresh_working(self) -> None:
        """Rewrite the working copy from the fp32 masters (after they were set from the host)."""
        if self.working is not None:
            from helios import ops

            ops.cast(self.data, self.working_dtype, out=self.working)

    def zero_grad(self) -> None:
        from helios import runtime as rt

        rt.fill(self.grads, 0.0)
        for p in self.params:
            p.grad._version.value += 1

    def numel(self) -> int:
        return sum(p.numel() for p in self.params)
