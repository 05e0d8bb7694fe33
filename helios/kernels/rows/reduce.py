"""Reductions: sum/mean/max over the last axis or over everything, column sums (`sum_rows`, bias
gradients) and a two-stage sum of squares over many tensors (`sumsq`, gradient norms).

Over the last axis a worker (subgroup or workgroup, see `lib/row_workers.py`) reduces each row; over everything,
workgroups reduce grid-stride shares into partials and a second launch of the same kernel reduces those.
Column sums give invocations columns and workgroups chunks of rows, then sum the chunks' partials.
Every kernel also reads bf16 and fp16 inputs ("bf16_*", "fp16_*" variants): they add up in f32 and write
f32 results (row sums, scalars, and column sums such as bias gradients, which go to the fp32 grad arena).

Grid shapes: `reduce_rows` (rows, cols), `reduce_all` (n,), `sum_rows` (rows, cols, chunk) with `chunk` the
rows one invocation sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import (
    check_f32,
    check_float,
    dtype_variant,
    io_dtype,
    storage,
    variant_dtype,
    with_dtypes,
)
from helios.kernels.contract.spec import OpSpec, register, rows_and_cols
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib import row_workers as rowlib
from helios.kernels.lib.row_workers import (
    MAX_GROUPS,
    combine,
    flat_group,
    horizontal,
    identity,
    layout_of,
    row_grid,
    rows_of,
)
from helios.kernels.lib.wide import WideView
from helios.runtime import Tensor, empty, fill, launch
from helios.spirv import Kernel, KernelBuilder, Value, Variant, ceil_div, f32, u32, u64

ALL_LOCAL = 256  # reduce_all / sum_rows workgroup size
# This module defines the ops `sum` and `max`; Python's own are used under these names.
_max, _min, _sum = max, min, sum  # short names kept so the code below reads as before


# -- numpy references (float64-capable) ------------------------------------------------------------
def _reduced(fn, x: np.ndarray, axis: int | None) -> np.ndarray:
    """fn over the last axis, or over everything, in the ops' shapes: x.shape[:-1] ((1,) for a 1-D x) or (1,)."""
    return fn(x).reshape(1) if axis is None else fn(x, axis=-1).reshape(x.shape[:-1] or (1,))


def reference_sum(x: np.ndarray, axis: int | None = -1) -> np.ndarray:
    """Sum over the last axis, or over everything as shape (1,)."""
    return _reduced(np.sum, x, axis)


def reference_mean(x: np.ndarray, axis: int | None = -1) -> np.ndarray:
    return _reduced(np.mean, x, axis)


def reference_max(x: np.ndarray, axis: int | None = -1) -> np.ndarray:
    return _reduced(np.max, x, axis)


def reference_sum_rows(x: np.ndarray) -> np.ndarray:
    """Column sums of a 2-D [M, N] array."""
    return np.sum(x, axis=0)


def reference_sumsq(xs: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([_sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in xs)])


# -- reduce_rows: sum / mean / max over the last axis -----------------------------------------------
def build_reduce_rows(b: KernelBuilder, v: Variant) -> None:
    rl = layout_of(b, v)
    x, y = rl.buffer(0, "r"), b.buffer(1, f32, "w")
    scale = b.push("scale", f32)
    src = rl.view(x)
    with rl.my_rows() as r:
        base = r * rl.units
        acc = b.var(rl.elem, identity(v.op))

        def step(_, j):
            acc.value = combine(b, v.op, acc.value, src[base + j])

        rl.each(step)
        total = rl.reduce(acc.value, v.op)
        with b.if_(rl.is_leader()):
            y[r] = total * scale


REDUCE_ROWS = Kernel(
    "reduce_rows", build_reduce_rows,
    variants=with_dtypes({f"{op}_{name}": {**p, "op": op} for op in ("sum", "max")
                          for name, p in rowlib.row_variants(cached=False, dtypes=("f32",)).items()}),
    grid=lambda shape, variant: row_grid(shape[0], variant),
    flops=lambda rows, cols: rows * cols, bytes=lambda rows, cols: 4 * rows * (cols + 1),
)


