"""Row machinery shared by the row kernels (reductions over the last axis, softmax, norms).

A row kernel gives each row to one *worker*: a subgroup ("sg" layouts: no shared memory or barriers, the
fast form on lavapipe and for short rows) or a workgroup ("wg": subgroup reductions combined through
shared memory, for long rows on GPUs). Workers visit rows with a grid-stride loop, so any row count works
on any grid and for any subgroup size (8 on lavapipe, 32 on NVIDIA). "scalar" variants take any row
length; "vec4" variants need rows a multiple of 4 long (so each row starts 16-byte aligned).

Invocation `lane` of a worker owns elements (or vec4s) j = lane + k * width of every row. A *cached*
variant ("_reg4", "_reg32") keeps those k = 0..R-1 slots in registers, unrolled in Python, so a row is
read from memory once and written once: on lavapipe each buffer access costs a per-lane scalar loop, so
this halves softmax's time; on GPUs it saves the re-reads from L1/L2. Rows longer than R * width use the
streaming variants (no suffix).

Every variant also exists for bf16 and fp16 rows ("bf16_"/"fp16_" + the name, `helios.kernels.contract.dtypes`): a
RowLayout of a half dtype declares its row buffers as 16-bit storage (vec4 views load 4 halves; "u64x2"
moves them as one 64-bit word, helios.kernels.lib.wide), so the kernels' f32 code is unchanged and each stored
half is rounded once.
Buffers a kernel asks for as "f32" (statistics, partial sums) stay f32 whatever the dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import DTYPES, dtype_variant, storage, variant_dtype, with_dtypes
from helios.kernels.lib.wide import WideView
from helios.spirv import KernelBuilder, Value, ceil_div, f32, u32, u64, vec

SG_LOCAL = 64  # "sg": invocations per workgroup (a multiple of every subgroup size up to 64)
WG_LOCAL = 256  # "wg": one row per workgroup of this many invocations
MAX_GROUPS = 65535  # grids stay within the smallest maxComputeWorkGroupCount Vulkan allows
NEG_INF = float("-inf")
FLT_MAX = float(np.finfo(np.float32).max)
CACHE_TIERS = {"sg": (4, 8, 16, 32), "wg": (4,)}  # register slots per invocation of the cached variants
STREAM_UNROLL = 4  # elements per invocation per trip of a streaming loop


F32X4 = vec(f32, 4)


def device_info():
    from helios.device import get_device

    return get_device().info


def combine(b: KernelBuilder, op: str, a, c) -> Value:
    """a (+ or max) c."""
    return a + c if op == "sum" else b.max(a, c)


def identity(op: str) -> float:
    return 0.0 if op == "sum" else NEG_INF


def horizontal(b: KernelBuilder, op: str, v: Value) -> Value:
    """Reduce the components of a vec4 (a scalar is returned as is)."""
    if v.count == 1:
        return v
    return combine(b, op, combine(b, op, v.x, v.y), combine(b, op, v.z, v.w))


def flat_group(b: KernelBuilder) -> tuple[Value, Value]:
    """(this workgroup's index, number of workgroups) over a 2-D grid."""
    nx = b.num_workgroups(0)
    return b.workgroup_id(1) * nx + b.workgroup_id(0), nx * b.num_workgroups(1)


class RowLayout:
    """Which rows this invocation works on and which elements of a row are its own (see module doc).

    Declares push constants `rows` and `cols`; `units` is the row length in elements or vec4s and
    `view(buf)` the matching view of a buffer. `dtype` is how row buffers are stored (see module doc).
    """

    def __init__(self, b: KernelBuilder, layout: str, vec: int = 1, cache: int = 0, wide: bool = False,
                 dtype: str = "f32") -> None:
        self.b, self.layout, self.vec, self.cache, self.wide, self.dtype = b, layout, vec, cache, wide, dtype
        self.dtypes: dict[int, str] = {}  # binding -> how its buffer stores floats
        group, groups = flat_group(b)
        if layout == "sg":
            b.local_size(SG_LOCAL)
            self.lane = b.subgroup_local_id()
            # A subgroup larger than the workgroup holds only SG_LOCAL invocations.
            self.width = b.min(b.subgroup_size(), SG_LOCAL)
            self.worker = group * b.num_subgroups() + b.subgroup_id()
            self.workers = groups * b.num_subgroups()
        elif layout == "wg":
            b.local_size(WG_LOCAL)
            self.lane = b.local_index()
            self.width = b.const(WG_LOCAL, u32)
            self.worker, self.workers = group, groups
            self.shared = b.shared(f32, WG_LOCAL, "partials")  # room for subgroups of size 1
        else:
            raise ValueError(f"unknown row layout {layout!r}")
        self.rows, self.cols = b.push("rows", u32), b.push("cols", u32)
        self.units = self.cols if vec == 1 else self.cols >> 2
        self.elem = f32 if vec == 1 else F32X4  # a unit in registers, whatever the storage
        self.fcols = b.cast(self.cols, f32)

    def buffer(self, binding: int, access: str, dtype: str | None = None):
        """A buffer of row data (read through `view`) stored as `dtype` (default: the variant's): f32, bf16
        or fp16, or u64 words in the "u64x2" variants."""
        dtype = dtype or self.dtype
        self.dtypes[binding] = dtype
        return self.b.buffer(binding, u64 if self.wide else storage(dtype), access)

    def view(self, buf):
        """The buffer as this variant's units: f32, vec4<f32>, or vec4<f32> moved as u64 words (loads give
        f32 whatever the storage)."""
        dtype = self.dtypes[buf.binding]
        if self.wide:
            return WideView(self.b, buf, dtype)
        return buf if self.vec == 1 else buf.vec4

    def reduce(self, value: Value, op: str = "sum") -> Value:
        """The sum or max of a scalar or vec4 over the worker's invocations, in every invocation."""
        b = self.b
        value = horizontal(b, op, value)
        part = b.subgroup_add(value) if op == "sum" else b.subgroup_max(value)
        if self.layout == "sg":
            return part
        with b.if_(b.subgroup_local_id().eq(0)):
            self.shared[b.subgroup_id()] = part
        b.barrier()
        acc = b.var(f32, identity(op))
        with b.for_range(0, b.num_subgroups()) as k:
            acc.value = combine(b, op, acc.value, self.shared[k])
        total = acc.value
        b.barrier()  # the next reduction may overwrite the array
        return total

    def last_worker(self, counter, workers: Value) -> Value:
        """Whether this worker is the last of `workers` to get here, the same in each of its lanes, counting on
        the u32 counter[0] (`worker_counter()`: zero before the launch, and the last worker puts the zero back).
        Every worker's storage-buffer writes before this call are visible to the last one after it. "sg" workers
        only (the count needs no workgroup barrier), in the worker's uniform control flow. Orders memory at device
        scope without declaring buffers Coherent, which a CPU device does not need: rules use it there only."""
        b = self.b
        if self.layout != "sg":
            raise ValueError("last_worker counts subgroup workers (layout 'sg')")
        b.device_memory_barrier()  # release: this lane's writes, then every lane's before lane 0 counts
        b.subgroup_barrier()
        arrived = b.var(u32, 0)
        with b.if_(self.lane.eq(0)):
            arrived.value = b.atomic_add(counter, 0, 1)
        last = b.subgroup_broadcast(arrived.value, 0).eq(workers - 1)
        with b.if_(last & self.lane.eq(0)):  # every other worker has counted: the next launch starts from zero
            counter[0] = 0
        b.device_memory_barrier()  # acquire: the other workers' writes, before this worker reads them
        return last

    def is_leader(self) -> Value:
        """True in one invocation of the worker (it writes per-row results)."""
        return self.lane.eq(0)

    def my_rows(self, workers: Value | None = None):
        """Loop over this worker's rows: worker, worker + workers, ... (workers: all of the grid's)."""
        return self.b.for_range(self.worker, self.rows, step=self.workers if workers is None else workers)

    def each(self, body: Callable[[int | None, Value], None]) -> None:
        """Run body(slot, j) for each of this invocation's elements j of a row.

        Streaming: a loop, slot None. Cached: unrolled over slots 0..cache-1 (j = lane + slot * width),
        each guarded by j < units.
        """
        b = self.b
        if not self.cache:
            self.stream(lambda _u, j: body(None, j))
            return
        for slot in range(self.cache):
            j = self.lane + self.width * slot
            with b.if_(j < self.units):
                body(slot, j)

    def stream(self, body: Callable[[int, Value], None]) -> None:
        """Run body(u, j) for each of this invocation's elements j of a row, u = j's position 0..STREAM_UNROLL-1
        within its loop trip (a kernel may keep one accumulator per u: STREAM_UNROLL shorter serial chains).

        A loop with the same trip count in every invocation (lavapipe then runs it as plain SIMD code, not as
        a masked divergent loop), STREAM_UNROLL elements per trip."""
        b = self.b
        span = self.width * STREAM_UNROLL
        with b.for_range(0, (self.units + span - 1) / span) as block:
            for u in range(STREAM_UNROLL):
                j = self.lane + block * span + self.width * u
                with b.if_(j < self.units):
                    body(u, j)

    def registers(self, elem, init=None) -> list:
        """One function variable per cache slot (an empty list when streaming)."""
        return [self.b.var(elem, init) for _ in range(self.cache)]


_WORKER_COUNTERS: dict[tuple, tuple[object, object]] = {}


def worker_counter():
    """The runtime's one-word u32 counter for `RowLayout.last_worker`, zero between launches: the launches that
    count share it, one after another (each binds it read-write, so the runtime orders them)."""
    from helios.runtime import per_runtime, zeros

    return per_runtime(_WORKER_COUNTERS, None, lambda: zeros((1,), np.uint32))


# -- variants and their choice ------------------------------------------------------------------------
WIDTHS = (("scalar", 1, False), ("vec4", 4, False), ("u64x2", 4, True))


class RowChoice(NamedTuple):
    """What tests and benchmarks force for the row kernels (selection.force("rows", RowChoice(...))); a None
    field is left to the rule."""

    layout: str | None = None  # "sg" or "wg"
    width: str | None = None   # "scalar", "vec4" or "u64x2"
    cache: int | None = None   # 0 (streaming) or a register tier


def _check_choice(choice) -> RowChoice:
    choice = RowChoice(*choice)
    if choice.layout not in (None, *CACHE_TIERS) or choice.width not in (None, *(w for w, _, _ in WIDTHS)):
        raise ValueError(f"unknown row kernel choice {choice}: layout sg/wg, width scalar/vec4/u64x2")
    return choice


def width_name(cols: int, info, forced_width: str | None = None) -> str:
    """"scalar" for rows not a multiple of 4; else the forced width, or "u64x2" on CPUs with 64-bit integers
    and "vec4" elsewhere. Shared by the row rule and sum_rows' rule (same widths, each forced on its own)."""
    if forced_width == "scalar" or cols % 4:
        return "scalar"
    if forced_width is not None:
        return forced_width
    return "u64x2" if info.cpu_profile and info.int64 else "vec4"


def row_variants(cached: bool = True, dtypes: Sequence[str] = DTYPES, **params) -> dict[str, dict]:
    """The variants of a row kernel: layout x width x (streaming or a cache tier), each with params, for
    each of dtypes ("bf16_"/"fp16_" prefixes; dtypes=("f32",) gives the f32 table to extend first)."""
    out = {}
    for layout, tiers in CACHE_TIERS.items():
        widths = WIDTHS if layout == "sg" else WIDTHS[:2]  # u64x2 is for CPUs, which use "sg"
        for name, width, wide in widths:
            out[f"{layout}_{name}"] = {"layout": layout, "vec": width, "wide": wide, "cache": 0, **params}
            for r in tiers if cached else ():
                out[f"{layout}_{name}_reg{r}"] = {"layout": layout, "vec": width, "wide": wide, "cache": r, **params}
    return with_dtypes(out, dtypes)


def _subgroup_width(info) -> int:
    return min(SG_LOCAL, max(1, info.subgroup_size))


def _fit_width(info) -> int:
    """Lanes a register tier may count on per "sg" worker: the narrowest subgroup the driver may run (a
    cached variant holds only cache x width elements of a row, so a narrower subgroup than assumed would
    drop the rest)."""
    return min(SG_LOCAL, max(1, info.min_subgroup_size))


def _pick(info, units: int, cacheable: bool) -> tuple[str, int]:
    """(layout, cache) for rows of `units`: the first register tier the row fits, else streaming.

    CPUs always use "sg" (barriers are costly there). GPUs give a row to a subgroup while it fits in a
    few registers per invocation, then to a workgroup.
    """
    sg = _fit_width(info)
    if info.cpu_profile:
        tiers, fallback = [("sg", r, sg) for r in CACHE_TIERS["sg"]], "sg"
    else:
        tiers = [("sg", CACHE_TIERS["sg"][0], sg), ("wg", CACHE_TIERS["wg"][0], WG_LOCAL)]
        fallback = "sg" if units <= 8 * sg else "wg"
    for layout, r, width in tiers if cacheable else ():
        if units <= r * width:
            return layout, r
    return fallback, 0


# (layout, width, register tier) the tests force: every streaming form and the cached tiers that compile quickly.
# CI runs again at subgroup sizes 4 and 16 (`-m subgroup`), in f32 (a half dtype changes the storage, not the
# reductions): a register tier (its fit counts subgroup lanes) and streaming over a subgroup for every row op, and
# a workgroup per row (subgroup partials merged in shared memory: RowLayout.reduce, the same code in every row op)
# for softmax, whose pipelines JIT fastest.
@selection.rule("rows", check=_check_choice, forced=[RowChoice(*c) for c in (
                    ("sg", "vec4", 0), ("sg", "scalar", 0), ("sg", "u64x2", 0), ("wg", "vec4", 0), ("wg", "scalar", 0),
                    ("sg", "u64x2", 4), ("sg", "u64x2", 8), ("sg", "scalar", 8), ("sg", "vec4", 4), ("wg", "vec4", 4),
                    ("wg", "scalar", 4))],
                subgroup=(selection.Subgroup(RowChoice("sg", "u64x2", 4)),
                          selection.Subgroup(RowChoice("sg", "scalar", 0)),
                          selection.Subgroup(RowChoice("wg", "vec4", 4), ops=("softmax",))))
def _choose(info, shape: tuple, dtype: str, forced: RowChoice | None) -> str:
    """shape = (rows, cols, cacheable): the variant for `rows` rows of length `cols` of dtype."""
    _rows, cols, cacheable = shape
    forced = forced or RowChoice()
    width = width_name(cols, info, forced.width)
    vec = 1 if width == "scalar" else 4
    if forced.layout is not None or forced.cache is not None:
        layout, cache = forced.layout or "sg", (forced.cache or 0) if cacheable else 0
        lanes = _fit_width(info) if layout == "sg" else WG_LOCAL
        if cols // vec > cache * lanes:
            cache = 0  # a forced tier the row does not fit: stream
    else:
        layout, cache = _pick(info, cols // vec, cacheable)
    if layout != "sg" and width == "u64x2":
        width = "vec4"
    name = f"{layout}_{width}"
    return dtype_variant(f"{name}_reg{cache}" if cache else name, dtype)


def choose(rows: int, cols: int, cacheable: bool = True, dtype: str = "f32") -> str:
    """The row kernels' variant for `rows` rows of length `cols` (helios.kernels.contract.selection's "rows" rule)."""
    return selection.choose("rows", (rows, cols, cacheable), dtype)


def row_grid(rows: int, v, rows_per_worker: int = 1) -> tuple[int, int, int]:
    """Workgroups for a row kernel: one worker per `rows_per_worker` rows (the row loop does the rest).

    Kernels that hold per-column values in registers (norm weights) ask for several rows per worker, so
    those are loaded once per worker rather than once per row.
    """
    per_group = max(1, SG_LOCAL // _subgroup_width(device_info())) if v.layout == "sg" else 1
    return (max(1, min(MAX_GROUPS, ceil_div(rows, per_group * rows_per_worker))), 1, 1)


def worker_grid(workers: int, layout: str) -> tuple[int, int, int]:
    """Workgroups giving at least `workers` workers, whatever subgroup size the device picks."""
    if layout == "wg":
        return (workers, 1, 1)
    info = device_info()
    per_group = max(1, SG_LOCAL // max(info.max_subgroup_size, info.subgroup_size, 1))
    return (ceil_div(workers, per_group), 1, 1)


def rows_of(x) -> tuple[int, int]:
    """(rows, row length) of x seen as a 2-D [M, N] over its last axis."""
    n = x.shape[-1] if x.shape else 1
    return (x.numel // n if n else 0), n


def layout_of(b: KernelBuilder, v) -> RowLayout:
    """The RowLayout of row-kernel variant v."""
    return RowLayout(b, v.layout, v.vec, v.get("cache", 0), v.wide, variant_dtype(v.params))
