"""Column-block copies: concatenate along the last axis and slice it back (concat's VJP), one dispatch each.

`copy_columns` moves a [rows, n] block from columns [src_off, src_off + n) of a [rows, src_cols]
tensor into columns [dst_off, dst_off + n) of a [rows, dst_cols] tensor, optionally adding into it.
Most layout changes never need it (attention reads fused QKV in place, matmuls read transposes in
place); it serves `concat` for users who build fused projections out of separate ones. "bf16_*" and "fp16_*"
variants copy (or add, in f32 then rounded once) tensors of that dtype; src and dst share one dtype.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import dtype_variant, io_dtype, storage, variant_dtype, with_dtypes
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import LOCAL, grid_2d
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


def copy_columns(src: Tensor, dst: Tensor, *, src_off: int, dst_off: int, n: int, accumulate: bool = False) -> Tensor:
    """dst[:, dst_off:dst_off+n] (+)= src[:, src_off:src_off+n] over the last axis of both (one float dtype); returns
    dst."""
    dtype = io_dtype("copy_columns", src=src, dst=dst)
    src_cols, dst_cols = src.shape[-1], dst.shape[-1]
    rows = src.numel // src_cols
    if dst.numel // dst_cols != rows:
        raise ValueError(f"copy_columns: {src.shape} and {dst.shape} differ in their leading dimensions")
    if src_off + n > src_cols or dst_off + n > dst_cols:
        raise ValueError(f"copy_columns: columns {src_off}+{n} of {src_cols} -> {dst_off}+{n} of {dst_cols} overflow")
    if rows * n == 0:
        return dst
    variant = selection.choose("layout", (rows, n, accumulate), dtype)
    launch(COPY_COLUMNS, [src, dst], variant=variant, grid=COPY_COLUMNS.grid_for((rows, n), variant),
           push={"rows": rows, "n": n, "src_cols": src_cols, "src_off": src_off, "dst_cols": dst_cols,
                 "dst_off": dst_off})
    return dst


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


def reference_slice_columns(x: np.ndarray, start: int, stop: int) -> np.ndarray:
    return x[..., start:stop].copy()


def reference_copy_columns(src: np.ndarray, dst: np.ndarray, *, src_off: int, dst_off: int, n: int,
                           accumulate: bool = False) -> np.ndarray:
    """dst after copy_columns (a new array)."""
    out = dst.copy()
    block = src[..., src_off:src_off + n]
    out[..., dst_off:dst_off + n] = out[..., dst_off:dst_off + n] + block if accumulate else block
    return out


# -- op specs: tests, bench and docs/OPS.md derive from them (helios.kernels.contract.spec) ---------------------------
# No backward kernel of their own: concat's VJP is slice_columns of each part (autograd's hand-written Concat).
def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    return (rng.standard_normal(shape) * 3).astype(np.float32)


def _concat_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, ...]:
    """Three parts whose widths add up to shape[-1] (at least 3): 1 column, half of the rest, the rest."""
    *lead, total = shape
    half = (total - 1) // 2
    return tuple(_normal(rng, (*lead, w)) for w in (1, half, total - 1 - half))


# Slices and copies: (leading shape, columns of the source, of the destination, first source column, first
# destination column, columns): single columns, a whole row, odd offsets and counts, 4097-column rows, 3-D.
_CASES = (((1,), 1, 1, 0, 0, 1), ((7,), 33, 40, 5, 7, 28), ((33,), 513, 300, 0, 1, 257),
          ((1,), 4097, 4097, 4000, 3, 97), ((2, 3), 12, 12, 1, 0, 7), ((3,), 4097, 9, 4088, 0, 9))
_COLUMN_SPEC = dict(family="layout", autograd=False, tolerance={"y": Tolerance()},
                    sizes=lambda shape: (int(np.prod(shape[:-1])), shape[-1]))
register(OpSpec("concat", "Concatenate along the last axis (one float dtype): one dispatch per part.", __name__,
                (COPY_COLUMNS,), concat, None, reference_concat, None, _concat_inputs, args=("a", "b", "c"), saves=(),
                shapes=((1, 3), (7, 41), (33, 520), (1, 4099), (2, 3, 12)), packed=True, **_COLUMN_SPEC))
register(OpSpec("slice_columns", "x[..., start:stop] as a new contiguous tensor.", __name__, (COPY_COLUMNS,),
                slice_columns, None, reference_slice_columns, None, lambda rng, shape, **_: (_normal(rng, shape),),
                shapes=tuple((*lead, cols) for lead, cols, _, off, _, n in _CASES),
                scalars={"start": tuple(c[3] for c in _CASES), "stop": tuple(c[3] + c[5] for c in _CASES)},
                **_COLUMN_SPEC))


def _copy_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    """src of `shape` and a nonzero dst whose width is the matching case's (dst_cols)."""
    dst_cols = next(c[2] for c in _CASES if (*c[0], c[1]) == tuple(shape))
    return _normal(rng, shape), _normal(rng, (*shape[:-1], dst_cols))


# The "add" variant computes in f32 and rounds once to the dtype: one f32 rounding (none more for a copy).
register(OpSpec("copy_columns", "dst[..., dst_off:dst_off+n] (+)= src[..., src_off:src_off+n] (accumulate=True "
                "adds), in place.", __name__, (COPY_COLUMNS,), copy_columns, None, reference_copy_columns, None,
                _copy_inputs, args=("src", "dst"), outputs=("dst",), saves=(), inplace={"dst": "dst"},
                shapes=tuple((*lead, cols) for lead, cols, *_ in _CASES),
                scalars={"src_off": tuple(c[3] for c in _CASES), "dst_off": tuple(c[4] for c in _CASES),
                         "n": tuple(c[5] for c in _CASES), "accumulate": (False, True)},
                **(_COLUMN_SPEC | {"tolerance": {"dst": Tolerance(rel=1)}})))
