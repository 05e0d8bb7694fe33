"""Softmax over the last axis, forward and backward, each one dispatch with one worker per row.

Forward, per row: the max (stability), then e = exp(x - max) stored into y while summing, then y *= 1/sum
(the row is still in cache, and this needs one exp per element instead of two). Backward:
dx = y * (dy - sum(y * dy)). Variants come from `reduce.row_variants`: "sg_*" gives a row to a subgroup,
"wg_*" to a workgroup; "*_vec4" needs rows a multiple of 4 long, "*_scalar" takes any length.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.reduce import RowLayout, check_f32, horizontal, row_grid, row_variant, row_variants, rows_of
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, f32, u32


# -- numpy references ---------------------------------------------------------------------------------
def reference(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (float64 if x is)."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def reference_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return y * (dy - np.sum(y * dy, axis=-1, keepdims=True))


# -- kernels ------------------------------------------------------------------------------------------
def _row_views(b: KernelBuilder, v: Variant, *buffers):
    """(units per row, the buffers as scalar or vec4 views)."""
    cols = b.push("cols", u32)
    units = cols if v.vec == 1 else cols >> 2
    return units, [buf if v.vec == 1 else buf.vec4 for buf in buffers]


def build_forward(b: KernelBuilder, v: Variant) -> None:
    rl = RowLayout(b, v.layout)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "rw")
    rows = b.push("rows", u32)
    units, (src, dst) = _row_views(b, v, x, y)
    with b.for_range(rl.worker, rows, step=rl.workers) as r:
        base = r * units
        m = b.var(src.elem, float("-inf"))
        with b.for_range(rl.lane, units, step=rl.width) as j:
            m.value = b.max(m.value, src[base + j])
        row_max = rl.reduce(horizontal(b, "max", m.value), "max")
        s = b.var(src.elem, 0.0)
        with b.for_range(rl.lane, units, step=rl.width) as j:
            e = b.exp(src[base + j] - row_max)
            dst[base + j] = e
            s.value = s.value + e
        inv = 1.0 / rl.reduce(horizontal(b, "sum", s.value))
        # Each invocation rescales exactly the elements it wrote: no barrier needed.
        with b.for_range(rl.lane, units, step=rl.width) as j:
            dst[base + j] = dst[base + j] * inv


def build_backward(b: KernelBuilder, v: Variant) -> None:
    rl = RowLayout(b, v.layout)
    y, dy, dx = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "w")
    rows = b.push("rows", u32)
    units, (yv, dyv, dxv) = _row_views(b, v, y, dy, dx)
    with b.for_range(rl.worker, rows, step=rl.workers) as r:
        base = r * units
        acc = b.var(yv.elem, 0.0)
        with b.for_range(rl.lane, units, step=rl.width) as j:
            acc.value = b.fma(yv[base + j], dyv[base + j], acc.value)
        dot = rl.reduce(horizontal(b, "sum", acc.value))
        with b.for_range(rl.lane, units, step=rl.width) as j:
            k = base + j
            dxv[k] = yv[k] * (dyv[k] - dot)


SOFTMAX = Kernel(
    "softmax", build_forward, variants=row_variants(),
    grid=lambda rows, cols, v: row_grid(rows, v.layout),
    flops=lambda rows, cols: 5 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols,
)
SOFTMAX_BACKWARD = Kernel(
    "softmax_backward", build_backward, variants=row_variants(),
    grid=lambda rows, cols, v: row_grid(rows, v.layout),
    flops=lambda rows, cols: 4 * rows * cols, bytes=lambda rows, cols: 12 * rows * cols,
)


# -- op functions -------------------------------------------------------------------------------------
def softmax(x: Tensor, out: Tensor | None = None) -> Tensor:
    """Softmax over the last axis."""
    check_f32(x, out)
    y = empty(x.shape) if out is None else out
    rows, cols = rows_of(x)
    if rows and cols:
        variant = row_variant("", rows, cols)
        launch(SOFTMAX, buffers=[x, y], push={"rows": rows, "cols": cols},
               grid=SOFTMAX.grid(rows, cols, SOFTMAX.variant(variant)), variant=variant)
    return y


def softmax_backward(y: Tensor, dy: Tensor, out: Tensor | None = None) -> Tensor:
    """dx of softmax over the last axis, from its output y and the gradient dy."""
    check_f32(y, dy, out)
    if y.shape != dy.shape:
        raise ValueError(f"softmax_backward: y {y.shape} and dy {dy.shape} differ")
    dx = empty(y.shape) if out is None else out
    rows, cols = rows_of(y)
    if rows and cols:
        variant = row_variant("", rows, cols)
        launch(SOFTMAX_BACKWARD, buffers=[y, dy, dx], push={"rows": rows, "cols": cols},
               grid=SOFTMAX_BACKWARD.grid(rows, cols, SOFTMAX_BACKWARD.variant(variant)), variant=variant)
    return dx
