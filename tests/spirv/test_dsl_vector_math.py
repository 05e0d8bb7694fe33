"""DSL vectors (vec4 buffer views, components, construction, dot, vector-scalar ops), GLSL.std.450 math
and f16 buffers: build, spirv-val, run, compare with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helios.spirv import f16, f32, u32, vec
from tests.conftest import needs
from tests.spirv.direct_launch import build_and_run

SIZES = [1, 7, 33, 513]


def groups(n: int, wg: int = 64) -> int:
    return max(1, -(-n // wg))


@pytest.mark.parametrize("n", SIZES)
def test_vec4_views_components_dot(n):
    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n4", u32)):
            a = x.vec4[i]
            assert a.type == vec(f32, 4)
            c = b.vec4(a.w, a.z, a[1], a[0])  # reversed
            d = a * 2.0 + c * a.x - 1.0  # vec*scalar, vec+vec, vec-literal
            out.vec4[i * 2] = d
            out[i * 8 + 4] = b.dot(a, c)
            out[i * 8 + 5] = b.dot(a, a) * 0.5
            out[i * 8 + 6] = (0.5 * a).y + x[i * 4 + 2]  # scalar view of the same buffer
            out[i * 8 + 7] = b.cast(b.vec2(a.x, a.y).y > a.z, f32)

    x = np.random.default_rng(0).uniform(-2, 2, (n, 4)).astype(np.float32)
    got = build_and_run(build, {0: x, 1: np.zeros((n, 8), np.float32)}, groups(n), push={"n4": n})[1]
    c = x[:, ::-1]
    np.testing.assert_allclose(got[:, :4], x * 2 + c * x[:, :1] - 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 4], (x * c).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 5], (x * x).sum(1) * 0.5, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 6], 0.5 * x[:, 1] + x[:, 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[:, 7], (x[:, 1] > x[:, 2]).astype(np.float32))


def test_written_through_two_views_is_aliased():
    def build(b):
        b.local_size(1)
        y = b.buffer(0, f32, "rw")
        y.vec4[0] = b.vec4(1.0, 2.0, 3.0, 4.0)
        y[5] = y[1] + y.vec4[0].w

    got = build_and_run(build, {0: np.zeros(8, np.float32)}, 1)[0]
    np.testing.assert_array_equal(got, [1, 2, 3, 4, 0, 6, 0, 0])


MATH = [
    ("exp", lambda b, x: b.exp(x), np.exp, (-4, 4)),
    ("exp2", lambda b, x: b.exp2(x), np.exp2, (-4, 4)),
    ("log", lambda b, x: b.log(x), np.log, (0.01, 10)),
    ("log2", lambda b, x: b.log2(x), np.log2, (0.01, 10)),
    ("sqrt", lambda b, x: b.sqrt(x), np.sqrt, (0, 10)),
    ("rsqrt", lambda b, x: b.rsqrt(x), lambda x: 1 / np.sqrt(x), (0.01, 10)),
    ("tanh", lambda b, x: b.tanh(x), np.tanh, (-8, 8)),
    ("pow", lambda b, x: b.pow(x, 1.5), lambda x: x ** 1.5, (0.01, 4)),
    ("fma", lambda b, x: b.fma(x, x, 0.5), lambda x: x * x + 0.5, (-3, 3)),
    ("abs", lambda b, x: b.abs(x), np.abs, (-3, 3)),
    ("floor", lambda b, x: b.floor(x), np.floor, (-3, 3)),
    ("minmax", lambda b, x: b.max(b.min(x, 1.0), -0.5), lambda x: np.clip(x, -0.5, 1), (-3, 3)),
    ("clamp", lambda b, x: b.clamp(x, -0.5, 1.0), lambda x: np.clip(x, -0.5, 1), (-3, 3)),
    ("square", lambda b, x: x ** 2 + x ** 3, lambda x: x ** 2 + x ** 3, (-3, 3)),
]


@pytest.mark.parametrize("name,fn,ref,domain", MATH, ids=[m[0] for m in MATH])
@pytest.mark.parametrize("n", [7, 513])
def test_glsl_math(name, fn, ref, domain, n):
    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            out[i] = fn(b, x[i])

    x = np.random.default_rng(5).uniform(*domain, n).astype(np.float32)
    got = build_and_run(build, {0: x, 1: np.zeros(n, np.float32)}, groups(n), push={"n": n})[1]
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n", SIZES)
def test_f16_buffers(n):
    needs("float16", "storage_16bit")

    def build(b):
        b.local_size(64)
        x, out, out16 = b.buffer(0, f16, "r"), b.buffer(1, f32, "w"), b.buffer(2, f16, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            h = x[i]
            out[i] = b.cast(h, f32) * 2.0
            out16[i] = h * 3.0 + 1.0  # f16 arithmetic

    x = np.random.default_rng(2).uniform(-4, 4, n).astype(np.float16)
    out = build_and_run(build, {0: x, 1: np.zeros(n, np.float32), 2: np.zeros(n, np.float16)},
                        groups(n), push={"n": n})
    np.testing.assert_array_equal(out[1], x.astype(np.float32) * 2)
    np.testing.assert_allclose(out[2].astype(np.float32), (x * np.float16(3) + np.float16(1)).astype(np.float32),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("n4", [1, 9])
def test_f16_vec4_view(n4):
    needs("float16", "storage_16bit")

    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f16, "r"), b.buffer(1, f32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n4", u32)):
            v = x.vec4[i]
            out[i] = b.cast(v.x + v.y + v.z + v.w, f32)

    x = np.arange(4 * n4, dtype=np.float16)
    got = build_and_run(build, {0: x, 1: np.zeros(n4, np.float32)}, 1, push={"n4": n4})[1]
    np.testing.assert_array_equal(got, x.astype(np.float32).reshape(n4, 4).sum(1))
