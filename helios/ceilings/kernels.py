"""Device-limit kernels: FMA throughput and copy bandwidth, so every benchmark figure can be read as a
fraction of what the device can do at all (`python -m helios.bench limits`).

- `limits_fma`: each invocation runs R independent chains of vec4 FMAs (`acc = acc * m + c`, unrolled
  INNER times per loop iteration, `n` iterations), then writes one value so nothing is dead code. R chains
  hide the FMA latency; llvmpipe maps invocations to SIMD lanes, so R vec4 chains are 4R AVX registers
  ("fma4": R = 4 fits AVX2's 16 registers; "fma8" suits GPUs, which have registers to spare).
- `limits_copy`: y = x, 4 floats per invocation, as one vec4 ("vec4") or as two 64-bit words ("u64x2":
  lavapipe moves storage-buffer data one component per invocation at a time, so fewer, wider components
  are faster there). n must be a multiple of 4; the grid is 2-D past 65535 groups.

Grid shapes: `limits_fma` (threads, n), `limits_copy` (n,).
"""

from __future__ import annotations

import numpy as np

from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, u32, u64, vec

WG = 64
INNER = 16  # FMAs per chain per loop iteration


def build_fma(b: KernelBuilder, v: Variant) -> None:
    b.local_size(WG)
    out = b.buffer(0, f32, "w")
    n = b.push("n", u32)
    seed = b.push("seed", f32)
    i = b.global_id(0) + b.global_id(1) * b.num_workgroups(0) * WG
    x = b.cast(i, f32) * 1e-9 + seed
    v4 = vec(f32, 4)
    m, c = b.splat(x * 0.5 + 0.999, 4), b.splat(x * 1e-3, 4)  # runtime values: no constant folding
    accs = [b.var(v4, b.splat(x + float(r), 4)) for r in range(v.chains)]
    with b.for_range(0, n):
        vals = [a.value for a in accs]
        for _ in range(INNER):
            vals = [b.fma(val, m, c) for val in vals]
        for a, val in zip(accs, vals, strict=True):
            a.value = val
    total = accs[0].value
    for a in accs[1:]:
        total = total + a.value
    out[i] = total.x + total.y + total.z + total.w


def build_copy(b: KernelBuilder, v: Variant) -> None:
    b.local_size(WG)
    wide = v.access == "u64x2"
    t = u64 if wide else f32
    x, y = b.buffer(0, t, "r"), b.buffer(1, t, "w")
    n4 = b.push("n4", u32)
    i = b.global_id(0) + b.global_id(1) * b.num_workgroups(0) * WG
    with b.if_(i < n4):
        if wide:
            y.vec2[i] = x.vec2[i]
        else:
            y.vec4[i] = x.vec4[i]


def fma_flops(threads: int, n: int, chains: int) -> int:
    return 2 * 4 * chains * INNER * n * threads


def fma_size(is_cpu: bool, iterations_on_cpu: int = 100) -> tuple[int, int]:
    """(threads, iterations) of an FMA-ceiling run: 64x64 threads on a CPU driver, 2**20 with 2000 iterations on
    a GPU. The bench (helios.bench limits) and the MFU peak (helios.ceilings.peak) both measure this problem."""
    return (64 * 64, iterations_on_cpu) if is_cpu else (1 << 20, 2000)


def _grid_2d(groups: int, max_x: int = 65535) -> tuple[int, int, int]:
    gy = ceil_div(groups, max_x)
    return ceil_div(groups, gy), gy, 1


LIMITS_FMA = Kernel("limits_fma", build_fma, variants={"fma4": {"chains": 4}, "fma8": {"chains": 8}},
                    grid=lambda shape, variant: _grid_2d(ceil_div(shape[0], WG)), flops=fma_flops,
                    bytes=lambda threads, n, chains: 4 * threads)
LIMITS_COPY = Kernel("limits_copy", build_copy, variants={"vec4": {"access": "vec4"}, "u64x2": {"access": "u64x2"}},
                     grid=lambda shape, variant: _grid_2d(ceil_div(shape[0] // 4, WG)), flops=lambda n: 0,
                     bytes=lambda n: 8 * n)


def reference_fma(seed: float, threads: int, n: int, chains: int) -> np.ndarray:
    """What limits_fma writes, in float64 (the chains converge to c / (1 - m))."""
    i = np.arange(threads, dtype=np.float64)
    x = i * 1e-9 + seed
    m, c = x * 0.5 + 0.999, x * 1e-3
    total = np.zeros(threads)
    for r in range(chains):
        acc = x + r
        for _ in range(n * INNER):
            acc = acc * m + c
        total += acc
    return 4 * total


def fma_run(threads: int, n: int, variant: str = "fma4", seed: float = -0.9, out: Tensor | None = None) -> Tensor:
    """Dispatch the FMA kernel over `threads` invocations (a multiple of 64), n loop iterations each."""
    out = out if out is not None else empty(threads)
    launch(LIMITS_FMA, buffers=[out], push={"n": n, "seed": seed}, grid=LIMITS_FMA.grid_for((threads, n), variant),
           variant=variant)
    return out


def copy_run(x: Tensor, y: Tensor, variant: str = "vec4") -> Tensor:
    """y = x (n a multiple of 4)."""
    if x.numel % 4 or y.numel != x.numel:
        raise ValueError(f"copy needs equal sizes, a multiple of 4: {x.shape}, {y.shape}")
    launch(LIMITS_COPY, buffers=[x, y], push={"n4": x.numel // 4}, grid=LIMITS_COPY.grid_for((x.numel,), variant),
           variant=variant)
    return y


__all__ = ["LIMITS_FMA", "LIMITS_COPY", "fma_run", "copy_run", "fma_flops", "reference_fma"]
