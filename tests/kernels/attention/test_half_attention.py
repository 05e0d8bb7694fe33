"""bfloat16 and float16 flash attention beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs both
variants in both half dtypes against the float64 reference of the half-rounded inputs, within one rounding of the
dtype plus the f32 math's own error): the RNG counter binding, dtype-mix errors, dtype-prefixed variant names, and
half q/k/v read from a view at an offset. qkv, o, do and dqkv are in the half dtype, lse f32, all math f32.

The launches use head dims and flags of the spec's cases (64 causal; 48 full, softcapped, dropout), so they compile
no pipelines of their own.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import attention as A
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY
from tests.conftest import dtype_params


@pytest.fixture(params=dtype_params("bf16", "fp16"))
def half(request):
    return request.param


def _inputs(half, B, T, H, Hkv, D, seed=0):
    """Half qkv and do (unit normal: far inside fp16's range)."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32).astype(NUMPY[half])
    do = rng.standard_normal((B, T, H * D)).astype(np.float32).astype(NUMPY[half])
    return qkv, do


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _check(got, want, half, name, D):
    """got within the op spec's tolerance of result `name` for the variant the rule runs here in `half` (in the GPU
    profile the emulated matrix units, which round P and dS to the dtype: a wider bound than the row kernels')."""
    assert got.dtype == NUMPY[half]
    choice = selection.choose("attention", (D,), half)
    A.tolerance(choice)[name].check(got, want, half, f"{name} ({choice})")


def test_rng_counter_binding(half):
    """offset + counter[0] draws what offset + counter[0] as a plain offset draws, forward and backward."""
    B, T, H, Hkv, D = 1, 9, 2, 1, 48
    qkv, do = _inputs(half, B, T, H, Hkv, D, seed=2)
    tq, tdo = rt.from_numpy(qkv), rt.from_numpy(do)
    counter = rt.from_numpy(np.array([5], np.uint32))
    kw = dict(causal=False, softcap=3.0, dropout_p=0.3, seed=4)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D, offset=3, counter=counter, **kw)
    o2, lse2 = A.flash_attention(tq, B, T, H, Hkv, D, offset=8, **kw)
    np.testing.assert_array_equal(o.numpy().astype(np.float32), o2.numpy().astype(np.float32))
    ro, _ = A.reference(_f64(qkv), B, T, H, Hkv, D, False, 3.0, 0.3, 4, 8)
    _check(o.numpy(), ro, half, "o", D)
    d = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, offset=3, counter=counter, **kw)
    d2 = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, offset=8, **kw)
    np.testing.assert_array_equal(d.numpy().astype(np.float32), d2.numpy().astype(np.float32))


def test_backward_rejects_a_dtype_mix(half):
    B, T, H, Hkv, D = 1, 4, 2, 1, 64
    qkv, do = _inputs(half, B, T, H, Hkv, D)
    tq = rt.from_numpy(qkv)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D)
    with pytest.raises(TypeError, match="do f32.*cast"):
        A.flash_attention_backward(tq, o, lse, rt.from_numpy(do.astype(np.float32)), B, T, H, Hkv, D)
    with pytest.raises(TypeError, match="lse must be float32"):
        A.flash_attention_backward(tq, o, rt.from_numpy(lse.numpy().astype(NUMPY[half])), rt.from_numpy(do),
                                   B, T, H, Hkv, D)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        A.flash_attention(rt.from_numpy(np.zeros(qkv.shape, np.int32)), B, T, H, Hkv, D)


def test_dtype_prefixed_variant_names_force_the_base_variant(half):
    info = rt.get_runtime().info
    with selection.forcing("attention", f"{half}_tiled"):
        assert selection.choose("attention", (64,), half) == ("tiled" if A.tiled_fits(info, 64, half) else
                                                              A.rowwise(info))
        assert selection.choose("attention", (192,), half) == A.rowwise(info)  # tiles of D > 128 would not fit
    with pytest.raises(ValueError, match="unknown attention variant"):
        selection.force("attention", "f32_tiled")


def test_reads_half_qkv_in_place_from_a_view(half):
    """q/k/v are read from a view at an offset of a bigger half buffer (the fused projection's output)."""
    B, T, H, Hkv, D = 1, 20, 2, 1, 64
    qkv, do = _inputs(half, B, T, H, Hkv, D, seed=3)
    width = (H + 2 * Hkv) * D
    big = rt.from_numpy(np.concatenate([np.full(8 * width, 7.0, NUMPY[half]), qkv.ravel()]))
    view = big.view(8 * width, (B, T, width))
    o, lse = A.flash_attention(view, B, T, H, Hkv, D)
    ro, _ = A.reference(_f64(qkv), B, T, H, Hkv, D)
    _check(o.numpy(), ro, half, "o", D)
    dqkv = A.flash_attention_backward(view, o, lse, rt.from_numpy(do), B, T, H, Hkv, D)
    want = A.reference_backward(_f64(qkv), _f64(do), B, T, H, Hkv, D, o=_f64(o.numpy()))
    _check(dqkv.numpy(), want, half, "dqkv", D)
