"""Small kernels for the runtime tests, written with the helios.spirv DSL (not registered globally)."""

from __future__ import annotations

from helios.spirv import Kernel, KernelBuilder, Variant, f32, u32


def groups(n: int, local: int = 64) -> int:
    return max(1, -(-n // local))


def slow_iters() -> int:
    """Loop count that makes SLOW run for tens of milliseconds (lavapipe is ~1000x slower than a GPU)."""
    from helios.device import get_device

    return 20_000 if get_device().info.is_cpu else 20_000_000


def build_axpb(b: KernelBuilder, v: Variant) -> None:
    """y = a * x + c."""
    b.local_size(64)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n, a, c = b.push("n", u32), b.push("a", f32), b.push("c", f32)
    i = b.global_id(0)
    with b.if_(i < n):
        y[i] = x[i] * a + c


def build_add_inplace(b: KernelBuilder, v: Variant) -> None:
    """x += c, in place."""
    b.local_size(64)
    x = b.buffer(0, f32, "rw")
    n, c = b.push("n", u32), b.push("c", f32)
    i = b.global_id(0)
    with b.if_(i < n):
        x[i] = x[i] + c


def build_add(b: KernelBuilder, v: Variant) -> None:
    """out = x + y."""
    b.local_size(64)
    x, y, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "w")
    n = b.push("n", u32)
    i = b.global_id(0)
    with b.if_(i < n):
        out[i] = x[i] + y[i]


def build_slow(b: KernelBuilder, v: Variant) -> None:
    """y = x + iters, summed one at a time in a loop the compiler cannot fold (float adds are not reassociated)."""
    b.local_size(64)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n, iters = b.push("n", u32), b.push("iters", u32)
    i = b.global_id(0)
    with b.if_(i < n):
        acc = b.var(f32, 0.0)
        with b.for_range(0, iters):
            acc += x[i] * 1.0e-30 + 1.0
        y[i] = x[i] + acc.value


def build_scale_spec(b: KernelBuilder, v: Variant) -> None:
    """y = x * S, with S a specialization constant."""
    b.local_size(64)
    s = b.spec("S", f32, 2.0)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    n = b.push("n", u32)
    i = b.global_id(0)
    with b.if_(i < n):
        y[i] = x[i] * s


AXPB = Kernel("test_runtime_axpb", build_axpb, register=False)
ADD_INPLACE = Kernel("test_runtime_add_inplace", build_add_inplace, register=False)
ADD = Kernel("test_runtime_add", build_add, register=False)
SLOW = Kernel("test_runtime_slow", build_slow, register=False)
SCALE = Kernel("test_runtime_scale", build_scale_spec, register=False)
