"""Softmax over the last axis, forward and backward, each one dispatch with one worker per row.

Forward, cached variants (the row fits the invocations' registers): load the row once, max, exp and sum
in registers, write y once. Streaming variants (longer rows): an online pass keeps a running max and a
sum rescaled whenever the max grows, then a second pass writes exp(x - max) / sum: two reads and one
write of the row instead of three reads and two writes. The running max starts at -FLT_MAX rather than
-inf so that masked (-inf) entries give exp(-inf) = 0, never inf - inf. Backward:
dx = y * (dy - sum(y * dy)). Variants and their choice: `lib/row_workers.py`. bf16 and fp16 variants ("bf16_*",
"fp16_*") read and write 16-bit rows; the exps, max and sums stay f32 and each output is rounded once.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract.dtypes import NUMPY, io_dtype
from helios.kernels.contract.spec import ROW_SHAPES, OpSpec, register, rows_and_cols
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib import row_workers as rowlib
from helios.kernels.lib.row_workers import (
    FLT_MAX,
    STREAM_UNROLL,
    horizontal,
    layout_of,
    row_grid,
    row_variants,
    rows_of,
)
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, f32


# -- numpy references ---------------------------------------------------------------------------------
def reference(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (float64 if x is)."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def reference_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return y * (dy - np.sum(y * dy, axis=-1, keepdims=True))


# -- kernels ------------------------------------------------------------------------------------------
def build_forward(b: KernelBuilder, v: Variant) -> None:
    rl = layout_of(b, v)
    x, y = rl.buffer(0, "r"), rl.buffer(1, "w")
    src, dst = rl.view(x), rl.view(y)
    el = rl.elem
    with rl.my_rows() as r:
        base = r * rl.units
        if rl.cache:
            regs = rl.registers(el)
            m = b.var(el, -FLT_MAX)

            def load(k, j):
                regs[k].value = src[base + j]
                m.value = b.max(m.value, regs[k].value)

            rl.each(load)
            row_max = rl.reduce(m.value, "max")
            s = b.var(el, 0.0)

            def exponentiate(k, _):
                e = b.exp(regs[k].value - row_max)
                regs[k].value = e
                s.value = s.value + e

            rl.each(exponentiate)
            inv = 1.0 / rl.reduce(s.value)

            def store(k, j):
                dst[base + j] = regs[k].value * inv

            rl.each(store)
        else:
            # A running max and sum of exp(x - max) per unrolled position: an invocation's elements feed
            # STREAM_UNROLL independent chains, so a row's rounding error does not grow with its length per
            # invocation (which is 4x longer on 4-lane subgroups than on 16-lane ones).
            ms = [b.var(f32, -FLT_MAX) for _ in range(STREAM_UNROLL)]
            ss = [b.var(f32, 0.0) for _ in range(STREAM_UNROLL)]

            def online(u, j):
                m, s = ms[u], ss[u]
                xj = src[base + j]
                m_new = b.max(m.value, horizontal(b, "max", xj))
                s.value = s.value * b.exp(m.value - m_new) + horizontal(b, "sum", b.exp(xj - m_new))
                m.value = m_new

            rl.stream(online)
            mine = ms[0].value
            for m in ms[1:]:
                mine = b.max(mine, m.value)
            row_max = rl.reduce(mine, "max")
            total = ss[0].value * b.exp(ms[0].value - row_max)
            for m, s in zip(ms[1:], ss[1:], strict=True):
                total = total + s.value * b.exp(m.value - row_max)
            inv = 1.0 / rl.reduce(total)

            def write(_, j):
                dst[base + j] = b.exp(src[base + j] - row_max) * inv

            rl.each(write)


def build_backward(b: KernelBuilder, v: Variant) -> None:
    rl = layout_of(b, v)
    y, dy, dx = rl.buffer(0, "r"), rl.buffer(1, "r"), rl.buffer(2, "w")
    yv, dyv, dxv = rl.view(y), rl.view(dy), rl.view(dx)
    el = rl.elem
    with rl.my_rows() as r:
        base = r * rl.units
        ys, dys = rl.registers(el), rl.registers(el)
        acc = b.var(el, 0.0)

        def dot(k, j):
            yj, dyj = yv[base + j], dyv[base + j]
            if k is not None:
                ys[k].value, dys[k].value = yj, dyj
            acc.value = b.fma(yj, dyj, acc.value)

        rl.each(dot)
        total = rl.reduce(acc.value)

        def write(k, j):
            yj, dyj = (yv[base + j], dyv[base + j]) if k is None else (ys[k].value, dys[k].value)
            dxv[base + j] = yj * (dyj - total)

        rl.each(write)


SOFTMAX = Kernel(
    "softmax", build_forward, variants=row_variants(),
    grid=lambda shape, variant: row_grid(shape[0], variant),  # shape = (rows, cols)
    flops=lambda rows, cols: 5 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols,
)
SOFTMAX_BACKWARD = Kernel(
    "softmax_backward", build_backward, variants=row_variants(),
    grid=lambda shape, variant: row_grid(shape[0], variant),  # shape = (rows, cols)
    flops=lambda rows, cols: 4 * rows * cols, bytes=lambda rows, cols: 12 * rows * cols,
)


# -- op functions -------------------------------------------------------------------------------------
def softmax(x: Tensor, out: Tensor | None = None) -> Tensor:
    """Softmax over the last axis; y has x's dtype (f32, bf16 or fp16)."""
    dtype = io_dtype("softmax", x=x, out=out)
    y = empty(x.shape, NUMPY[dtype]) if out is None else out
    rows, cols = rows_of(x)
    if rows and cols:
        variant = rowlib.choose(rows, cols, dtype=dtype)
        launch(SOFTMAX, buffers=[x, y], push={"rows": rows, "cols": cols},
               grid=SOFTMAX.grid_for((rows, cols), variant), variant=variant)
    return y


def softmax_backward(y: Tensor, dy: Tensor, out: Tensor | None = None) -> Tensor:
    """dx of softmax over the last axis, from its output y and the gradient dy (all of one dtype)."""
    dtype = io_dtype("softmax_backward", y=y, dy=dy, out=out)
    if y.shape != dy.shape:
        raise ValueError(f"softmax_backward: y {y.shape} and dy {dy.shape} differ")
    dx = empty(y.shape, NUMPY[dtype]) if out is None else out
    rows, cols = rows_of(y)
    if rows and cols:
        variant = rowlib.choose(rows, cols, dtype=dtype)
        launch(SOFTMAX_BACKWARD, buffers=[y, dy, dx], push={"rows": rows, "cols": cols},
               grid=SOFTMAX_BACKWARD.grid_for((rows, cols), variant), variant=variant)
    return dx


# -- op spec: tests, autograd, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) -----------------
def _inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray]:
    return ((rng.standard_normal(shape) * 4 + 30).astype(np.float32),)  # far from 0: needs the max shift


# Tolerances, in f32 roundings (~6e-8): 34 (2e-6) absolute on probabilities (each is exp of an f32 difference over
# an f32 sum), 168 (1e-5) of max |dx| for the backward.
register(OpSpec("softmax", "Softmax over the last axis.", __name__, (SOFTMAX, SOFTMAX_BACKWARD), softmax,
                softmax_backward, reference, reference_backward, _inputs, saves=("y",), family="rows",
                shapes=ROW_SHAPES, sizes=rows_and_cols, torch_op=lambda x: x.softmax(-1),
                tolerance={"y": Tolerance(abs=34), "dx": Tolerance(abs=168, floor=1e-3)}))
