"""SPIR-V pieces the decode kernels share: one workgroup of WG invocations working on one row held in shared memory
(vec4 units), its workgroup-wide sums, its LayerNorm and its GEMV against a row-major [N, K] weight."""

from __future__ import annotations

from collections.abc import Callable

from helios.spirv import KernelBuilder, SharedArray, Value, f32, vec

WG = 128  # invocations per workgroup: the least maxComputeWorkGroupInvocations Vulkan guarantees
vec4 = vec(f32, 4)


def kernel_variant(C: int) -> str:
    """The variant the "decode_kernels" rule (select.py) runs for rows of C floats on this device."""
    from helios.kernels.contract import selection

    return selection.choose("decode_kernels", (C,))


def horizontal_sum(v: Value) -> Value:
    """x + y + z + w of a vec4."""
    return (v.x + v.y) + (v.z + v.w)


def workgroup_sum(b: KernelBuilder, value: Value, partials: SharedArray) -> Value:
    """The sum of a scalar over the workgroup, in every invocation: subgroup sums, then each invocation adds the
    subgroups' partials (`partials` holds WG floats: room for subgroups of one lane). Called in uniform control
    flow; ends with a barrier, so `partials` may be reused at once."""
    part = b.subgroup_add(value)
    with b.if_(b.subgroup_local_id().eq(0)):
        partials[b.subgroup_id()] = part
    b.barrier()
    acc = b.var(f32, 0.0)
    with b.for_range(0, b.num_subgroups(), unroll=False) as k:
        acc.value = acc.value + partials[k]
    total = acc.value
    b.barrier()
    return total


def layernorm(b: KernelBuilder, lid: Value, units: Value, src: SharedArray, dst: SharedArray, w, bias, eps: Value,
              partials: SharedArray) -> None:
    """dst = (src - mean) * rstd * w + bias over `units` vec4s (biased variance about the mean, two passes, as
    helios's layernorm); w and bias are vec4 buffer views. Ends with a barrier: dst is visible to all."""
    n = b.cast(units, f32) * 4.0
    acc = b.var(f32, 0.0)
    with b.for_range(lid, units, WG, unroll=False) as i:
        acc.value = acc.value + horizontal_sum(src[i])
    mean = workgroup_sum(b, acc.value, partials) / n
    sq = b.var(f32, 0.0)
    with b.for_range(lid, units, WG, unroll=False) as i:
        d = src[i] - mean
        sq.value = sq.value + b.dot(d, d)
    rstd = b.rsqrt(workgroup_sum(b, sq.value, partials) / n + eps)
    with b.for_range(lid, units, WG, unroll=False) as i:
        dst[i] = (src[i] - mean) * rstd * w[i] + bias[i]
    b.barrier()


def gemv4(b: KernelBuilder, src: SharedArray, weight, rows: list, k_units: Value, chunk: int = 1) -> Value:
    """The vec4 of dot(src, weight[rows[r]]) for r = 0..3: four rows of a row-major weight (a vec4 view, rows
    `k_units` vec4s long) against the shared row `src`. Four rows share each load of src, and the loop over the row
    runs `chunk` vec4s per trip (lavapipe pays per trip and per shared load, not per multiply-add), then the rest."""
    accs = [b.var(vec4, 0.0) for _ in rows]
    bases = [r * k_units for r in rows]

    def step(k):
        s = src[k]
        for base, acc in zip(bases, accs, strict=True):
            acc.value = acc.value + s * weight[base + k]

    if chunk == 1:
        with b.for_range(0, k_units, unroll=False) as k:
            step(k)
    else:
        whole = k_units - k_units % chunk
        with b.for_range(0, whole, chunk, unroll=False) as k0:
            for c in range(chunk):
                step(k0 + c)
        with b.for_range(whole, k_units, unroll=False) as k:
            step(k)
    return b.vector(*(horizontal_sum(acc.value) for acc in accs))


def each_unit(b: KernelBuilder, lid: Value, units: Value, body: Callable[[Value], None]) -> None:
    """body(u) for u = lid, lid + WG, ... < units: the workgroup's invocations share out `units` outputs."""
    with b.for_range(lid, units, WG, unroll=False) as u:
        body(u)
