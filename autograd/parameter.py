"""Parameters and the flat parameter arena: one device buffer for all of a model's parameters, one for grads.

With every parameter a view into one buffer, the optimizer, the gradient norm and zero_grad are each a
single dispatch over the arena instead of one per tensor. Each entry starts where the device lets a view
start (minStorageBufferOffsetAlignment); the gap after an entry is padding that stays zero in the params,
the gradients, AdamW's moments and the decay mask, so it adds nothing to a gradient norm or an update.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autograd.tensors import Tensor

VEC_ALIGN = 4  # floats: entries start on whole vec4 lanes, whatever the device's offset alignment
HALF_ALIGN = 8  # elements: a half working copy's entries start on 16-byte boundaries too


def entry_align(offset_alignment: int, half: bool = False) -> int:
    """Elements between arena entry starts so that an fp32 view (and with `half`, a 2-byte working-copy view
    at the same element offset) starts on a multiple of `offset_alignment` bytes and on a vec4 lane."""
    if offset_alignment <= 0 or offset_alignment & (offset_alignment - 1):
        raise ValueError(f"offset alignment must be a power of two, got {offset_alignment}")
    align = max(VEC_ALIGN, offset_alignment // 4)
    return max(align, HALF_ALIGN, offset_alignment // 2) if half else align


def device_entry_align(half: bool = False) -> int:
    """entry_align for this process's device (its minStorageBufferOffsetAlignment)."""
    from helios.device import device_info

    return entry_align(device_info().min_storage_buffer_offset_alignment, half)


def arena_layout(sizes: Sequence[int], align: int) -> tuple[list[int], int]:
    """(offset of each entry, arena size) for entries of `sizes` elements, each starting at a multiple of
    `align` elements, in order, with at least `align` elements in all."""
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // align) * align
    return offsets, max(total, align)


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
    """Packs parameters into one params buffer, one grads buffer and a per-element weight-decay mask.

    Entries start at multiples of `align` elements (default: what this device's offset alignment needs,
    with `half` for a half working copy too: device_entry_align)."""

    def __init__(self, named: list[tuple[str, Parameter]], align: int | None = None, *, half: bool = False):
        from helios import runtime as rt

        align = device_entry_align(half) if align is None else align
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.offsets, self.size = arena_layout([p.numel() for p in self.params], align)
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
        from helios.kernels.contract.dtypes import FLOAT_DTYPES

        return "f32" if self.working is None else FLOAT_DTYPES[self.working.dtype]

    def set_working_dtype(self, dtype: str) -> None:
        """Compute in dtype: "f32" (the masters themselves) or "bf16"/"fp16" (a half working copy of the
        masters that every forward and backward reads; master weights, gradients and optimizer state stay
        fp32). The copy is made now from the masters and kept current by AdamW."""
        from helios import runtime as rt
        from helios.kernels.contract.dtypes import NUMPY

        if dtype not in NUMPY:
            raise ValueError(f"working dtype must be one of {', '.join(NUMPY)}, got {dtype!r}")
        need = device_entry_align(half=True)
        if dtype != "f32" and any(off % need for off in self.offsets):
            raise ValueError(f"a half working copy on this device needs arena entries aligned to {need} elements; "
                             f"this arena was packed with align={self.align}: pack_parameters(half=True)")
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
        """The parameters' elements, padding excluded."""
        return sum(p.numel() for p in self.params)
