"""Flash attention on the matrix units (helios/kernels/attention_coopmat*.py), run on lavapipe through the
emulated cooperative matrices ("coopmat_emulated", forced: it runs on any device with subgroup broadcasts), at
the subgroup size the driver runs (LP_NATIVE_VECTOR_WIDTH=128, 256, 512 give 4, 8, 16).

Forward and backward against the float64 reference of the same half inputs, the backward also against torch
autograd, and dropout also against the register-only "rowwise" kernel under the same seed. Bounds, with u the
dtype's rounding (dtypes.ROUNDING): a half output is rounded once (u |ref|), and the matrix-unit kernels round P
(forward) and P Z and dS (backward) to the io dtype before their products, as FlashAttention does on tensor
cores; each such term is off by at most u relative, so an output is off by at most u times the sum of its
products' magnitudes: at most u max|v| for o, and for the gradients (no such bound: sums of signed terms)
under 4 u max|part| with these unit-normal inputs (measured: under 1.3 u). lse is f32 (scores are exact half
products summed in f32): 1e-5.

Each (dtype, head dim, causal, softcap, dropout) compiles three emulated pipelines (tens of seconds each on
lavapipe), so the cases share a few of them: T in {1, 7, 33, 129}, GQA, head dims 48, 64 and 128.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import helios.runtime as rt
from helios.device import get_device
from helios.kernels import attention as A
from helios.kernels import attention_coopmat as AC
from helios.kernels import selection
from helios.kernels.attention_coopmat_backward import ATTENTION_BACKWARD_DKV_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT
from helios.kernels.dtypes import NUMPY, ROUNDING
from helios.spirv.tools import disassemble, validate
from tests.kernels.test_attention import _torch_dqkv

KERNELS = [AC.ATTENTION_FORWARD_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT, ATTENTION_BACKWARD_DKV_COOPMAT]

# (dtype, B, T, H, Hkv, D, causal, softcap, dropout_p); four pipeline sets: (fp16, 64, causal),
# (bf16, 48, full, softcap), (bf16, 128, causal, dropout), (fp16, 128, causal, softcap, dropout)
FORWARD_CASES = [
    ("fp16", 2, 1, 2, 2, 64, True, 0.0, 0.0),
    ("fp16", 2, 33, 4, 2, 64, True, 0.0, 0.0),  # GQA
    ("bf16", 1, 129, 2, 1, 48, False, 3.0, 0.0),  # multi-query, softcap, not causal
    ("bf16", 2, 7, 3, 3, 128, True, 0.0, 0.2),  # dropout
    ("fp16", 1, 129, 4, 1, 128, True, 2.0, 0.1),  # all of it
]
BACKWARD_CASES = [
    ("fp16", 2, 33, 4, 2, 64, True, 0.0, 0.0),  # GQA: dK/dV summed over 2 query heads
    ("bf16", 1, 7, 2, 1, 48, False, 3.0, 0.0),
    ("bf16", 1, 33, 4, 2, 128, True, 0.0, 0.2),
    ("fp16", 1, 129, 4, 1, 128, True, 2.0, 0.1),
]


def _id(case):
    dtype, B, T, H, Hkv, D, causal, cap, p = case
    return (f"{dtype}-B{B}T{T}H{H}kv{Hkv}D{D}{'' if causal else '-full'}{f'-cap{cap}' if cap else ''}"
            f"{f'-drop{p}' if p else ''}")


@pytest.fixture(autouse=True)
def emulated():
    with selection.forcing("attention", "coopmat_emulated"):
        yield


def _inputs(dtype, B, T, H, Hkv, D, seed):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32).astype(NUMPY[dtype])
    do = rng.standard_normal((B, T, H * D)).astype(np.float32).astype(NUMPY[dtype])
    return qkv, do


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _parts(H, Hkv, D):
    return {"q": (0, H * D), "k": (H * D, (H + Hkv) * D), "v": ((H + Hkv) * D, (H + 2 * Hkv) * D)}


def _check(got, want, dtype, scale, what, k=4.0):
    """|got - want| <= u |want| + k u scale + 1e-5 scale, per element."""
    u = ROUNDING[dtype]
    err = np.abs(_f64(got) - want)
    bound = u * np.abs(want) + (k * u + 1e-5) * scale
    worst = np.unravel_index((err - bound).argmax(), err.shape)
    assert (err <= bound).all(), f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


def test_every_variant_is_valid_spirv():
    for kernel in KERNELS:
        for name, v in kernel.variants.items():
            module = kernel.module(name)
            validate(module, "vulkan1.3")
            text = disassemble(module)
            native = v.coopmat == "native"
            assert ("OpCooperativeMatrixMulAddKHR" in text) == native, f"{kernel.name}:{name}"
            assert ("Cooperative" in text) == native  # the emulated lowering leaves plain SPIR-V


def _runs(case, seed=0):
    dtype, B, T, H, Hkv, D, causal, cap, p = case
    qkv, do = _inputs(dtype, B, T, H, Hkv, D, seed)
    kw = dict(causal=causal, softcap=cap, dropout_p=p, seed=11, offset=3)
    return qkv, do, kw


# CI runs one pipeline set (fp16, head dim 64, causal, GQA) again at subgroup sizes 4 and 16 (`-m subgroup`): the
# lanes-per-tile split and the emulation's subgroup code are what differ between sizes, not the flags.
def _marked(cases, index, *kernels):
    marks = pytest.mark.subgroup(*kernels)
    return [pytest.param(c, marks=marks if k == index else (), id=_id(c)) for k, c in enumerate(cases)]


@pytest.mark.parametrize("case", _marked(FORWARD_CASES, 1, "attention_forward_coopmat"))
def test_forward(case):
    dtype, B, T, H, Hkv, D, causal, cap, p = case
    assert selection.choose("attention", (D,), dtype) == "coopmat_emulated"
    qkv, _, kw = _runs(case)
    o, lse = A.flash_attention(rt.from_numpy(qkv), B, T, H, Hkv, D, **kw)
    assert o.dtype == NUMPY[dtype] and o.shape == (B, T, H * D) and lse.shape == (B, H, T)
    ro, rl = A.reference(_f64(qkv), B, T, H, Hkv, D, causal, cap, p, 11, 3)
    # P's rounding moves o by at most u * sum_j p_j |v_j| / l <= u max|v| (times 1 / (1 - p) with dropout)
    v_scale = np.abs(_f64(qkv)[..., _parts(H, Hkv, D)["v"][0]:]).max() / (1 - p)
    _check(o.numpy(), ro, dtype, v_scale, "o", k=1.5)
    np.testing.assert_allclose(lse.numpy(), rl, rtol=1e-5, atol=1e-5)
    if p > 0:  # the same dropout mask as the register-only kernel under the same seed
        with selection.forcing("attention", "rowwise"):
            o_rows, lse_rows = A.flash_attention(rt.from_numpy(qkv), B, T, H, Hkv, D, **kw)
        _check(o.numpy(), _f64(o_rows.numpy()), dtype, v_scale, "o vs rowwise", k=2.5)  # rowwise's o is rounded too
        np.testing.assert_allclose(lse.numpy(), lse_rows.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", _marked(BACKWARD_CASES, 0, "attention_backward_dq_coopmat",
                                         "attention_backward_dkv_coopmat"))
def test_backward(case):
    dtype, B, T, H, Hkv, D, causal, cap, p = case
    qkv, do, kw = _runs(case, seed=1)
    tq, tdo = rt.from_numpy(qkv), rt.from_numpy(do)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D, **kw)
    dqkv = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, **kw)
    assert dqkv.dtype == NUMPY[dtype] and dqkv.shape == qkv.shape
    got = dqkv.numpy()
    want = A.reference_backward(_f64(qkv), _f64(do), B, T, H, Hkv, D, causal, cap, p, 11, 3, o=_f64(o.numpy()))
    for name, (lo, hi) in _parts(H, Hkv, D).items():  # each part on its own scale (floored: dQ = dK = 0 at T = 1)
        part = want[..., lo:hi]
        _check(got[..., lo:hi], part, dtype, max(np.abs(part).max(), 1e-2 * np.abs(want).max()), f"d{name}")
    if p > 0:
        with selection.forcing("attention", "rowwise"):
            rows = A.flash_attention_backward(tq, o, lse, tdo, B, T, H, Hkv, D, **kw).numpy()
        _check(got, _f64(rows), dtype, 2 * np.abs(want).max(), "dqkv vs rowwise")


def test_backward_against_torch():
    """torch autograd (float64) of the same math on the same half inputs (GQA, softcap, not causal)."""
    dtype, B, T, H, Hkv, D, causal, cap, p = case = BACKWARD_CASES[1]
    qkv, do, kw = _runs(case, seed=2)
    tq = rt.from_numpy(qkv)
    o, lse = A.flash_attention(tq, B, T, H, Hkv, D, **kw)
    got = A.flash_attention_backward(tq, o, lse, rt.from_numpy(do), B, T, H, Hkv, D, **kw).numpy()
    want = _torch_dqkv(_f64(qkv), _f64(do), B, T, H, Hkv, D, causal, cap, p, 11, 3)
    # torch differentiates the exact output; the kernels' Delta uses the rounded o: one more u max|dO| |P| term
    for name, (lo, hi) in _parts(H, Hkv, D).items():
        part = want[..., lo:hi]
        _check(got[..., lo:hi], part, dtype, 2 * max(np.abs(part).max(), 1e-2 * np.abs(want).max()), f"d{name}")


def test_chosen_where_matrix_units_are_offered():
    """The rule, fed DeviceInfos: native on an H100's (fp16 only: helios does not enable bf16 matrices yet) and an
    RDNA3 card's (wave32/64), emulated where the GPU profile emulates them, never on lavapipe's default profile,
    never for f32, head dims off 16 or over 128."""
    info = get_device().info
    h100 = dataclasses.replace(info, device_type="discrete", profile="", cooperative_matrix_emulated=False,
                               cooperative_matrix=((16, 16, 16, "f16", "f16", "f32", "f32"),
                                                   (16, 16, 16, "bf16", "bf16", "f32", "f32")),
                               subgroup_size=32, min_subgroup_size=32, max_subgroup_size=32, float16=True,
                               int16=True, storage_16bit=True, max_shared_memory=49152)
    rdna3 = dataclasses.replace(h100, min_subgroup_size=32, max_subgroup_size=64, max_shared_memory=65536,
                                cooperative_matrix=((16, 16, 16, "f16", "f16", "f32", "f32"),))
    lavapipe = dataclasses.replace(info, device_type="cpu", profile="", cooperative_matrix=(),
                                   cooperative_matrix_emulated=False)
    gpu_profile = dataclasses.replace(lavapipe, profile="gpu", cooperative_matrix_emulated=True,
                                      cooperative_matrix=h100.cooperative_matrix)

    def pick(device, D=64, dtype="fp16", forced=None):
        with selection.forcing("attention", forced):
            return selection.choose("attention", (D,), dtype, device)

    for D in (48, 64, 128):
        assert pick(h100, D) == pick(rdna3, D) == "coopmat"
        assert pick(gpu_profile, D) == pick(gpu_profile, D, "bf16") == "coopmat_emulated"
        assert pick(lavapipe, D) == pick(lavapipe, D, "bf16") == "rowwise"
    assert pick(h100, 64, "bf16") == pick(rdna3, 64, "bf16") == "tiled"
    assert pick(h100, 64, "f32") == pick(h100, 40) == "tiled"
    assert pick(h100, 256) == pick(gpu_profile, 144, "bf16") == "rowwise"
    assert pick(dataclasses.replace(h100, max_subgroup_size=128), 64) == "tiled"
    assert pick(dataclasses.replace(h100, max_shared_memory=16384), 64) == "tiled"
    # forcing: a matrix-unit variant the device (or launch) cannot run falls back to the rule's other choice
    assert pick(lavapipe, 64, "bf16", "coopmat_emulated") == "coopmat_emulated"
    assert pick(lavapipe, 64, "fp16", "coopmat") == "rowwise"
    assert pick(h100, 64, "f32", "coopmat") == "tiled"
    assert pick(h100, 64, "fp16", "tiled") == "tiled"
    with pytest.raises(ValueError, match="unknown attention variant"):
        selection.force("attention", "coopmat_fast")


def test_rule_picks_emulation_in_a_process_that_asks_for_it():
    """HELIOS_COOPMAT=emulate before the device exists: the unforced rule runs the matrix-unit kernels."""
    script = (
        "import numpy as np, helios.runtime as rt\n"
        "from helios.kernels import attention as A, selection\n"
        "assert selection.choose('attention', (64,), 'fp16') == 'coopmat_emulated'\n"
        "x = np.random.default_rng(0).standard_normal((2, 33, 8 * 64)).astype(np.float16)\n"
        "o, _ = A.flash_attention(rt.from_numpy(x), 2, 33, 4, 2, 64)\n"
        "ro, _ = A.reference(x.astype(np.float64), 2, 33, 4, 2, 64)\n"
        "err, scale = np.abs(o.numpy().astype(np.float64) - ro).max(), np.abs(x.astype(np.float64)).max()\n"
        "assert err <= 5 * 2.0 ** -11 * scale, (err, scale)\n"
    )
    env = {**os.environ, "HELIOS_COOPMAT": "emulate"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
