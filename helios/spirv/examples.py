"""Proof kernels for the DSL: each is small, registered, and checked against numpy in tests/spirv.
Each declares its grid over its problem shape (given below per kernel).

- example_add: y = a + b, as scalars or as vec4s of the same buffers (tail done in scalars).
- example_reduce_shared: per-workgroup sums through a shared-memory tree (workgroup size a spec constant).
- example_reduce_subgroup: per-subgroup sums with subgroup_add.
- example_row_sum: one invocation per row, summing with for_range (variants: no loop hint, Unroll, DontUnroll).
"""

from __future__ import annotations

from helios.spirv.builder import KernelBuilder
from helios.spirv.kernel import Kernel, Variant, ceil_div
from helios.spirv.types import f32, u32


def build_add(b: KernelBuilder, v: Variant) -> None:
    b.local_size(64)
    x, y, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "w")
    n = b.push("n", u32)
    i = b.global_id(0)
    if v.vec == 1:
        with b.if_(i < n):
            out[i] = x[i] + y[i]
        return
    n4 = n / 4
    with b.if_(i < n4):
        out.vec4[i] = x.vec4[i] + y.vec4[i]
    with b.if_(i.eq(n4)):  # one invocation finishes the n % 4 tail
        with b.for_range(n4 * 4, n) as k:
            out[k] = x[k] + y[k]


ADD = Kernel(
    "example_add", build_add,
    variants={"scalar": {"vec": 1}, "vec4": {"vec": 4}},
    grid=lambda shape, variant: (ceil_div(shape[0] // variant.vec + 1, 64), 1, 1),  # shape = (n,)
    flops=lambda n: n, bytes=lambda n: 12 * n,
)


def build_reduce_shared(b: KernelBuilder, v: Variant) -> None:
    wg = b.spec("WG", u32, 64)  # workgroup size; must be a power of two
    b.local_size(wg)
    x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n = b.push("n", u32)
    i, lid = b.global_id(0), b.local_id(0)
    sh = b.shared(f32, wg)
    sh[lid] = b.select(i < n, x[b.min(i, n - 1)], 0.0)
    b.barrier()
    stride = b.var(u32, wg / 2)
    with b.while_(lambda: stride.value > 0):
        s = stride.value
        with b.if_(lid < s):
            sh[lid] = sh[lid] + sh[lid + s]
        b.barrier()
        stride.value = s >> 1
    with b.if_(lid.eq(0)):
        out[b.workgroup_id(0)] = sh[0]


REDUCE_SHARED = Kernel(
    "example_reduce_shared", build_reduce_shared,
    grid=lambda shape, variant: (max(1, ceil_div(shape[0], shape[1])), 1, 1),  # shape = (n, WG spec constant)
    flops=lambda n: n, bytes=lambda n: 4 * n,
)


def build_reduce_subgroup(b: KernelBuilder, v: Variant) -> None:
    b.local_size(64)
    x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n = b.push("n", u32)
    i = b.global_id(0)
    val = b.select(i < n, x[b.min(i, n - 1)], 0.0)
    total = b.subgroup_add(val)
    slot = b.workgroup_id(0) * b.num_subgroups() + b.subgroup_id()
    with b.if_(b.subgroup_local_id().eq(0)):
        out[slot] = total


REDUCE_SUBGROUP = Kernel(
    "example_reduce_subgroup", build_reduce_subgroup,
    grid=lambda shape, variant: (max(1, ceil_div(shape[0], 64)), 1, 1),  # shape = (n,)
    flops=lambda n: n, bytes=lambda n: 4 * n,
)


def build_row_sum(b: KernelBuilder, v: Variant) -> None:
    b.local_size(32)
    a, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    rows, cols = b.push("rows", u32), b.push("cols", u32)
    r = b.global_id(0)
    with b.if_(r < rows):
        acc = b.var(f32, 0.0)
        base = r * cols
        with b.for_range(0, cols, unroll=v.unroll) as k:
            acc += a[base + k]
        out[r] = acc.value


ROW_SUM = Kernel(
    "example_row_sum", build_row_sum,
    variants={"plain": {"unroll": None}, "unroll": {"unroll": True}, "dont_unroll": {"unroll": False}},
    grid=lambda shape, variant: (max(1, ceil_div(shape[0], 32)), 1, 1),  # shape = (rows, cols)
    flops=lambda rows, cols: rows * cols, bytes=lambda rows, cols: 4 * rows * (cols + 1),
)