# -- reduce_all: one value from many (two launches of one kernel) -----------------------------------
def build_reduce_all(b: KernelBuilder, v: Variant) -> None:
    """Each workgroup reduces a grid-stride share of x and writes y[slot + group] * scale.

    op "sumsq" squares as it loads. In the vec4 variant the first n % 4 invocations add the tail.
    """
    b.local_size(ALL_LOCAL)
    x, y = b.buffer(0, storage(variant_dtype(v.params)), "r"), b.buffer(1, f32, "w")
    n, scale, slot = b.push("n", u32), b.push("scale", f32), b.push("slot", u32)
    op = "max" if v.op == "max" else "sum"
    group, groups = flat_group(b)
    tid, stride = group * ALL_LOCAL + b.local_index(), groups * ALL_LOCAL

    def term(val):
        return val * val if v.op == "sumsq" else val

    if v.vec == 1:
        acc = b.var(f32, identity(op))
        with b.for_range(tid, n, step=stride) as k:
            acc.value = combine(b, op, acc.value, term(x[k]))
        part = acc.value
    else:
        n4 = n >> 2
        acc4 = b.var(rowlib.F32X4, identity(op))
        with b.for_range(tid, n4, step=stride) as k:
            acc4.value = combine(b, op, acc4.value, term(x.vec4[k]))
        acc = b.var(f32, horizontal(b, op, acc4.value))
        with b.if_(tid < (n & 3)):
            acc.value = combine(b, op, acc.value, term(x[(n4 << 2) + tid]))
        part = acc.value
    shared = b.shared(f32, ALL_LOCAL, "partials")
    sg_part = b.subgroup_add(part) if op == "sum" else b.subgroup_max(part)
    with b.if_(b.subgroup_local_id().eq(0)):
        shared[b.subgroup_id()] = sg_part
    b.barrier()
    with b.if_(b.local_index().eq(0)):
        total = b.var(f32, identity(op))
        with b.for_range(0, b.num_subgroups()) as k:
            total.value = combine(b, op, total.value, shared[k])
        y[slot + group] = total.value * scale


REDUCE_ALL = Kernel(
    "reduce_all", build_reduce_all,
    variants=with_dtypes({f"{op}_{name}": {"op": op, "vec": vec} for op in ("sum", "max", "sumsq")
                          for name, vec in (("scalar", 1), ("vec4", 4))}),
    grid=lambda shape, variant: (all_groups(shape[0]), 1, 1),
    flops=lambda n: 2 * n, bytes=lambda n: 4 * n,
)


def all_groups(n: int) -> int:
    """Workgroups for the first stage of a global reduction: ~16 elements per invocation, at most 256."""
    return _max(1, _min(256, ceil_div(n, ALL_LOCAL * 16)))


