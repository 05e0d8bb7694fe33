"""bfloat16 and float16 flash attention ("bf16_*"/"fp16_*" variants of every attention kernel): qkv, o, do and dqkv
in the half dtype, lse f32, all math f32.

Two checks per case, for both variants and both half dtypes:
- against the float64 reference of the same half-rounded inputs (for the backward, also of the half o it is
  given: Delta = rowsum(dO * O) uses that o, as the kernels do). A half output is the f32 kernel's value rounded
  once, so the bound is ROUNDING[dtype] * |ref| per element plus the f32 kernels' own error, which
  test_attention bounds by 1e-5 (forward: softmax-weighted means of <= 65 rows) and 1e-4 (backward: sums of
  <= 65 * group products of recomputed probabilities) of the largest reference value; lse is f32 and keeps
  the f32 bound;
- bit for bit against the f32 kernel run on the widened inputs, output rounded to the half dtype: the half
  variants run the f32 variants' arithmetic in the same order, so this also shows the dropout masks (and the
  RNG counter binding) are the f32 path's.
spirv-val of the half variants: test_attention.test_spirv_valid iterates every kernel's variants, these included.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import attention as A
from helios.kernels import selection
from helios.kernels.attention_common import VARIANTS
from helios.kernels.dtypes import NUMPY, ROUNDING

# (B, T, H, Hkv, D, causal, softcap, dropout_p): T and D off every block size (RQ = 8 rows, KB = 4 keys,
# 64-row workgroups and 32-key tiles for "tiled"; head_dim 4 leaves 3 of the tiled variant's 4 lanes idle)
FORWARD_CASES = [
    (2, 1, 2, 2, 8, True, 0.0, 0.0),
    (1, 7, 2, 1, 12, True, 0.0, 0.0),  # GQA
    (1, 33, 4, 2, 64, True, 0.0, 0.0),  # GQA
    (1, 65, 2, 2, 4, False, 0.0, 0.0),
    (1, 33, 2, 1, 8, True, 3.0, 0.0),  # softcap
    (2, 7, 2, 2, 12, True, 0.0, 0.25),  # dropout
    (1, 65, 4, 2, 64, False, 2.0, 0.1),  # all of it
]
BACKWARD_CASES = [
    (2, 1, 2, 2, 8, True, 0.0, 0.0),
    (1, 7, 2, 1, 12, True, 0.0, 0.0),
    (1, 33, 4, 2, 64, True, 0.0, 0.0),  # GQA: dK/dV summed over 2 query heads
    (1, 65, 2, 1, 8, False, 4.0, 0.0),  # softcap, not causal, multi-query
    (1, 33, 4, 1, 12, True, 2.5, 0.2),  # dropout, softcap, multi-query
]


def _id(case):
    B, T, H, Hkv, D, causal, cap, p = case
    return f"B{B}T{T}H{H}kv{Hkv}D{D}{'' if causal else '-full'}{f'-cap{cap}' if cap else ''}{f'-drop{p}' if p else ''}"


@pytest.fixture(params=["bf16", "fp16"])
def half(request):
    return request.param


@pytest.fixture(params=list(VARIANTS))
def variant(request, force):
    force("attention", request.param)
    return request.param


def _inputs(half, B, T, H, Hkv, D, seed=0):
    """Half qkv and do (unit normal: far inside fp16's range)."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32).astype(NUMPY[half])
    do = rng.standard_normal((B, T, H * D)).astype(np.float32).astype(NUMPY[half])
    return qkv, do


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _check_rounded(got, want, half, f32_rel):
    """|got - want| <= ROUNDING * |want| (the one rounding) + f32_rel * max|want| (the f32 math), per element."""
    assert got.dtype == NUMPY[half]
    err = np.abs(_f64(got) - want)
    bound = ROUNDING[half] * np.abs(want) + 2 * f32_rel * max(np.abs(want).max(), 1e-30) + 2.0 ** -25
    worst = np.unravel_index((err - bound).argmax(), err.shape)
    assert (err <= bound).all(), f"worst excess {float((err - bound)[worst])} at {worst}"


def _rounded(x, half) -> np.ndarray:
    """An f32 result rounded to nearest even in the half dtype, widened back (what a half store keeps)."""
    return np.asarray(x, np.float32).astype(NUMPY[half]).astype(np.float32)


@pytest.mark.parametrize("case", FORWARD_CASES, ids=_id)
def test_forward(half, variant, case):
    B, T, H, Hkv, D, causal, cap, p = case
    qkv, _ = _inputs(half, B, T, H, Hkv, D)
    kw = dict(causal=causal, softcap=cap, dropout_p=p, seed=11, offset=3)
    o, lse = A.flash_attention(rt.from_numpy(qkv), B, T, H, Hkv, D, **kw)
    assert o.dtype == NUMPY[half] and o.shape == (B, T, H * D)
    assert lse.dtype == np.float32 and lse.shape == (B, H, T)
    ro, rl = A.reference(_f64(qkv), B, T, H, Hkv, D, causal, cap, p, 11, 3)
    _check_rounded(o.numpy(), ro, half, 1e-5)
    np.testing.assert_allclose(lse.numpy(), rl, rtol=1e-5, atol=1e-5)
    o32, lse32 = A.flash_attention(rt.from_numpy(qkv.astype(np.float32)), B, T, H, Hkv, D, **kw)
    np.testing.assert_array_equal(o.numpy().astype(np.float32), _rounded(o32.numpy(), half))
    np.testing.assert_array_equal(lse.numpy(), lse32.numpy())


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_id)
def test_backward(half, variant, case):
    B, T, H, Hkv, D, causal, cap, p = case
    qkv, do = _inputs(half, B, T, H, Hkv, D, seed=1)
    kw = dict(causal=causal, softcap=cap, dropout_p=p, seed=5, offset=9)
    tq, tdo = rt.from_numpy(qkv), rt.from_numpy(do)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D, **kw)
    dqkv = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, **kw)
    assert dqkv.dtype == NUMPY[half] and dqkv.shape == qkv.shape
    got = dqkv.numpy()
    want = A.reference_backward(_f64(qkv), _f64(do), B, T, H, Hkv, D, causal, cap, p, 5, 9, o=_f64(o.numpy()))
    _check_rounded(got, want, half, 1e-4)
    # each part (q, k, v) on its own scale too (dQ = dK = 0 exactly at T = 1: floor the scale)
    for lo, hi in ((0, H * D), (H * D, (H + Hkv) * D), ((H + Hkv) * D, (H + 2 * Hkv) * D)):
        part = want[..., lo:hi]
        floor = 1e-4 * max(np.abs(part).max(), 1e-2 * np.abs(want).max())
        assert (np.abs(_f64(got[..., lo:hi]) - part) <= ROUNDING[half] * np.abs(part) + 2 * floor + 2.0 ** -25).all()
    f32 = [rt.from_numpy(x.astype(np.float32)) for x in (qkv, o.numpy(), do)]
    d32 = A.flash_attention_backward(f32[0], f32[1], lse, f32[2], B, T, H, Hkv, D, **kw)
    np.testing.assert_array_equal(got.astype(np.float32), _rounded(d32.numpy(), half))


