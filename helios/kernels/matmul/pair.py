"""Two independent matmul products in one dispatch: a Linear's backward, dX = dY @ W (nn) beside dW = dY^T @ X (tn).

On lavapipe every dispatch costs ~40 us of thread-pool handshake whatever its work (docs/BENCHMARKS.md, "where a
lavapipe dispatch's ~40 us go"), and a small model's backward is mostly such pairs. `matmul_pair` runs the two
products as one `matmul_pair` kernel where both are plain launches of one f32 register tiling: both products'
workgroups along one grid row, in alternating slices (build_pair); each workgroup runs its product's own code
(reg.build_reg at a `common.Slot`), so every element is the bits its own dispatch would give. Elsewhere, and where the
"matmul_pair" family says "separate", the two products launch one after the other as `matmul` would.

Bindings: the first product's (matmul/common.py's six), then the second's from binding 6 (seven for a tn product:
its column sums of A). Push constants and specialization constants: the first's names, the second's prefixed
SECOND ("B_"), and the first product's workgroup count, both products' together and their grid widths (PAIR_PUSH).
"""

from __future__ import annotations

from collections.abc import Mapping

from helios.kernels.contract import selection
from helios.kernels.contract.op_functions import declare_ops
from helios.kernels.matmul import KERNELS, matmul
from helios.kernels.matmul.common import Slot
from helios.kernels.matmul.reg import REG_TILINGS, bindings, build_reg
from helios.runtime import Tensor, get_runtime, launch
from helios.spirv import Kernel, KernelBuilder, Variant, u32

SECOND = "B_"  # the name prefix of the second product's push and specialization constants
PAIR_PUSH = ("pair_groups", "pair_total", "pair_gx", "pair_gx2")
LAYOUT_PAIRS = (("nn", "tn"),)  # a Linear's dX and dW (GeluMLP's dpre and dW2 too)
PAIR_CHOICES = ("paired", "separate")
SLICES = 16  # runs of each product along the grid (build_pair)
MAX_TOTAL = 65535  # workgroups of both products: one grid row


def variant_name(first: str, second: str, tiling: str) -> str:
    return f"{first}_{second}_{tiling}"


def _variants() -> dict[str, dict]:
    """f32 vec4 register tilings only: what lavapipe's table runs (the half dtypes and GPU tilings never pair)."""
    return {variant_name(l1, l2, t): {"first": l1, "second": l2, "tiling": t} for l1, l2 in LAYOUT_PAIRS
            for t in REG_TILINGS}


def _parts(v: Variant) -> tuple[Variant, Variant]:
    return KERNELS[v.first].variant(v.tiling), KERNELS[v.second].variant(v.tiling)


def build_pair(b: KernelBuilder, v: Variant) -> None:
    """Both products' workgroups along one grid row, in SLICES runs of each, alternating: slice s of the first
    product (its workgroups [s * groups / SLICES, (s + 1) * groups / SLICES)), then slice s of the second, and so on.
    lavapipe hands each of its threads one contiguous run of a grid, so each run holds its share of both products:
    the first's workgroups then the second's would leave the thread with the heavier product's run finishing last
    (4-5 ms of a step of configs/shakespeare.toml), and a workgroup-by-workgroup interleave costs the switches
    between the two bodies (~1 ms of CPU time a step). Both tilings are one workgroup shape (wx x wy)."""
    first, second = _parts(v)
    b.local_size(first.wx, first.wy)
    groups, total, gx, gx2 = (b.push(name, u32) for name in PAIR_PUSH)
    seconds = total - groups
    i = b.workgroup_id(0)
    t = b.var(u32, 0)  # i's slice: the last whose start is at or before i (empty slices start where the next does)
    for k in range(1, SLICES):
        with b.if_(groups * k / SLICES + seconds * k / SLICES <= i):
            t.value = k
    a0, b0 = groups * t.value / SLICES, seconds * t.value / SLICES
    firsts = groups * (t.value + 1) / SLICES - a0  # the first product's workgroups in the slice
    offset = i - (a0 + b0)
    zero = b.const(0, u32)
    with b.if_(offset < firsts):
        a = a0 + offset
        build_reg(b, first, Slot(0, "", (a % gx, a / gx, zero)))
    with b.else_():
        j = b0 + offset - firsts
        build_reg(b, second, Slot(bindings(first), SECOND, (j % gx2, j / gx2, zero)))


