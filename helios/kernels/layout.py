"""Column-block copies: concatenate along the last axis and slice it back (concat's VJP), one dispatch each.

`copy_columns` moves a [rows, n] block from columns [src_off, src_off + n) of a [rows, src_cols]
tensor into columns [dst_off, dst_off + n) of a [rows, dst_cols] tensor, optionally adding into it.
Most layout changes never need it (attention reads fused QKV in place, matmuls read transposes in
place); it serves `concat` for users who build fused projections out of separate ones. "bf16_*" and "fp16_*"
variants copy (or add, in f32 then rounded once) tensors of that dtype; src and dst share one dtype.
"""

from __future__ import annotations

import numpy as np

from helios.kernels import selection
from helios.kernels.dtypes import dtype_variant, io_dtype, storage, variant_dtype, with_dtypes
from helios.kernels.elementwise import LOCAL, grid_2d
from helios.ops import declare_ops
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, u32


def reference_concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts, axis=-1)


def build_copy_columns(b: KernelBuilder, v: Variant) -> None:
    b.local_size(LOCAL)
    io = storage(variant_dtype(v.params))
    src = b.buffer(0, io, "r")
    dst = b.buffer(1, io, "rw" if v.accumulate else "w")
    rows, n = b.push("rows", u32), b.push("n", u32)
    src_cols, src_off = b.push("src_cols", u32), b.push("src_off", u32)
    dst_cols, dst_off = b.push("dst_cols", u32), b.push("dst_off", u32)
    i = b.global_index()  # linear over the 2-D grid of grid_2d
    with b.if_(i < rows * n):
        r, c = i / n, i % n
        value = src[r * src_cols + src_off + c]
        target = r * dst_cols + dst_off + c
        if v.accumulate:
            dst[target] = dst[target] + value
        else:
            dst[target] = value


COPY_COLUMNS = Kernel(
    "copy_columns", build_copy_columns,
    variants=with_dtypes({"copy": {"accumulate": False}, "add": {"accumulate": True}}),
    grid=lambda shape, variant: grid_2d(shape[0] * shape[1]),  # shape = (rows, n)
    flops=lambda rows, n: 0, bytes=lambda rows, n: 8 * rows * n,
)


ACCESSES = ("scalar",)  # one element per invocation: strided column blocks have no aligned vec4 to load


@selection.rule("layout", choices=ACCESSES)
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (rows, n, accumulate): "add" or "copy" in dtype, one element per invocation (the only access
    whose loads never straddle a column block's edge)."""
    return dtype_variant("add" if shape[2] else "copy", dtype)


def copy_columns(src: Tensor, dst: Tensor, *, src_off: int, dst_off: int, n: int, accumulate: bool = False) -> None:
    """dst[:, dst_off:dst_off+n] (+)= src[:, src_off:src_off+n] over the last axis of both (one float dtype)."""
    dtype = io_dtype("copy_columns", src=src, dst=dst)
    src_cols, dst_cols = src.shape[-1], dst.shape[-1]
    rows = src.numel // src_cols
    if dst.numel // dst_cols != rows:
        raise ValueError(f"copy_columns: {src.shape} and {dst.shape} differ in their leading dimensions")
    if src_off + n > src_cols or dst_off + n > dst_cols:
        raise ValueError(f"copy_columns: columns {src_off}+{n} of {src_cols} -> {dst_off}+{n} of {dst_cols} overflow")
    if rows * n == 0:
        return
    variant = selection.choose("layout", (rows, n, accumulate), dtype)
    launch(COPY_COLUMNS, [src, dst], variant=variant, grid=COPY_COLUMNS.grid_for((rows, n), variant),
           push={"rows": rows, "n": n, "src_cols": src_cols, "src_off": src_off, "dst_cols": dst_cols,
                 "dst_off": dst_off})


def concat(parts: list[Tensor]) -> Tensor:
    """Concatenate along the last axis (leading dimensions must match, one float dtype): one dispatch per part."""
    io_dtype("concat", **{f"parts[{k}]": p for k, p in enumerate(parts)})
    lead = parts[0].shape[:-1]
    for p in parts:
        if p.shape[:-1] != lead:
            raise ValueError(f"concat: leading dimensions differ: {[tuple(q.shape) for q in parts]}")
    total = sum(p.shape[-1] for p in parts)
    out = empty((*lead, total), parts[0].dtype)
    offset = 0
    for p in parts:
        copy_columns(p, out, src_off=0, dst_off=offset, n=p.shape[-1])
        offset += p.shape[-1]
    return out


def slice_columns(x: Tensor, start: int, stop: int) -> Tensor:
    """x[..., start:stop] as a new contiguous tensor."""
    out = empty((*x.shape[:-1], stop - start), x.dtype)
    copy_columns(x, out, src_off=start, dst_off=0, n=stop - start)
    return out


# the helios.ops functions this file declares
OPS = declare_ops(__name__, concat, slice_columns, copy_columns)