def test_rng_counter_binding(half):
    """offset + counter[0] draws what offset + counter[0] as a plain offset draws, forward and backward."""
    B, T, H, Hkv, D = 1, 9, 2, 1, 8
    qkv, do = _inputs(half, B, T, H, Hkv, D, seed=2)
    tq, tdo = rt.from_numpy(qkv), rt.from_numpy(do)
    counter = rt.from_numpy(np.array([5], np.uint32))
    kw = dict(dropout_p=0.3, seed=4)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D, offset=3, counter=counter, **kw)
    o2, lse2 = A.flash_attention(tq, B, T, H, Hkv, D, offset=8, **kw)
    np.testing.assert_array_equal(o.numpy().astype(np.float32), o2.numpy().astype(np.float32))
    ro, _ = A.reference(_f64(qkv), B, T, H, Hkv, D, True, 0.0, 0.3, 4, 8)
    _check_rounded(o.numpy(), ro, half, 1e-5)
    d = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, offset=3, counter=counter, **kw)
    d2 = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, offset=8, **kw)
    np.testing.assert_array_equal(d.numpy().astype(np.float32), d2.numpy().astype(np.float32))


def test_backward_rejects_a_dtype_mix(half):
    B, T, H, Hkv, D = 1, 4, 2, 1, 8
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
    with selection.forcing("attention", f"{half}_tiled"):
        assert selection.choose("attention", (64,), half) == "tiled"
        assert selection.choose("attention", (192,), half) == "rowwise"  # tiles of D > 128 would not fit
    with pytest.raises(ValueError, match="unknown attention variant"):
        selection.force("attention", "f32_tiled")


def test_reads_half_qkv_in_place_from_a_view(half):
    """q/k/v are read from a view at an offset of a bigger half buffer (the fused projection's output)."""
    B, T, H, Hkv, D = 1, 20, 2, 1, 8
    qkv, do = _inputs(half, B, T, H, Hkv, D, seed=3)
    width = (H + 2 * Hkv) * D
    big = rt.from_numpy(np.concatenate([np.full(8 * width, 7.0, NUMPY[half]), qkv.ravel()]))
    view = big.view(8 * width, (B, T, width))
    o, lse = A.flash_attention(view, B, T, H, Hkv, D)
    ro, _ = A.reference(_f64(qkv), B, T, H, Hkv, D)
    _check_rounded(o.numpy(), ro, half, 1e-5)
    dqkv = A.flash_attention_backward(view, o, lse, rt.from_numpy(do), B, T, H, Hkv, D)
    want = A.reference_backward(_f64(qkv), _f64(do), B, T, H, Hkv, D, o=_f64(o.numpy()))
    _check_rounded(dqkv.numpy(), want, half, 1e-4)