@selection.rule("reduce_all", choices=("scalar", "vec4"), also_serves=("sum", "mean", "max"))  # their axis=None
def _choose_all(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (n, op): vec4 loads (with a scalar tail) from 4 elements on, unless "scalar" is forced."""
    n, op = shape
    scalar = n < 4 or forced == "scalar"
    return dtype_variant(f"{op}_{'scalar' if scalar else 'vec4'}", dtype)


def _reduce_all_stage(x: Tensor, n: int, op: str, out: Tensor, slot: int, scale: float) -> None:
    """One launch of reduce_all: out[slot:slot + all_groups(n)] = the workgroups' reductions of x, times scale."""
    variant = selection.choose("reduce_all", (n, op), check_float(x))
    launch(REDUCE_ALL, buffers=[x, out], push={"n": n, "scale": scale, "slot": slot},
           grid=REDUCE_ALL.grid_for((n,), variant), variant=variant)


def reduce_all(x: Tensor, op: str, scale: float = 1.0) -> Tensor:
    """(1,) f32 reduction of every element of x (f32, bf16 or fp16): one launch for small x, else partials
    then one workgroup."""
    check_float(x)
    out = empty((1,))
    n = x.numel
    if n == 0:
        raise ValueError(f"cannot reduce an empty tensor {x.shape}")
    groups = all_groups(n)
    if groups == 1:
        _reduce_all_stage(x, n, op, out, 0, scale)
        return out
    partials = empty((groups,))
    _reduce_all_stage(x, n, op, partials, 0, 1.0)
    _reduce_all_stage(partials, groups, "max" if op == "max" else "sum", out, 0, scale)
    return out


# -- sum_rows: column sums of [M, N] ------------------------------------------------------------------
SUM_ROWS_CHUNK = 64  # rows summed by one invocation in the first stage
# Up to this many elements one pass (an invocation per column over all rows) beats two dispatches: the
# per-dispatch cost (~30 us on lavapipe) outweighs the parallelism of chunks (bias gradients of small batches).
ONE_PASS_ELEMENTS = 1 << 18
VIEW_ALIGN = 64  # elements: scratch views start on 256-byte boundaries (any minStorageBufferOffsetAlignment)


def build_sum_rows(b: KernelBuilder, v: Variant) -> None:
    """y[chunk, c] (+)= sum of x[offset + r*cols + c] over the rows r of one chunk.

    "pair" variants sum a second block at x[offset2 + ...] into a second output y2 in the same pass
    (LayerNorm's dw and db from one dispatch). Invocations own columns (4 columns in "vec4"/"u64x2");
    workgroups along y own chunks of `chunk` rows. Both dimensions loop grid-stride, so any M and N fit.
    """
    b.local_size(ALL_LOCAL)
    wide = v.get("wide", False)
    dtype = variant_dtype(v.params)  # of x; y (and y2) are f32
    x = b.buffer(0, u64 if wide else storage(dtype), "r")
    y = b.buffer(1, u64 if wide else f32, "rw")
    y2 = b.buffer(2, u64 if wide else f32, "rw") if v.pair else None
    rows, cols, chunk = b.push("rows", u32), b.push("cols", u32), b.push("chunk", u32)
    offset, accumulate = b.push("offset", u32), b.push("accumulate", u32)
    offset2 = b.push("offset2", u32) if v.pair else None
    w = v.vec
    units = cols if w == 1 else cols >> 2

    def view(buf, half: bool = False):
        if wide:
            return WideView(b, buf, dtype if half else "f32")
        return buf if w == 1 else buf.vec4

    src = view(x, dtype != "f32")
    blocks = [(y, offset)] + ([(y2, offset2)] if v.pair else [])
    blocks = [(view(out), off if w == 1 else off >> 2) for out, off in blocks]
    col0 = b.workgroup_id(0) * ALL_LOCAL + b.local_index()
    col_step = b.num_workgroups(0) * ALL_LOCAL
    with b.for_range(b.workgroup_id(1), ceil_div_value(b, rows, chunk), step=b.num_workgroups(1)) as c:
        lo = c * chunk
        hi = b.min(lo + chunk, rows)
        with b.for_range(col0, units, step=col_step) as j:
            accs = [b.var(f32 if w == 1 else rowlib.F32X4, 0.0) for _ in blocks]
            with b.for_range(lo, hi) as r:
                for acc, (_, base) in zip(accs, blocks, strict=True):
                    acc.value = acc.value + src[base + r * units + j]
            o = c * units + j
            totals = [acc.value for acc in accs]
            with b.if_(accumulate.ne(0)):
                for (dst, _), total in zip(blocks, totals, strict=True):
                    dst[o] = dst[o] + total
            with b.else_():
                for (dst, _), total in zip(blocks, totals, strict=True):
                    dst[o] = total


def ceil_div_value(b: KernelBuilder, a: Value, d: Value) -> Value:
    return (a + d - 1) / d


SUM_ROWS = Kernel(
    "sum_rows", build_sum_rows,
    variants=with_dtypes({f"{pre}{name}": {"vec": vec, "wide": wide, "pair": pair}
                          for pre, pair in (("", False), ("pair_", True)) for name, vec, wide in rowlib.WIDTHS}),
    grid=lambda shape, variant: (_max(1, _min(MAX_GROUPS, ceil_div(shape[1] // variant.vec, ALL_LOCAL))),
                                 _max(1, _min(MAX_GROUPS, ceil_div(shape[0], shape[2]))), 1),
    flops=lambda rows, cols: rows * cols, bytes=lambda rows, cols: 4 * (rows + 1) * cols,
)


class SumRowsChoice(NamedTuple):
    """What tests and benchmarks force for sum_rows (selection.force("sum_rows", SumRowsChoice(...))); a None
    field is left to the rule."""

    width: str | None = None    # "scalar", "vec4" or "u64x2" (rows.WIDTHS)
    two_stage: bool | None = None  # True: chunk partials then their sum wherever there is more than one chunk


class SumRowsPlan(NamedTuple):
    variant: str
    one_pass: bool  # all rows in one launch (else per-chunk partials into scratch, then their sum)


def _check_sum_rows(choice) -> SumRowsChoice:
    choice = SumRowsChoice(*choice)
    if choice.width not in (None, *(w for w, _, _ in rowlib.WIDTHS)) or choice.two_stage not in (None, True, False):
        raise ValueError(f"unknown sum_rows choice {choice}: width scalar/vec4/u64x2, two_stage True/False")
    return choice


# Tests force every width in one pass and in two.
@selection.rule("sum_rows", check=_check_sum_rows,
                forced=[SumRowsChoice(w, two) for w in ("scalar", "vec4", "u64x2") for two in (False, True)])
def _choose_sum_rows(info, shape: tuple, dtype: str, forced: SumRowsChoice | None) -> SumRowsPlan:
    """shape = (rows, cols, aligned, pair): the rows family's width rule (rows.width_name, scalar where a
    block's offset is not a multiple of 4) and one pass up to SUM_ROWS_CHUNK rows or ONE_PASS_ELEMENTS."""
    rows, cols, aligned, pair = shape
    forced = forced or SumRowsChoice()
    width = rowlib.width_name(cols, info, forced.width) if aligned else "scalar"
    one_pass = rows <= SUM_ROWS_CHUNK or (not forced.two_stage and rows * cols <= ONE_PASS_ELEMENTS)
    return SumRowsPlan(dtype_variant(("pair_" if pair else "") + width, dtype), one_pass)


def sums_in_one_pass(rows: int, cols: int, dtype: str) -> bool:
    """Whether `sum_rows` sums a [rows, cols] block of `dtype` in one pass: each column k = 0, 1, ... in order,
    from 0 (the order a fused column sum elsewhere must keep to give the same bits)."""
    return selection.choose("sum_rows", (rows, cols, True, False), dtype, record=False).one_pass


def sum_rows_into(x: Tensor, offsets: Sequence[int], rows: int, cols: int, outs: Sequence[Tensor],
                  accumulate: bool) -> None:
    """outs[k][:cols] (+)= column sums of the [rows, cols] block of x at element offsets[k] (one or two
    blocks, summed in the same dispatches). x may be f32, bf16 or fp16; outs are f32.

    Up to SUM_ROWS_CHUNK rows (or ONE_PASS_ELEMENTS elements) take one launch; more are summed per chunk
    into scratch [chunks, cols] first, so that M in the thousands keeps every core (or SM) busy, then the
    chunks into outs (the "sum_rows" selection family decides).
    """
    if cols == 0:
        return
    pair = len(outs) == 2
    aligned = all(o % 4 == 0 for o in offsets)
    variant, one_pass = selection.choose("sum_rows", (rows, cols, aligned, pair), check_float(x))

    def run(src: Tensor, offs: Sequence[int], n: int, chunk: int, dsts: Sequence[Tensor], acc: bool) -> None:
        push = {"rows": n, "cols": cols, "chunk": chunk, "offset": offs[0], "accumulate": int(acc)}
        if pair:
            push["offset2"] = offs[1]
        launch(SUM_ROWS, buffers=[src, *dsts], grid=SUM_ROWS.grid_for((n, cols, chunk), variant),
               variant=variant, push=push)

    if one_pass:
        run(x, offsets, rows, _max(rows, 1), outs, accumulate)
        return
    chunk = _max(SUM_ROWS_CHUNK, ceil_div(rows, MAX_GROUPS))
    chunks = ceil_div(rows, chunk)
    block = ceil_div(chunks * cols, VIEW_ALIGN) * VIEW_ALIGN
    scratch = empty((len(outs) * block,))
    run(x, offsets, rows, chunk, [scratch.view(k * block, (chunks, cols)) for k in range(len(outs))], False)
    sum_rows_into(scratch, [k * block for k in range(len(outs))], chunks, cols, outs, accumulate)


# -- op functions (docs/OPS.md) -----------------------------------------------------------------------
def _reduce_last(x: Tensor, op: str, scale_by_n: bool) -> Tensor:
    dtype = check_float(x)
    rows, cols = rows_of(x)
    if cols == 0:
        raise ValueError(f"cannot reduce over an empty last axis {x.shape}")
    out = empty(x.shape[:-1] if x.ndim > 1 else (1,))
    if rows == 0:
        return out
    variant = dtype_variant(f"{op}_{rowlib.choose(rows, cols, cacheable=False)}", dtype)
    launch(REDUCE_ROWS, buffers=[x, out], push={"rows": rows, "cols": cols, "scale": 1.0 / cols if scale_by_n else 1.0},
           grid=REDUCE_ROWS.grid_for((rows, cols), variant), variant=variant)
    return out


def _check_axis(x: Tensor, axis: int | None) -> None:
    if axis not in (None, -1, x.ndim - 1):
        raise ValueError(f"helios reduces over the last axis (-1) or everything (None), not axis={axis}")


def reduce_sum(x: Tensor, axis: int | None = -1) -> Tensor:
    """Sum over the last axis, or over everything as shape (1,) when axis is None."""
    _check_axis(x, axis)
    return reduce_all(x, "sum") if axis is None else _reduce_last(x, "sum", False)


def mean(x: Tensor, axis: int | None = -1) -> Tensor:
    """Mean over the last axis, or over everything as shape (1,) when axis is None."""
    _check_axis(x, axis)
    return reduce_all(x, "sum", 1.0 / _max(1, x.numel)) if axis is None else _reduce_last(x, "sum", True)


def reduce_max(x: Tensor, axis: int | None = -1) -> Tensor:
    """Maximum over the last axis, or over everything as shape (1,) when axis is None."""
    _check_axis(x, axis)
    return reduce_all(x, "max") if axis is None else _reduce_last(x, "max", False)


def sum_rows(x: Tensor, out: Tensor | None = None, accumulate: bool = False) -> Tensor:
    """Column sums of a 2-D [M, N] tensor as [N] (bias gradients); accumulate=True adds into out. x may be
    f32, bf16 or fp16; out is f32 (parameter gradients live in the fp32 grad arena)."""
    io_dtype("sum_rows", x=x)
    check_f32("sum_rows", out=out)
    if x.ndim != 2:
        raise ValueError(f"sum_rows takes a 2-D [M, N] tensor, got shape {x.shape}")
    rows, cols = x.shape
    if out is None:
        out, accumulate = empty((cols,)), False
    elif out.numel != cols:
        raise ValueError(f"sum_rows: out= has {out.numel} elements, expected {cols}")
    if rows == 0:
        if not accumulate:
            fill(out, 0.0)
        return out
    sum_rows_into(x, [0], rows, cols, [out], accumulate)
    return out


def sumsq(tensors: Tensor | Sequence[Tensor]) -> Tensor:
    """(1,) sum of squares of every element of every tensor: per-tensor partials, then one sum.

    One first-stage launch per tensor (pass a flat gradient arena as one tensor for two launches in all).
    Each tensor may be f32, bf16 or fp16 (squares add up in f32).
    """
    ts = [tensors] if isinstance(tensors, Tensor) else [t for t in tensors if t.numel]
    for t in ts:
        check_float(t)
    out = empty((1,))
    if not ts:
        fill(out, 0.0)
        return out
    if len(ts) == 1 and all_groups(ts[0].numel) == 1:
        _reduce_all_stage(ts[0], ts[0].numel, "sumsq", out, 0, 1.0)
        return out
    counts = [all_groups(t.numel) for t in ts]
    partials = empty((_sum(counts),))
    slot = 0
    for t, groups in zip(ts, counts, strict=True):
        _reduce_all_stage(t, t.numel, "sumsq", partials, slot, 1.0)
        slot += groups
    total = partials.numel
    groups = all_groups(total)
    if groups == 1:
        _reduce_all_stage(partials, total, "sum", out, 0, 1.0)
        return out
    second = empty((groups,))
    _reduce_all_stage(partials, total, "sum", second, 0, 1.0)
    _reduce_all_stage(second, groups, "sum", out, 0, 1.0)
    return out


# -- op specs: tests, bench and docs/OPS.md derive from them (helios.kernels.contract.spec) ---------------------------
# None has a backward kernel: autograd's Sum and Mean Functions broadcast dy with elementwise kernels
# (autograd/ops/reduce.py), and sum_rows and sumsq are themselves gradients (bias, grad norm).
def _shifted_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray]:
    """N(2, 3): mostly positive, so sums grow with n (tolerances relative to them hold), some negative (max)."""
    return ((rng.standard_normal(shape) * 3 + 2).astype(np.float32),)


def _sumsq_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, ...]:
    """Three tensors: one of `shape`, a 7-element one and one of half as many elements plus 3."""
    n = int(np.prod(shape))
    return tuple((rng.standard_normal(s) * 3).astype(np.float32) for s in (shape, (7,), (n // 2 + 3,)))


# Shapes over the last axis and over everything, each taken once with axis=-1 and once with axis=None: rows of 1 to
# 4100 (odd, multiples of 4 for the vec4/u64x2 widths), a 3-D input, and totals past 4096 elements (all_groups > 1:
# partials, then one workgroup) up to ~10^5.
_REDUCE_SHAPES = tuple(s for s in ((1,), (1, 1), (7, 8), (33, 33), (7, 513), (1, 4097), (7, 4100), (2, 3, 33),
                                   (4 * 4096 + 3,), (3, 33_337)) for _ in range(2))
# Results are f32 in every dtype. Sums: each add rounds the running partial once, and a lane's partial grows over
# rows/lanes terms, so the error grows with the terms per lane: ~6 f32 roundings of |sum| with 8 lanes, 21 with 4
# (a 33,337-long row; the inputs keep sums away from 0): 64 of |sum| plus 2 of the largest result (floor 1), still
# far below a dropped element (~1,000 roundings at the longest row) or a scale of 1.0001 (~1,700); max is exact.
_SUM_TOLERANCE = {"y": Tolerance(rel=64, abs=2, floor=1.0)}
# axis=None chooses through reduce_all, whose rule says it serves these ops (their tests force its choices too).
_REDUCE_OP = dict(family="rows", shapes=_REDUCE_SHAPES, sizes=rows_and_cols, f32=("y",), scalars={"axis": (-1, None)},
                  autograd=False)
# torch: over the last axis (a 1-D input's as shape (1,)), or over everything as shape (1,) (axis=None)
_TORCH_REDUCTIONS = {name: lambda x, axis, op=op: getattr(x, op)(-1 if axis == -1 else None).reshape(
    x.shape[:-1] if axis == -1 and x.dim() > 1 else (1,)) for name, op in (("sum", "sum"), ("mean", "mean"),
                                                                          ("max", "amax"))}
for _name, _doc, _forward, _reference, _tolerance in (
        ("sum", "Sum over the last axis, or over everything as shape (1,) (axis=None).", reduce_sum, reference_sum,
         _SUM_TOLERANCE),
        ("mean", "Mean over the last axis, or over everything as shape (1,) (axis=None).", mean, reference_mean,
         _SUM_TOLERANCE),
        ("max", "Maximum over the last axis, or over everything as shape (1,) (axis=None).", reduce_max,
         reference_max, {"y": Tolerance()})):
    register(OpSpec(_name, _doc, __name__, (REDUCE_ROWS, REDUCE_ALL), _forward, None, _reference, None,
                    _shifted_inputs, tolerance=_tolerance, torch_op=_TORCH_REDUCTIONS[_name], **_REDUCE_OP))

# Column sums: one row, rows up to and past SUM_ROWS_CHUNK (64, 65: one pass, then chunks), past 64 chunks (4097,
# 4161 rows: the chunks' sum takes two passes itself when two passes are forced), past ONE_PASS_ELEMENTS unforced
# (4100 x 65), and column counts odd or multiples of 4. One invocation adds up a column's rows in sequence (up to
# 4100, or 64 per chunk), so rounding errors random-walk over the chain: measured ~40 f32 roundings of |sum| for
# 3000 rows in one pass; 128 allowed.
register(OpSpec("sum_rows", "Column sums of a 2-D [M, N] tensor as [N] f32 (bias gradients; out=, accumulate=True "
                "adds into a parameter gradient).", __name__, (SUM_ROWS,), sum_rows, None, reference_sum_rows, None,
                _shifted_inputs, family="sum_rows",
                shapes=((1, 1), (1, 7), (7, 33), (64, 12), (65, 7), (513, 64), (3000, 36), (4097, 5), (4161, 3),
                        (4100, 65)),
                sizes=rows_and_cols, f32=("y",), tolerance={"y": Tolerance(rel=128, abs=2, floor=1.0)},
                autograd=False, torch_op=lambda x: x.sum(0)))
# Three tensors at once (sizes from 1 to ~10^5: one-workgroup and partial stages), squares summed in f32: positive
# terms, within 8 f32 roundings of the total.
register(OpSpec("sumsq", "Sum of squares of every element of a list of tensors, as shape (1,) f32 (gradient "
                "norms).", __name__, (REDUCE_ALL,), sumsq, None, reference_sumsq, None, _sumsq_inputs,
                args=("a", "b", "c"), saves=(), family="reduce_all", shapes=((1,), (7, 33), (4097,), (300, 300)),
                f32=("y",), tolerance={"y": Tolerance(rel=8)}, autograd=False, packed=True,
                torch_op=lambda a, b, c: sum(t.square().sum() for t in (a, b, c)).reshape(1)))
