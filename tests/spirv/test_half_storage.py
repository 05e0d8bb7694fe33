"""Half storage: bf16 and fp16 tensors in the runtime (ml_dtypes / numpy on the host), and bf16 / fp16 buffers
in the DSL that load as f32 and store from f32 rounded to nearest even, bit-exact against ml_dtypes and numpy
at awkward sizes, with NaN, infinities, subnormals, ties and overflow; scalar and vec4 views; spirv-val valid."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from helios import runtime as rt
from helios.spirv import Kernel, SpirvError, bf16, build_module, ceil_div, f32, fp16, u32, vec
from tests.conftest import dtype_params
from tests.spirv_val import spirv_cases

BF16 = np.dtype(ml_dtypes.bfloat16)
HALF = {"bf16": (bf16, BF16), "fp16": (fp16, np.dtype(np.float16))}


def _widen_then_narrow(b, v):
    """y_half[i] = half(x_f32[i] * 2) and w_f32[i] = f32(x_half[i]) * 0.5: both conversion directions."""
    b.local_size(64)
    half = HALF[v.dtype][0]
    x, xb = b.buffer(0, f32, "r"), b.buffer(1, half, "r")
    y, w = b.buffer(2, half, "w"), b.buffer(3, f32, "w")
    n = b.push("n", u32)
    i = b.global_index()
    if v.vec == 1:
        with b.if_(i < n):
            y[i] = x[i] * 2.0
            w[i] = xb[i] * 0.5
    else:
        with b.if_(i < n / 4):
            y.vec4[i] = x.vec4[i] * 2.0
            w.vec4[i] = xb.vec4[i] * 0.5


KERNEL = Kernel("test_half_convert", _widen_then_narrow,
                variants={f"{d}_{a}": {"vec": w, "dtype": d} for d in HALF for a, w in (("scalar", 1), ("vec4", 4))},
                register=False)


def _awkward(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3.4e38, -3.4e38,
                         1.00390625, 1.01171875, 65504.0], np.float32)  # last three: exact ties and a plain value
    x[: min(n, len(specials))] = specials[:n]
    bits = x.view(np.uint32)
    if n > 20:
        bits[13:20] = np.array([0x7F800001, 0xFF800001, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000,
                                0x80018000], np.uint32)  # signalling NaNs, ties to even up and down, overflow
    return x


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    g, w = got.view(np.uint16), want.view(np.uint16)
    nan_g, nan_w = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(nan_g, nan_w)
    np.testing.assert_array_equal(g[~nan_w], w[~nan_w])


@pytest.mark.parametrize("dtype", dtype_params(*HALF))
@pytest.mark.parametrize("access", ["scalar", "vec4"])
@pytest.mark.parametrize("n", [1, 7, 33, 513, 4096])
def test_half_loads_and_stores_match_numpy(dtype, access, n):
    if access == "vec4" and n % 4:
        n += 4 - n % 4
    np_dtype = HALF[dtype][1]
    x = _awkward(n, n)
    if dtype == "fp16" and n > 30:  # fp16 ties, subnormals and the overflow boundary
        x[20:30] = [1.00048828125, 1.00146484375, 6.0e-8, -3.0e-8, 2.9802322e-08, 6.1e-5, 65520.0, 65519.0,
                    -65536.0, 1e-9]
    with np.errstate(over="ignore", invalid="ignore"):
        xb = (x * 0.75).astype(np_dtype)
        doubled = (x * np.float32(2.0)).astype(np_dtype)
    tx, txb = rt.from_numpy(x), rt.from_numpy(xb)
    assert txb.dtype == np_dtype and txb.nbytes == 2 * n
    y, w = rt.empty(n, np_dtype), rt.empty(n, np.float32)
    per = 64 * (4 if access == "vec4" else 1)
    variant = f"{dtype}_{access}"
    rt.launch(KERNEL, [tx, txb, y, w], {"n": n}, ceil_div(n, per), variant=variant)
    _same_bits(y.numpy(), doubled)
    np.testing.assert_array_equal(w.numpy(), xb.astype(np.float32) * np.float32(0.5))


@pytest.mark.needs(dtype="bf16")
def test_bf16_round_trips_through_the_runtime():
    a = np.linspace(-3, 3, 37).astype(BF16)
    t = rt.from_numpy(a)
    np.testing.assert_array_equal(t.numpy().view(np.uint16), a.view(np.uint16))
    z = rt.empty(10, BF16)
    rt.fill(z, 1.5)
    np.testing.assert_array_equal(z.numpy().astype(np.float32), np.full(10, 1.5, np.float32))


@pytest.mark.parametrize("kernel,variant", spirv_cases([KERNEL]))
def test_half_kernels_are_valid_spirv(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


@pytest.mark.parametrize("half", [bf16, fp16])
def test_half_is_only_a_storage_type(half):
    def compute_in_half(b, v):
        b.local_size(1)
        b.var(half, 0.0)

    with pytest.raises(SpirvError, match="storage type"):
        build_module("bad_half", compute_in_half)

    def store_a_vector_into_a_scalar(b, v):
        b.local_size(1)
        y = b.buffer(0, bf16, "w")
        y[0] = b.splat(b.const(1.0), 4)

    with pytest.raises(SpirvError, match="stores from f32"):
        build_module("bad_bf16_store", store_a_vector_into_a_scalar)
    assert vec(f32, 4).size == 16
