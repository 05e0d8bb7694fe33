"""The LM head and cross-entropy over row chunks, for batches whose logits do not fit one device buffer.

A micro-batch's logits are B*T x vocab floats; on lavapipe one bound buffer holds at most 128 MiB
(maxStorageBufferRange), so alpha-8l's B=20 (160 MiB of logits) could not train. Here the final hidden
states are split into row chunks (views, no copy), each chunk gets its own logits and mean cross-entropy,
and the chunk losses are summed weighted by their share of the counted rows: the same mean as one big
cross-entropy. Backward gathers the chunks' input gradients back into one tensor.
"""

from __future__ import annotations

import math

import numpy as np

from autograd import functional as F
from autograd.function import Context, Function
from autograd.tensors import Tensor

ROW_ALIGN = 64  # chunk starts stay 256-byte aligned for f32 rows and int32 targets (any offset alignment)


def row_align(cols: int, itemsize: int, offset_alignment: int) -> int:
    """Rows between chunk starts: a multiple of ROW_ALIGN at which both a row view of `cols` elements of
    `itemsize` bytes and an int32 target view start on `offset_alignment` bytes (half rows of an odd width
    at 256 bytes need 128)."""
    rows_for = [offset_alignment // math.gcd(offset_alignment, cols * itemsize),
                offset_alignment // math.gcd(offset_alignment, 4)]
    return math.lcm(ROW_ALIGN, *rows_for)


class _RowChunks(Function):
    """x [rows, C] -> views of consecutive row ranges; the backward writes each range's gradient back."""

    @staticmethod
    def forward(ctx: Context, x, *, bounds):
        ctx.shape, ctx.bounds, ctx.dtype = x.shape, bounds, x.dtype
        cols = x.shape[-1]
        return tuple(x.view(r0 * cols, (r1 - r0, cols)) for r0, r1 in bounds)

    @staticmethod
    def backward(ctx: Context, *grads):
        from helios import runtime as rt

        full = rt.empty(ctx.shape, ctx.dtype)
        cols = ctx.shape[-1]
        for (r0, r1), g in zip(ctx.bounds, grads, strict=True):
            part = full.view(r0 * cols, (r1 - r0, cols))
            if g is None:
                rt.fill(part, 0.0)
            else:
                rt.copy(g, part)
        return full


def row_bounds(rows: int, max_rows: int, align: int = ROW_ALIGN) -> list[tuple[int, int]]:
    """Consecutive [r0, r1) ranges of at most max_rows rows (rounded down to `align`), covering rows."""
    step = max(align, max_rows // align * align)
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def chunked_cross_entropy(x: Tensor, head: Tensor, targets: Tensor, host_targets: np.ndarray, max_rows: int,
                          ignore_index: int = -1, offset_alignment: int | None = None) -> Tensor:
    """mean cross_entropy(x @ head^T, targets) over the counted rows, computed max_rows rows at a time.

    x is [..., C], targets the matching int32 ids; `host_targets`, the host array the targets were uploaded
    from, gives each chunk's count of rows that are not ignore_index (its weight in the mean). Chunks start
    where views may (`offset_alignment` bytes; default the device's minStorageBufferOffsetAlignment).
    """
    if offset_alignment is None:
        from helios.device import device_info

        offset_alignment = device_info().min_storage_buffer_offset_alignment
    cols = x.shape[-1]
    rows = int(np.prod(x.shape[:-1]))
    host = np.asarray(host_targets).reshape(-1)
    if host.size != rows:
        raise ValueError(f"chunked cross-entropy: host_targets has {host.size} ids for {rows} rows; pass the "
                         f"array the targets were uploaded from")
    bounds = row_bounds(rows, max_rows, row_align(cols, np.dtype(x.dtype).itemsize, offset_alignment))
    counted = [int(np.count_nonzero(host[r0:r1] != ignore_index)) for r0, r1 in bounds]
    total = sum(counted)
    parts = _RowChunks.apply(x.reshape(rows, cols), bounds=bounds)
    parts = parts if isinstance(parts, tuple) else (parts,)
    flat = targets.data.reshape(rows)
    loss = None
    for (r0, r1), part, n in zip(bounds, parts, counted, strict=True):
        if n == 0:
            continue
        ids = Tensor(flat.view(r0, (r1 - r0,)))
        term = F.cross_entropy(F.linear(part, head), ids, ignore_index) * (n / total)
        loss = term if loss is None else loss + term
    if loss is None:  # every row ignored: the unchunked op's answer (NaN mean of nothing), from one chunk
        return F.cross_entropy(F.linear(parts[0], head), Tensor(flat.view(0, (bounds[0][1],))), ignore_index)
    return loss
