"""Token (+ learned position) embedding: lookup and its backward scatter-add into the table gradient.

Forward: `out[n] = table[ids[n]] (+ pos_table[n % T])` for the N = B*T rows of `ids [B, T]`.
Backward: `table_grad[v] += sum of dy[n] over n with ids[n] == v`, in one of three ways (the
"embedding_backward" selection family picks one; tests force one with helios.kernels.contract.selection):
- "sorted": with a host-side plan of the ids sorted into segments, one invocation per (segment, column)
  sums its rows in order. Deterministic at O(N * D): the trainer's choice, since token ids come from the host.
- "atomic": one invocation per (row, column) adds `dy[n, c]` into `table_grad[ids[n], c]` with a float
  atomic. Fast, but the summation order (and so the last bits) varies run to run.
- "scan" / "scan_vec4": one invocation per (vocab row, column or column quad) scans all ids and sums the
  matching rows in row order. No atomics, deterministic, O(V * D * N) id reads: the fallback for devices
  without `float_atomic_add_buffer` (and for anyone who wants bit-reproducible gradients).
The position gradient is always the deterministic gather `pos_grad[t] += sum_b dy[b*T + t]`.

An id outside [0, V) reads as a zero row and contributes no gradient (torch would raise instead).

Every kernel has "bf16_*" and "fp16_*" variants (helios.kernels.contract.dtypes): the table, pos_table, out and dy
are stored in that io dtype (the model reads a half working copy of its weights); the table and position
gradients stay f32 (the fp32 grad arena), summed in f32.

Grid shapes, (rows, D) each: `embedding` and "atomic" (N, D), "scan" (V, D), "sorted" (segments, D),
`embedding_pos_backward` (position rows, D).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import check_f32, dtype_variant, io_dtype, storage, variant_dtype, with_dtypes
from helios.kernels.contract.samples import default_samples
from helios.kernels.contract.spec import OpSpec, register, rows_and_cols
from helios.kernels.contract.tolerance import Tolerance
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, i32, u32

WG = 64  # invocations per workgroup for every kernel here (memory-bound; small groups pack lavapipe's threads)


# -- numpy references -------------------------------------------------------------------------------

def reference(ids: np.ndarray, table: np.ndarray, pos_table: np.ndarray | None = None) -> np.ndarray:
    """out [N, D] = table[ids] (+ pos_table[n % T]); ids [B, T]; invalid ids give zero rows."""
    ids2 = ids.reshape(-1, ids.shape[-1]) if ids.ndim > 1 else ids.reshape(1, -1)
    flat = ids2.reshape(-1).astype(np.int64)
    valid = (flat >= 0) & (flat < table.shape[0])
    out = np.where(valid[:, None], table[np.clip(flat, 0, table.shape[0] - 1)], 0).astype(table.dtype)
    if pos_table is not None:
        t = ids2.shape[1]
        out = out + np.tile(pos_table[:t], (ids2.shape[0], 1))
    return out


def reference_backward(ids: np.ndarray, dy: np.ndarray, vocab: int, n_pos: int | None = None):
    """(table_grad [V, D], pos_grad [n_pos, D] or None) for out = reference(ids, table, pos_table)."""
    ids2 = ids.reshape(-1, ids.shape[-1]) if ids.ndim > 1 else ids.reshape(1, -1)
    flat = ids2.reshape(-1).astype(np.int64)
    dy = dy.reshape(flat.size, -1)
    valid = (flat >= 0) & (flat < vocab)
    tg = np.zeros((vocab, dy.shape[1]), dtype=dy.dtype)
    np.add.at(tg, flat[valid], dy[valid])
    if n_pos is None:
        return tg, None
    b, t = ids2.shape
    pg = np.zeros((n_pos, dy.shape[1]), dtype=dy.dtype)
    pg[:t] = dy.reshape(b, t, -1).sum(axis=0)
    return tg, pg


# -- kernels -----------------------------------------------------------------------------------------

def _linear_id(b: KernelBuilder):
    """Invocation index over a 2-D grid of 1-D workgroups (x fastest), so any size fits the grid limits."""
    return b.global_id(0) + b.global_id(1) * (b.num_workgroups(0) * WG)


def _rows_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """Every kernel's grid, shape = (rows, D): an invocation per vec-wide piece of each row, in a (gx, gy, 1)
    grid of WG-wide groups within the device's limits."""
    from helios.device import get_device

    rows, d = shape
    groups = max(1, ceil_div(rows * d // variant.get("vec", 1), WG))
    gx = min(groups, get_device().info.max_workgroup_count[0])
    return gx, ceil_div(groups, gx), 1


def _build_lookup(b: KernelBuilder, v: Variant) -> None:
    """out[n, c] = table[ids[n], c] (+ pos[n % T, c]); one invocation per output element (or quad)."""
    b.local_size(WG)
    io = storage(variant_dtype(v.params))
    ids = b.buffer(0, i32, "r")
    table = b.buffer(1, io, "r").view(v.vec)
    out = b.buffer(2, io, "w").view(v.vec)
    pos = b.buffer(3, io, "r").view(v.vec) if v.pos else None
    n_rows, dv, vocab, seq = b.push("n_rows", u32), b.push("dv", u32), b.push("vocab", u32), b.push("T", u32)
    i = _linear_id(b)
    with b.if_(i < n_rows * dv):
        row, c = i / dv, i % dv
        tok = ids[row]
        valid = (tok >= 0) & (b.cast(tok, u32) < vocab)
        safe = b.cast(b.clamp(tok, 0, b.cast(vocab, i32) - 1), u32)  # never read outside the table
        x = b.select(valid, table[safe * dv + c], 0.0)
        if pos is not None:
            x = x + pos[(row % seq) * dv + c]
        out[i] = x


def _build_scatter_atomic(b: KernelBuilder, v: Variant) -> None:
    """table_grad[ids[n], c] += dy[n, c] with float atomics; one invocation per element of dy."""
    b.local_size(WG)
    ids = b.buffer(0, i32, "r")
    dy = b.buffer(1, storage(variant_dtype(v.params)), "r")
    grad = b.buffer(2, f32, "rw")
    n_rows, d, vocab = b.push("n_rows", u32), b.push("d", u32), b.push("vocab", u32)
    i = _linear_id(b)
    with b.if_(i < n_rows * d):
        row, c = i / d, i % d
        tok = ids[row]
        with b.if_((tok >= 0) & (b.cast(tok, u32) < vocab)):
            b.atomic_add(grad, b.cast(tok, u32) * d + c, dy[i])


def _build_scatter_scan(b: KernelBuilder, v: Variant) -> None:
    """table_grad[r, c] (+)= sum of dy[n, c] over ids[n] == r, summed in row order; no atomics."""
    b.local_size(WG)
    ids = b.buffer(0, i32, "r")
    dy = b.buffer(1, storage(variant_dtype(v.params)), "r").view(v.vec)
    grad = b.buffer(2, f32, "rw").view(v.vec)
    n_rows, dv, vocab, accumulate = b.push("n_rows", u32), b.push("dv", u32), b.push("vocab", u32), \
        b.push("accumulate", u32)
    i = _linear_id(b)
    with b.if_(i < vocab * dv):
        r, c = i / dv, i % dv
        zero = b.splat(b.const(0.0), v.vec)
        acc = b.var(grad.elem, zero)
        with b.if_(accumulate != 0):
            acc.value = grad[i]
        target = b.cast(r, i32)
        with b.for_range(0, n_rows) as n:
            with b.if_(ids[n] == target):
                acc += dy[n * dv + c]
        grad[i] = acc.value


def _build_pos_grad(b: KernelBuilder, v: Variant) -> None:
    """pos_grad[t, c] (+)= sum_b dy[b*T + t, c] for t < T; rows t >= T are left (or set to 0)."""
    b.local_size(WG)
    dy = b.buffer(0, storage(variant_dtype(v.params)), "r").view(v.vec)
    grad = b.buffer(1, f32, "rw").view(v.vec)
    batch, seq, n_pos, dv, accumulate = (b.push(k, u32) for k in ("B", "T", "n_pos", "dv", "accumulate"))
    i = _linear_id(b)
    with b.if_(i < n_pos * dv):
        t, c = i / dv, i % dv
        acc = b.var(grad.elem, b.splat(b.const(0.0), v.vec))
        with b.if_(accumulate != 0):
            acc.value = grad[i]
        with b.if_(t < seq):
            with b.for_range(0, batch) as k:
                acc += dy[(k * seq + t) * dv + c]
        grad[i] = acc.value


def _build_scatter_sorted(b: KernelBuilder, v: Variant) -> None:
    """table_grad[uniq[s], c] += sum of dy[order[j], c] for j in [start[s], start[s+1]), in order.

    One invocation per (segment, column): every gradient element has exactly one writer and a fixed
    summation order, so the result is bit-reproducible (unlike float atomics) at O(N * D) work.
    """
    b.local_size(WG)
    order = b.buffer(0, u32, "r")
    start = b.buffer(1, u32, "r")
    uniq = b.buffer(2, u32, "r")
    dy = b.buffer(3, storage(variant_dtype(v.params)), "r").view(v.vec)
    grad = b.buffer(4, f32, "rw").view(v.vec)
    segments, dv = b.push("segments", u32), b.push("dv", u32)
    i = _linear_id(b)
    with b.if_(i < segments * dv):
        s, c = i / dv, i % dv
        lo, hi = start[s], start[s + 1]
        with b.if_(lo < hi):  # a fixed-capacity plan (FixedScatterPlan) pads with empty segments: no write
            target = uniq[s] * dv + c
            acc = b.var(grad.elem, grad[target])  # always adds: the op zero-fills first when not accumulating
            with b.for_range(lo, hi) as j:
                acc += dy[order[j] * dv + c]
            grad[target] = acc.value


EMBEDDING = Kernel(
    "embedding", _build_lookup,
    variants=with_dtypes({"scalar": {"vec": 1, "pos": False}, "vec4": {"vec": 4, "pos": False},
                          "pos_scalar": {"vec": 1, "pos": True}, "pos_vec4": {"vec": 4, "pos": True}}),
    grid=_rows_grid,
    flops=lambda n, d, pos=False: n * d if pos else 0,
    bytes=lambda n, d, pos=False: 4 * n + 4 * n * d * (3 if pos else 2),
)
EMBEDDING_BACKWARD_ATOMIC = Kernel(
    "embedding_backward_atomic", _build_scatter_atomic, variants=with_dtypes({"atomic": {}}),
    grid=_rows_grid,
    flops=lambda n, d: n * d, bytes=lambda n, d: 4 * n + 12 * n * d,
    requires=("float_atomic_add_buffer",),
)
EMBEDDING_BACKWARD_SCAN = Kernel(
    "embedding_backward_scan", _build_scatter_scan,
    variants=with_dtypes({"scan": {"vec": 1}, "scan_vec4": {"vec": 4}}),
    grid=_rows_grid,
    flops=lambda n, vocab, d: n * d, bytes=lambda n, vocab, d: 4 * n * vocab * d + 4 * n * d + 8 * vocab * d,
)
EMBEDDING_BACKWARD_SORTED = Kernel(
    "embedding_backward_sorted", _build_scatter_sorted,
    variants=with_dtypes({"sorted": {"vec": 1}, "sorted_vec4": {"vec": 4}}),
    grid=_rows_grid,
    flops=lambda n, d: n * d, bytes=lambda n, segments, d: 8 * n + 8 * segments + 4 * n * d + 8 * segments * d,
)
EMBEDDING_POS_BACKWARD = Kernel(
    "embedding_pos_backward", _build_pos_grad,
    variants=with_dtypes({"scalar": {"vec": 1}, "vec4": {"vec": 4}}),
    grid=_rows_grid,
    flops=lambda n, d: n * d, bytes=lambda n, n_pos, d: 4 * n * d + 8 * n_pos * d,
)


# -- ops -------------------------------------------------------------------------------------------

def _rt():
    import helios.runtime as rt

    return rt


def _rows(ids) -> tuple[int, int]:
    """(N, T) of an ids tensor [B, T] (a 1-D ids tensor is one sequence)."""
    shape = tuple(ids.shape)
    return int(np.prod(shape)), int(shape[-1])


def forward_variant(d: int, with_pos: bool, dtype: str = "f32") -> str:
    """The forward kernel's variant for rows of width d: vec4 loads where d is a multiple of 4, positions added
    where a pos_table is given, in the io dtype."""
    return dtype_variant(("pos_" if with_pos else "") + ("vec4" if d % 4 == 0 else "scalar"), dtype)


def embedding(ids, table, pos_table=None, out=None):
    """Rows of `table` [V, D] for ids [B, T] as [N, D] (N = B*T); with pos_table adds pos_table[n % T].
    table, pos_table and out share one float dtype (f32, bf16 or fp16; out defaults to the table's)."""
    rt = _rt()
    dtype = io_dtype("embedding", table=table, pos_table=pos_table, out=out)
    n, seq = _rows(ids)
    vocab, d = int(table.shape[0]), int(table.shape[1])
    if pos_table is not None and int(pos_table.shape[0]) < seq:
        raise ValueError(f"pos_table has {pos_table.shape[0]} rows but the sequences are {seq} long")
    out = rt.empty((n, d), table.dtype) if out is None else out
    vec = 4 if d % 4 == 0 else 1
    name = forward_variant(d, pos_table is not None, dtype)
    buffers = [ids, table, out] + ([pos_table] if pos_table is not None else [])
    rt.launch(EMBEDDING, buffers, push={"n_rows": n, "dv": d // vec, "vocab": vocab, "T": seq},
              grid=EMBEDDING.grid_for((n, d), name), variant=name)
    return out


SCATTERS = ("sorted", "atomic", "scan", "deterministic")  # what tests and benchmarks may force


# The op-spec tests force these scatters (the spec's host_kwargs bring the sorted one its plan); "deterministic" is
# a policy (sorted where planned, else scan) that runs no kernel of its own.
@selection.rule("embedding_backward", choices=SCATTERS, forced=("sorted", "atomic", "scan"))
def _choose_scatter(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (tokens, vocab, D, planned). "sorted" where the caller brings a plan (deterministic, O(N * D)),
    else "atomic" where the device has float atomic adds on buffers, else the deterministic "scan".
    Forcing "deterministic" keeps "sorted" with a plan and takes "scan" without one."""
    planned = shape[3]
    if forced == "sorted" and not planned:
        raise ValueError("embedding_backward choice 'sorted' needs plan=sorted_segments(host_ids, vocab); "
                         "force 'deterministic' to take 'scan' where no plan is given")
    if forced == "atomic" and not info.float_atomic_add_buffer:
        raise ValueError("embedding_backward choice 'atomic' needs float atomic adds on buffers, which this "
                         "device lacks (DeviceInfo.float_atomic_add_buffer); force 'sorted' or 'scan'")
    if forced in ("sorted", "atomic", "scan"):
        return forced
    if planned:
        return "sorted"
    return "atomic" if info.float_atomic_add_buffer and forced is None else "scan"


def plan_arrays(host_ids: np.ndarray, vocab: int, capacity: int | None = None):
    """(order, segment starts, segment ids, segments) of the deterministic scatter as uint32 arrays: token
    positions sorted stably by id, where each id's run starts, and the ids. Out-of-range ids are dropped, as
    the other variants drop them. With `capacity` the segments are padded to that many with empty ones
    (start == end, never written) and `order` to one entry per token, so the shapes do not depend on the ids."""
    flat = np.asarray(host_ids).reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    keep = order[(flat[order] >= 0) & (flat[order] < vocab)]
    uniq, first = np.unique(flat[keep], return_index=True)
    starts = np.append(first, keep.size)
    segments = int(uniq.size)
    if capacity is not None:
        if segments > capacity:
            raise ValueError(f"{segments} distinct ids exceed the plan's capacity of {capacity}")
        keep = np.pad(keep, (0, flat.size - keep.size))
        starts = np.pad(starts, (0, capacity - segments), constant_values=starts[-1])
        uniq, segments = np.pad(uniq, (0, capacity - segments)), capacity
    u32 = lambda a: np.ascontiguousarray(a, dtype=np.uint32) if a.size else np.zeros(1, np.uint32)  # noqa: E731
    return u32(keep), u32(starts), u32(uniq), segments


def sorted_segments(host_ids: np.ndarray, vocab: int):
    """The host-side plan of the deterministic scatter: (order, segment starts, segment ids) as device
    tensors and the segment count, from ids the host already has (token batches come from the host)."""
    rt = _rt()
    order, starts, uniq, segments = plan_arrays(host_ids, vocab)
    return rt.from_numpy(order), rt.from_numpy(starts), rt.from_numpy(uniq), segments


class FixedScatterPlan:
    """A sorted-scatter plan in fixed device tensors sized for `n_tokens` ids (capacity min(n_tokens, vocab)
    segments), rewritten for each new batch: the plan a captured step reads, since its grid and bindings
    cannot depend on the ids. `plan` is the tuple embedding_backward takes; `arrays(ids)` the values to write."""

    def __init__(self, n_tokens: int, vocab: int):
        rt = _rt()
        self.n_tokens, self.vocab, self.capacity = n_tokens, vocab, max(1, min(n_tokens, vocab))
        # empty, not zeros: a recorded fill would land after the first host write of the values
        self.tensors = (rt.empty((max(1, n_tokens),), np.uint32), rt.empty((self.capacity + 1,), np.uint32),
                        rt.empty((self.capacity,), np.uint32))
        self.plan = (*self.tensors, self.capacity)

    def arrays(self, host_ids: np.ndarray) -> list[np.ndarray]:
        """The order, starts and ids arrays for `host_ids`, in the order of `tensors`."""
        if np.asarray(host_ids).size != self.n_tokens:
            raise ValueError(f"the plan holds {self.n_tokens} ids, got {np.asarray(host_ids).size}")
        return list(plan_arrays(host_ids, self.vocab, self.capacity)[:3])


def _scatter(ids, dy, table_grad, accumulate: bool, plan, dtype: str) -> None:
    """table_grad (+)= the rows of dy scattered by id, by the scatter the "embedding_backward" family picks."""
    rt = _rt()
    pick = lambda name: dtype_variant(name, dtype)  # noqa: E731
    n, _ = _rows(ids)
    vocab, d = int(table_grad.shape[0]), int(table_grad.shape[1])
    vec = 4 if d % 4 == 0 else 1
    variant = selection.choose("embedding_backward", (n, vocab, d, plan is not None), dtype)
    if variant == "sorted":
        order, starts, uniq, segments = plan
        if not accumulate:
            rt.fill(table_grad, 0.0)
        if segments:
            name = pick("sorted_vec4" if vec == 4 else "sorted")
            rt.launch(EMBEDDING_BACKWARD_SORTED, [order, starts, uniq, dy, table_grad],
                      push={"segments": segments, "dv": d // vec},
                      grid=EMBEDDING_BACKWARD_SORTED.grid_for((segments, d), name), variant=name)
    elif variant == "atomic":
        if not accumulate:
            rt.fill(table_grad, 0.0)
        name = pick("atomic")
        rt.launch(EMBEDDING_BACKWARD_ATOMIC, [ids, dy, table_grad], push={"n_rows": n, "d": d, "vocab": vocab},
                  grid=EMBEDDING_BACKWARD_ATOMIC.grid_for((n, d), name), variant=name)
    else:  # "scan"
        name = pick("scan_vec4" if vec == 4 else "scan")
        rt.launch(EMBEDDING_BACKWARD_SCAN, [ids, dy, table_grad],
                  push={"n_rows": n, "dv": d // vec, "vocab": vocab, "accumulate": int(accumulate)},
                  grid=EMBEDDING_BACKWARD_SCAN.grid_for((vocab, d), name), variant=name)


def _scatter_positions(ids, dy, pos_grad, accumulate: bool, dtype: str) -> None:
    """pos_grad[t] (+)= sum over the sequences of dy[b*T + t]."""
    rt = _rt()
    n, seq = _rows(ids)
    n_pos, d = int(pos_grad.shape[0]), int(pos_grad.shape[1])
    if n_pos < seq:
        raise ValueError(f"the position gradient has {n_pos} rows but the sequences are {seq} long")
    vec = 4 if d % 4 == 0 else 1
    name = dtype_variant("vec4" if vec == 4 else "scalar", dtype)
    rt.launch(EMBEDDING_POS_BACKWARD, [dy, pos_grad],
              push={"B": n // seq, "T": seq, "n_pos": n_pos, "dv": d // vec, "accumulate": int(accumulate)},
              grid=EMBEDDING_POS_BACKWARD.grid_for((n_pos, d), name), variant=name)


def _grad_out(out, like, accumulate: bool, what: str):
    """The f32 gradient to write (out, or a fresh tensor shaped as `like`) and whether to add into it (never into
    a fresh one)."""
    if out is None:
        return _rt().empty(tuple(like.shape)), False
    check_f32("embedding_backward", **{what: out})
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"embedding_backward: {what} has shape {tuple(out.shape)}, its table {tuple(like.shape)}")
    return out, accumulate


def embedding_backward(ids, table, pos_table, dy, dtable_out=None, dpos_table_out=None, accumulate=False, *,
                       has_pos_table=None, plan=None, needs=(True, True)):
    """(dtable, dpos_table) of embedding(ids, table, pos_table): the rows of dy [N, D] scatter-added by id into
    dtable [V, D], and by position into dpos_table (None without pos_table). table and pos_table give only the
    shapes. With *_out tensors and accumulate=True the gradients are added into them (a gradient arena), else
    they are overwritten; without, fresh ones are returned. Gradients are f32 whatever dy's dtype (f32, bf16 or
    fp16), summed in f32. `plan` (sorted_segments or FixedScatterPlan.plan) lets the deterministic "sorted"
    scatter run; the "embedding_backward" selection family picks the scatter (force it with
    helios.kernels.contract.selection). `needs`: which of (dtable, dpos_table) to compute (None for the other)."""
    dtype = io_dtype("embedding_backward", dy=dy)
    with_pos = pos_table is not None if has_pos_table is None else has_pos_table
    dtable = None
    if needs[0]:
        dtable, acc = _grad_out(dtable_out, table, accumulate, "dtable_out")
        _scatter(ids, dy, dtable, acc, plan, dtype)
    if not with_pos or not needs[1]:
        return dtable, None
    dpos, acc = _grad_out(dpos_table_out, pos_table, accumulate, "dpos_table_out")
    _scatter_positions(ids, dy, dpos, acc, dtype)
    return dtable, dpos


def scatter_plan(host_ids: np.ndarray, vocab: int, fixed: FixedScatterPlan | None = None):
    """The plan embedding_backward takes for ids the host holds: a captured step's fixed plan where it is sized for
    this vocabulary (the caller rewrites it per batch), else sorted_segments(host_ids, vocab)."""
    return fixed.plan if fixed is not None and fixed.vocab == vocab else sorted_segments(host_ids, vocab)


# -- op spec: tests, docs/OPS.md and autograd's Embedding Function (the gradients added straight into the wte/wpe
# gradient sinks) derive from it (helios.kernels.contract.spec)
# -------------------------------------------------------------

def _reference_backward(ids, table, pos_table, dy):
    return reference_backward(ids, dy, table.shape[0], None if pos_table is None else pos_table.shape[0])


def _inputs(rng: np.random.Generator, shape, **_):
    """shape = (*ids shape, D): ids int32 in [0, V) with V = N // 3 + 1, so ids repeat, the first id 0 and the
    last V - 1 (the table's first and last rows); table 2 N(0, 1); T + 2 position rows (the last two get zero
    gradients)."""
    ids_shape, d = tuple(shape[:-1]), shape[-1]
    vocab = math.prod(ids_shape) // 3 + 1
    ids = rng.integers(0, vocab, size=ids_shape, dtype=np.int32)
    ids.reshape(-1)[[0, -1]] = 0, vocab - 1
    table = (rng.standard_normal((vocab, d)) * 2).astype(np.float32)
    pos_table = rng.standard_normal((ids_shape[-1] + 2, d)).astype(np.float32)
    return ids, table, pos_table


# y: a copy, plus one f32 add with positions, rounded once; gradients: f32 sums of a few rows in scatter order,
# within 8 f32 roundings of themselves plus 32 of max |gradient| (at least 1).
_TOLERANCE = {"y": Tolerance(rel=1), "dtable": Tolerance(rel=8, abs=32, floor=1.0),
              "dpos_table": Tolerance(rel=8, abs=32, floor=1.0)}
# ids of N = 1, 7, 33, 513, 1026 tokens (1-D or [B, T]) by D = 1, 4, 7, 12, 16, 33, 513 (vec4 where D % 4 == 0)
_SHAPES = ((1, 1), (7, 7), (1, 7, 12), (3, 11, 33), (1, 33, 513), (513, 4), (1, 513, 7), (2, 513, 16))


def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    """The default cases, each with the sorted scatter's plan of its ids (built on the host when backward runs)."""
    for sample in default_samples(spec, dtype, choice, rng, kind, **how):
        ids, table = sample.args[:2]
        yield replace(sample, host_kwargs=lambda ids=ids, vocab=table.shape[0]: {"plan": sorted_segments(ids, vocab)})

register(OpSpec("embedding", "Rows of table for int32 ids [B, T] as [N, D], plus pos_table[n % T] if given (out-of-"
                "range ids give zero rows and no gradient).", __name__,
                (EMBEDDING, EMBEDDING_BACKWARD_SORTED, EMBEDDING_BACKWARD_ATOMIC, EMBEDDING_BACKWARD_SCAN,
                 EMBEDDING_POS_BACKWARD), embedding, embedding_backward, reference, _reference_backward, _inputs,
                args=("ids", "table", "pos_table"), outputs=("y",), saves=("ids", "table", "pos_table"),
                family="embedding_backward", shapes=_SHAPES, sizes=rows_and_cols, tolerance=_TOLERANCE,
                f32=("dtable", "dpos_table"), sinks=("dtable", "dpos_table"), optional={"pos_table": "has_pos_table"},
                indices=("ids",), needs=True, samples=_samples))
