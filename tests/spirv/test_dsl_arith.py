"""DSL arithmetic, comparisons, casts, push and spec constants, builtins: build, spirv-val, run, numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helios.spirv import SpirvError, boolean, build_module, f32, i32, u32, u64, vec
from tests.conftest import needs
from tests.spirv.direct_launch import build_and_run, launch

SIZES = [1, 7, 33, 513]


def groups(n: int, wg: int = 64) -> int:
    return max(1, -(-n // wg))


def rng_floats(n, seed=0, lo=-4.0, hi=4.0):
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(np.float32)


@pytest.mark.parametrize("n", SIZES)
def test_float_arithmetic(n):
    def build(b):
        b.local_size(64)
        x, y, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "w")
        count = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < count):
            a, c = x[i], y[i]
            out.vec4[i] = b.vec4(a + c * 2.0, (a - c) / 3.0, -a % 1.5, 1.0 - a * a)

    x, y = rng_floats(n, 1), rng_floats(n, 2)
    got = build_and_run(build, {0: x, 1: y, 2: np.zeros((n, 4), np.float32)}, groups(n), push={"n": n})[2]
    want = np.stack([x + y * 2, (x - y) / 3, np.mod(-x, 1.5), 1 - x * x], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", SIZES)
def test_int_ops(n):
    def build(b):
        b.local_size(64)
        a, c = b.buffer(0, u32, "r"), b.buffer(1, i32, "r")
        out_u, out_i = b.buffer(2, u32, "w"), b.buffer(3, i32, "w")
        count = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < count):
            u, s = a[i], c[i]
            base = i * 8
            out_u[base] = u / 7 + u % 5
            out_u[base + 1] = (u & 0xF0) | (u ^ 3)
            out_u[base + 2] = ~u
            out_u[base + 3] = (u << 3) + (u >> 2)
            out_i[base] = s / 3
            out_i[base + 1] = s % 3
            out_i[base + 2] = (s >> 1) + (-s)
            out_i[base + 3] = b.min(s, 5) * b.max(s, -5) + b.abs(s) + b.clamp(s, -10, 10)
            flags = b.select(s < 0, b.const(1, i32), 0) + b.select(u >= 100, s * 0 + 10, 0)
            out_i[base + 4] = flags + b.cast(s.eq(7), i32)

    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, n, dtype=np.uint32)
    c = rng.integers(-1000, 1000, n, dtype=np.int32)
    out = build_and_run(build, {0: a, 1: c, 2: np.zeros(8 * n, np.uint32), 3: np.zeros(8 * n, np.int32)},
                        groups(n), push={"n": n})
    gu, gi = out[2].reshape(n, 8), out[3].reshape(n, 8)
    np.testing.assert_array_equal(gu[:, 0], a // 7 + a % 5)
    np.testing.assert_array_equal(gu[:, 1], (a & 0xF0) | (a ^ 3))
    np.testing.assert_array_equal(gu[:, 2], ~a)
    np.testing.assert_array_equal(gu[:, 3], (a << 3) + (a >> 2))
    np.testing.assert_array_equal(gi[:, 0], np.trunc(c / 3).astype(np.int32))  # C-style truncation
    np.testing.assert_array_equal(gi[:, 1], np.fmod(c, 3))
    np.testing.assert_array_equal(gi[:, 2], (c >> 1) - c)
    np.testing.assert_array_equal(gi[:, 3], np.minimum(c, 5) * np.maximum(c, -5) + np.abs(c) + np.clip(c, -10, 10))
    np.testing.assert_array_equal(gi[:, 4], (c < 0) + 10 * (a >= 100) + (c == 7))


@pytest.mark.parametrize("n", [1, 33])
def test_casts_bitcast_and_bool_logic(n):
    def build(b):
        b.local_size(64)
        x, out_f, out_u = b.buffer(0, f32, "r"), b.buffer(1, f32, "w"), b.buffer(2, u32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            v = x[i]
            k = b.cast(v, i32)  # truncates toward zero
            out_f[i * 3] = b.cast(k, f32) + b.cast(i, f32)
            out_f[i * 3 + 1] = b.cast(b.cast(v * v, u32), f32)
            out_f[i * 3 + 2] = b.cast((v > 0.0) & ~(v > 2.0) | v.eq(-1.0), f32)
            out_u[i * 2] = b.bitcast(v, u32)
            out_u[i * 2 + 1] = b.bitcast(k, u32) ^ b.cast(v.ne(v), u32)

    x = rng_floats(n, 4)
    x[0] = -1.0
    out = build_and_run(build, {0: x, 1: np.zeros(3 * n, np.float32), 2: np.zeros(2 * n, np.uint32)},
                        groups(n), push={"n": n})
    f, u = out[1].reshape(n, 3), out[2].reshape(n, 2)
    k = np.trunc(x).astype(np.int32)
    np.testing.assert_array_equal(f[:, 0], k + np.arange(n))
    np.testing.assert_array_equal(f[:, 1], np.trunc(x * x))
    np.testing.assert_array_equal(f[:, 2], (((x > 0) & ~(x > 2)) | (x == -1)).astype(np.float32))
    np.testing.assert_array_equal(u[:, 0], x.view(np.uint32))
    np.testing.assert_array_equal(u[:, 1], k.view(np.uint32))


def skip_without_int64() -> None:
    needs("int64")


@pytest.mark.parametrize("n", SIZES)
def test_u64_arithmetic_constants_and_casts(n):
    skip_without_int64()

    def build(b):
        b.local_size(64)
        a, out, out32 = b.buffer(0, u64, "r"), b.buffer(1, u64, "w"), b.buffer(2, u32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            x, i64 = a[i], b.cast(i, u64)
            out[i * 5] = x * 3 + 0x1_0000_0001  # wraps mod 2**64; a constant wider than 32 bits
            out[i * 5 + 1] = (x >> 32) | (i64 << 40)
            out[i * 5 + 2] = b.cast(b.cast(i, i32) - 5, u64)  # i32 -> u64 sign-extends
            out[i * 5 + 3] = b.bitcast(b.vector(i, b.const(7, u32)), u64)  # vec2<u32> -> u64: (7 << 32) | i
            out[i * 5 + 4] = b.select(x > 0xFFFF_FFFF_0000_0000, x, i64)
            out32[i * 2] = b.cast(x, u32)  # truncates
            out32[i * 2 + 1] = b.bitcast(b.cast(x ^ 0xFFFF_FFFF, i32), u32)

    mod = build_module("t", lambda b, v: build(b))
    assert "Int64" in mod.capabilities
    x = np.random.default_rng(5).integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    out = build_and_run(build, {0: x, 1: np.zeros(5 * n, np.uint64), 2: np.zeros(2 * n, np.uint32)},
                        groups(n), push={"n": n})
    got, got32 = out[1].reshape(n, 5), out[2].reshape(n, 2)
    ii = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[:, 0], x * np.uint64(3) + np.uint64(0x1_0000_0001))
    np.testing.assert_array_equal(got[:, 1], (x >> np.uint64(32)) | (ii << np.uint64(40)))
    np.testing.assert_array_equal(got[:, 2], (np.arange(n, dtype=np.int64) - 5).view(np.uint64))
    np.testing.assert_array_equal(got[:, 3], (np.uint64(7) << np.uint64(32)) | ii)
    np.testing.assert_array_equal(got[:, 4], np.where(x > np.uint64(0xFFFF_FFFF_0000_0000), x, ii))
    low = (x & np.uint64(0xFFFF_FFFF)).astype(np.uint32)
    np.testing.assert_array_equal(got32[:, 0], low)
    np.testing.assert_array_equal(got32[:, 1], ~low)  # u64 -> i32 truncates too


@pytest.mark.parametrize("n", SIZES)
def test_bitcast_between_vec4_f32_and_vec2_u64(n):
    """Four floats moved as two 64-bit words (the lavapipe buffer-access trick) and computed on as vec4s."""
    skip_without_int64()

    def build(b):
        b.local_size(64)
        x, y = b.buffer(0, u64, "r"), b.buffer(1, u64, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            v = b.bitcast(x.vec2[i], vec(f32, 4))
            y.vec2[i] = b.bitcast(v * 2.0 + b.vec4(0.0, 1.0, 2.0, 3.0), vec(u64, 2))

    x = rng_floats(4 * n, 6)
    got = build_and_run(build, {0: x, 1: np.zeros(4 * n, np.float32)}, groups(n), push={"n": n})[1]
    np.testing.assert_array_equal(got, x * 2 + np.tile(np.arange(4, dtype=np.float32), n))


@pytest.mark.parametrize("n", SIZES)
def test_buffer_view_as_another_type(n):
    """An f32 binding read and written through a vec2<u64> view (what matmul's "wide" loads do)."""
    skip_without_int64()

    def build(b):
        b.local_size(64)
        x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        assert x.view_as(f32) is x and x.view_as(vec(f32, 4)) is x.vec4
        assert x.view_as(vec(u64, 2)) is x.view_as(vec(u64, 2))
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            v = b.bitcast(x.view_as(vec(u64, 2))[i], vec(f32, 4))
            y.view_as(vec(u64, 2))[i] = b.bitcast(v * 2.0 + b.vec4(0.0, 1.0, 2.0, 3.0), vec(u64, 2))

    mod = build_module("t", lambda b, v: build(b))
    assert "Int64" in mod.capabilities and [info.dtype for info in mod.bindings] == ["f32", "f32"]
    x = rng_floats(4 * n, 7)
    got = build_and_run(build, {0: x, 1: np.zeros(4 * n, np.float32)}, groups(n), push={"n": n})[1]
    np.testing.assert_array_equal(got, x * 2 + np.tile(np.arange(4, dtype=np.float32), n))


def test_buffer_view_as_rejects_bool():
    def build(b):
        b.local_size(1)
        b.buffer(0, f32).view_as(vec(boolean, 2))

    with pytest.raises(SpirvError, match="viewed as"):
        build_module("t", lambda b, v: build(b))


def test_bitcast_and_u64_errors():
    def build(b, what):
        b.local_size(1)
        v4 = b.splat(b.const(1.0), 4)
        if what == "size":
            b.bitcast(v4, vec(u64, 3))
        elif what == "bool":
            b.bitcast(b.const(True), u32)
        elif what == "range":
            b.const(2**64, u64)

    for what, match in (("size", "cannot bitcast"), ("bool", "cannot bitcast"), ("range", "does not fit")):
        with pytest.raises(SpirvError, match=match):
            build_module("t", lambda b, v, what=what: build(b, what))


@pytest.mark.parametrize("n", SIZES)
def test_push_constants_of_each_type(n):
    def build(b):
        b.local_size(64)
        out = b.buffer(0, f32, "w")
        count, scale, offset = b.push("n", u32), b.push("scale", f32), b.push("offset", i32)
        i = b.global_id(0)
        with b.if_(i < count):
            out[i] = b.cast(b.cast(i, i32) + offset, f32) * scale

    mod = build_module("push", lambda b, v: build(b))
    assert [(f.name, f.dtype, f.offset) for f in mod.push_fields] == [
        ("n", "u32", 0), ("scale", "f32", 4), ("offset", "i32", 8)]
    assert mod.push_size == 12
    got = build_and_run(build, {0: np.zeros(n, np.float32)}, groups(n),
                        push={"n": n, "scale": 0.5, "offset": -3})[0]
    np.testing.assert_allclose(got, (np.arange(n) - 3) * 0.5)


@pytest.mark.parametrize("wg,tile", [(64, 4), (32, 3), (1, 1)])
def test_spec_constants_workgroup_size_and_arithmetic(wg, tile):
    def build(b):
        wg_c = b.spec("WG", u32, 64)
        tile_c = b.spec("TILE", u32, 4)
        bias = b.spec("BIAS", f32, 0.25)
        b.local_size(wg_c)
        out = b.buffer(0, f32, "w")
        i = b.global_id(0)
        with b.for_range(0, tile_c) as t:
            out[i * tile_c + t] = b.cast(b.local_id(0) + wg_c * 1000 + t, f32) + bias

    mod = build_module("spec", lambda b, v: build(b))
    assert [(s.name, s.spec_id, s.dtype, s.default) for s in mod.spec_constants] == [
        ("WG", 0, "u32", 64), ("TILE", 1, "u32", 4), ("BIAS", 2, "f32", 0.25)]
    assert mod.local_size == (64, 1, 1)
    assert mod.local_size_for({"WG": wg}) == (wg, 1, 1)
    n_groups = 3
    total = n_groups * wg * tile
    got = build_and_run(build, {0: np.zeros(total, np.float32)}, n_groups,
                        spec={"WG": wg, "TILE": tile})[0]
    lid = np.repeat(np.tile(np.arange(wg), n_groups), tile)
    t = np.tile(np.arange(tile), n_groups * wg)
    np.testing.assert_array_equal(got, lid + wg * 1000 + t + 0.25)


def test_builtins_2d_grid():
    def build(b):
        b.local_size(4, 2)
        out = b.buffer(0, u32, "w")
        gx, gy = b.global_id(0), b.global_id(1)
        width = b.num_workgroups(0) * 4
        idx = (gy * width + gx) * 4
        out[idx] = b.local_id(0) + 10 * b.local_id(1)
        out[idx + 1] = b.workgroup_id(0) + 10 * b.workgroup_id(1)
        out[idx + 2] = b.num_workgroups(0) * 10 + b.num_workgroups(1)
        out[idx + 3] = b.local_index()

    nx, ny = 3, 2
    got = build_and_run(build, {0: np.zeros(nx * 4 * ny * 2 * 4, np.uint32)}, (nx, ny))[0]
    got = got.reshape(ny * 2, nx * 4, 4)
    gy, gx = np.mgrid[0:ny * 2, 0:nx * 4]
    np.testing.assert_array_equal(got[..., 0], gx % 4 + 10 * (gy % 2))
    np.testing.assert_array_equal(got[..., 1], gx // 4 + 10 * (gy // 2))
    np.testing.assert_array_equal(got[..., 2], nx * 10 + ny)
    np.testing.assert_array_equal(got[..., 3], gx % 4 + 4 * (gy % 2))


def test_type_errors_are_clear():
    def build(b):
        b.local_size(1)
        x = b.buffer(0, f32, "r")
        b.buffer(1, f32, "w")[0] = x[0] + b.global_id(0)

    with pytest.raises(SpirvError, match="f32 \\+ u32"):
        build_module("bad", lambda b, v: build(b))

    def build2(b):
        b.local_size(1)
        i = b.global_id(0)
        if i < 3:
            pass

    with pytest.raises(SpirvError, match="truth value"):
        build_module("bad2", lambda b, v: build2(b))

    def build3(b):
        b.local_size(1)
        x = b.buffer(0, f32, "r")
        x[0] = 1.0

    with pytest.raises(SpirvError, match="read-only"):
        build_module("bad3", lambda b, v: build3(b))

    def build4(b):
        b.local_size(1)
        b.buffer(0, u32, "w")[0] = b.global_id(0) * 2.5

    with pytest.raises(SpirvError, match="float literal"):
        build_module("bad4", lambda b, v: build4(b))


def test_launch_helper_rejects_missing_buffers():
    def build(b):
        b.local_size(1)
        b.buffer(0, f32, "w")[0] = 1.0

    mod = build_module("t", lambda b, v: build(b))
    with pytest.raises(ValueError):
        launch(mod, {}, 1)


def test_global_index_over_2d_grid_input_output_and_numpy_literals():
    def build(b):
        b.local_size(8)
        x, out = b.input(0, f32), b.output(1, f32)
        i = b.global_index()
        with b.if_(i < b.push("n", u32)):
            out[i] = x[i] * np.float32(3.0) + np.int64(1)

    n = 8 * 3 * 2 - 5  # a (3, 2) grid of 8-wide workgroups, last 5 invocations idle
    x = np.arange(n, dtype=np.float32)
    got = build_and_run(build, {0: x, 1: np.zeros(n, np.float32)}, (3, 2), push={"n": n})[1]
    np.testing.assert_array_equal(got, x * 3 + 1)