def pair_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (workgroups of the first product, of the second): one row of both, in slices (build_pair)."""
    first, second = shape
    return (first + second, 1, 1)


MATMUL_PAIR = Kernel("matmul_pair", build_pair, variants=_variants(), grid=pair_grid)


@selection.rule("matmul_pair", choices=PAIR_CHOICES, forced=())  # tests/kernels/matmul/test_matmul_pair.py
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (variant,): a pair variant both products would run in. "paired" on CPU devices (a dispatch's fixed
    cost is the thread pool's handshake there), "separate" on GPUs (independent dispatches overlap there); either
    way "separate" where the device cannot bind the pair's buffers or push its constants (contract_fits)."""
    (name,) = shape
    if not contract_fits(name, info):
        return "separate"
    return forced or ("paired" if info.cpu_profile else "separate")


def contract_fits(name: str, info) -> bool:
    """Whether the device can run the pair variant `name` (its 13 bindings, its push constants, its features)."""
    from helios.runtime import contract

    return contract.fits(MATMUL_PAIR.module(name), info)


def _pairable(first: tuple, second: tuple) -> str | None:
    """The pair variant of two deferred launches ((kernel, launch()'s keyword arguments) each), or None: a plain f32
    vec4 launch of one register tiling each, in a layout pair the kernel has, unbatched."""
    (k1, one), (k2, two) = first, second
    layouts = (k1.name.removeprefix("matmul_"), k2.name.removeprefix("matmul_"))
    tiling = one["variant"]
    if layouts not in LAYOUT_PAIRS or two["variant"] != tiling or tiling not in REG_TILINGS:
        return None
    (gx, gy, gz), (gx2, gy2, gz2) = one["grid"], two["grid"]
    if gz != 1 or gz2 != 1 or gx * gy + gx2 * gy2 > min(MAX_TOTAL, get_runtime().max_groups[0]):
        return None
    return variant_name(*layouts, tiling)


def matmul_pair(first: Mapping, second: Mapping) -> tuple[Tensor, Tensor]:
    """(matmul(**first), matmul(**second)) for two independent products (neither reads what the other writes): in
    one dispatch where the "matmul_pair" family pairs them (see the module doc), else as two, in that order. Every
    element has the bits its own matmul would give."""
    deferred: list[tuple] = []
    c1 = matmul(**first, defer=deferred)
    c2 = matmul(**second, defer=deferred)
    name = _pairable(*deferred) if len(deferred) == 2 else None
    if name is None or selection.choose("matmul_pair", (name,), "f32") != "paired":
        for kernel, args in deferred:
            launch(kernel, **args)
        return c1, c2
    (_, one), (_, two) = deferred
    gx, gy, _ = one["grid"]
    gx2, gy2, _ = two["grid"]
    push = {**one["push"], **{SECOND + k: val for k, val in two["push"].items()},
            "pair_groups": gx * gy, "pair_total": gx * gy + gx2 * gy2, "pair_gx": gx, "pair_gx2": gx2}
    spec = {**(one["spec"] or {}), **{SECOND + k: val for k, val in (two["spec"] or {}).items()}}
    launch(MATMUL_PAIR, buffers=[*one["buffers"], *two["buffers"]], push=push,
           grid=MATMUL_PAIR.grid_for((gx * gy, gx2 * gy2), name), spec=spec or None, variant=name)
    return c1, c2


OPS = declare_ops(__name__, matmul_pair)
