"""Matmul beyond what its op spec derives (tests/kernels/test_opspecs.py runs every tiling forced, every layout and
load width, forward and backward, at awkward shapes in every dtype, and spirv-val of every variant): the fused
epilogues (bias, GELU with pre-activation, GELU's derivative, residual, alpha, beta accumulation), a 2-D operand
shared by a batch and its summed gradient, variant selection (table and stored tuning winners), errors, gradients of
a linear layer against PyTorch, and the limits kernels.

Each epilogue runs once per layout, alternating the register and the tiled kernel; GELU's derivative (the MLP
backward's product) also runs at every tiling, in f32 bit for bit the product followed by gelu_backward.

Tolerance: |C - C_ref| <= 1e-5 * (|op(a)| @ |op(b)|) + 1e-6 elementwise, i.e. relative to the sum of the
magnitudes of the products (float32 accumulation over K terms; K <= 129 here). Epilogue values add 1e-5
relative on top (GELU's tanh is a polynomial a few ulp off).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios import ops
from helios.ceilings import kernels as L
from helios.kernels import matmul as mm
from helios.kernels.contract import selection, tuning
from helios.kernels.contract.dtypes import HALF_DTYPES, NUMPY, ROUNDING
from helios.kernels.matmul import coopmat as mc
from helios.kernels.matmul import select as sel
from helios.kernels.matmul.common import launch_params
from tests.conftest import dtype_params, needs_kernel


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    selection.force("matmul", None)


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in (L.LIMITS_FMA, L.LIMITS_COPY) for v in k.variants],
                         ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _operands(layout: str, M: int, N: int, K: int, batch: int | None = None, b_batched: bool = True, seed: int = 0):
    rng = np.random.default_rng(seed)
    ash = (K, M) if layout[0] == "t" else (M, K)
    bsh = (N, K) if layout[1] == "t" else (K, N)
    if batch is not None:
        ash = (batch, *ash)
        if b_batched:
            bsh = (batch, *bsh)
    return rng.standard_normal(ash).astype(np.float32), rng.standard_normal(bsh).astype(np.float32)


def _bound(a, b, layout):
    """|op(a)| @ |op(b)| in float64: the scale of the float32 rounding error of each output."""
    mag, _ = mm.reference(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64), layout[0] == "t",
                          layout[1] == "t")
    return mag


def _run(layout, a, b, **kw):
    out = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=layout[0] == "t", trans_b=layout[1] == "t", **kw)
    return out.numpy()


def _check(got, ref, bound, extra=0.0):
    err = np.abs(got - ref)
    tol = 1e-5 * bound + 1e-6 + extra * np.abs(ref)
    assert got.shape == ref.shape
    assert np.all(err <= tol), f"max error {err.max():.3g} (worst excess {(err - tol).max():.3g})"


EPILOGUES = [
    {"bias": True},
    {"bias": True, "gelu": True, "preact": True},
    {"gelu": True},
    {"residual": True, "alpha": 0.5},
    {"beta": 1.0},
    {"bias": True, "gelu": True, "preact": True, "residual": True, "beta": -0.5, "alpha": 2.0},
    {"gelu_grad": True},
    {"bias": True, "gelu_grad": True, "residual": True, "beta": 0.5, "alpha": -1.5},
]
ALL_TERMS = [e for e in EPILOGUES if len(e) > 4]  # every term with GELU, and every term with its derivative


@pytest.mark.parametrize("layout,M,N,K", [("nt", 33, 65, 12), ("nn", 7, 36, 65), ("tn", 36, 33, 7)])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(e))
def test_epilogues(layout, M, N, K, epi, force):
    force("matmul", ["reg8x8", "tiled32"][(EPILOGUES.index(epi) + "nt nn tn".split().index(layout)) % 2])
    _check_epilogue(layout, M, N, K, epi)


@pytest.mark.parametrize("layout,M,N,K", [("nt", 33, 36, 12), ("tn", 9, 30, 5)])
@pytest.mark.parametrize("epi", ALL_TERMS, ids=lambda e: "+".join(e))
def test_epilogues_of_row_stores(layout, M, N, K, epi, force, device):
    """reg32x8ak stores a row of its block's 8 columns as two vec4s where they are inside C (N % 4 == 0), else element
    by element (N = 36: the columns from 32; N = 30: every row): every epilogue term on both paths."""
    if not sel.runnable(device.info, "reg32x8ak"):
        pytest.skip("reg32x8ak needs device addresses, shaderInt64 and subgroups of 8 lanes, which this device lacks")
    force("matmul", "reg32x8ak")
    _check_epilogue(layout, M, N, K, epi)


def _preact(rng, shape, dtype: str = "f32") -> np.ndarray:
    """A pre-activation to take GELU's derivative at: both slopes (|x| up to ~9) and the clamped tails beyond 10."""
    x = rng.standard_normal(shape) * 3.0
    x.flat[::11] = 40.0
    x.flat[5::11] = -40.0
    return x.astype(np.float32).astype(NUMPY[dtype])


def _check_epilogue(layout, M, N, K, epi):
    rng = np.random.default_rng(1)
    a, b = _operands(layout, M, N, K)
    bias = rng.standard_normal(N).astype(np.float32) if epi.get("bias") else None
    residual = rng.standard_normal((M, N)).astype(np.float32) if epi.get("residual") else None
    old = rng.standard_normal((M, N)).astype(np.float32)
    grad_at = _preact(rng, (M, N)) if epi.get("gelu_grad") else None
    beta, alpha = epi.get("beta", 0.0), epi.get("alpha", 1.0)
    f64 = lambda x: None if x is None else x.astype(np.float64)  # noqa: E731
    ref, pre_ref = mm.reference(f64(a), f64(b), layout[0] == "t", layout[1] == "t", bias=f64(bias),
                                gelu=epi.get("gelu", False), residual=f64(residual), out=f64(old), beta=beta,
                                alpha=alpha, gelu_grad=f64(grad_at))
    out = rt.from_numpy(old)
    preact = rt.empty((M, N)) if epi.get("preact") else None
    got = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                    bias=None if bias is None else rt.from_numpy(bias), gelu=epi.get("gelu", False),
                    residual=None if residual is None else rt.from_numpy(residual), out=out, beta=beta,
                    alpha=alpha, preact_out=preact, gelu_grad=None if grad_at is None else rt.from_numpy(grad_at))
    assert got is out
    bound = abs(alpha) * _bound(a, b, layout) * 2.0  # GELU' <= 1.13; residual/beta terms are exact adds
    _check(got.numpy(), ref, bound, extra=1e-5)
    if preact is not None:
        _check(preact.numpy(), pre_ref, bound)


# GELU's derivative at one f32 tiling per way a block reaches the shared epilogue (the cooperative-matrix ones are
# half-only: the next test): reg8x8 (register block, store_block), reg12x8a (addressed loads), reg32x8ak (lavapipe's
# table: store_rows, C through its address) and tiled32 (shared-memory tiles); the other block sizes of a kind store
# through its same code (store_block), so they would add only ~15 s of cold compile. On the MLP
# backward's product dH = dY @ W2 (nn): a row of 1, K = 7, K = 513 across every K slice with a tail (scalar loads),
# and every contiguous dimension a multiple of 4 but of no block (vec4 loads).
GELU_GRAD_SHAPES = [(1, 33, 7), (7, 65, 513), (33, 68, 36)]
GELU_GRAD_TILINGS = ("reg8x8", "reg12x8a", "reg32x8ak", "tiled32")


@pytest.mark.parametrize("tiling", GELU_GRAD_TILINGS)
def test_gelu_grad_is_the_product_then_gelu_backward(tiling, force, device):
    """matmul(gelu_grad=pre) is the reference's product times gelu'(pre), and in f32 the very bits of the product
    followed by the elementwise gelu_backward (the same builder math: the MLP backward's fusion changes no loss)."""
    if not sel.runnable(device.info, tiling):
        pytest.skip(f"{tiling} cannot run on this device (its subgroups, shaderInt64, device addresses or workgroup "
                    "limits: helios.kernels.matmul.select.runnable)")
    force("matmul", tiling)
    for M, N, K in GELU_GRAD_SHAPES:
        assert mm.variant_name("nn", M, N, K, 1).removesuffix("_scalar") == tiling
        rng = np.random.default_rng(M + N + K)
        a, b = _operands("nn", M, N, K, seed=K)
        pre = _preact(rng, (M, N))
        ta, tb, tpre = rt.from_numpy(a), rt.from_numpy(b), rt.from_numpy(pre)
        got = mm.matmul(ta, tb, gelu_grad=tpre).numpy()
        np.testing.assert_array_equal(got, ops.gelu_backward(tpre, mm.matmul(ta, tb)).numpy())
        ref, _ = mm.reference(a.astype(np.float64), b.astype(np.float64), gelu_grad=pre.astype(np.float64))
        _check(got, ref, 2.0 * _bound(a, b, "nn"), extra=1e-5)


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
@pytest.mark.parametrize("tiling", ["reg8x8", "tiled32", "cm64", "cm64_emulated", "cm128_emulated"])
def test_gelu_grad_in_half_dtypes(dtype, tiling, force, device):
    """bf16/fp16 a and b, the pre-activation in C's dtype (half, as a half model stores it, or f32 alternating):
    C rounded once after the multiply, against float64 of the same half inputs (the unfused pair rounds twice, so
    only the reference compares). The matrix-unit tilings native where the device has them, emulated here."""
    info = device.info
    if not (mc.runs(info, dtype, tiling) if tiling in mc.CHOICES else sel.runnable(info, tiling)):
        pytest.skip(f"{tiling} cannot run for {dtype} on this device (helios.kernels.matmul.select.runnable, "
                    "helios.kernels.lib.coopmat_support.runs)")
    force("matmul", tiling)
    c_dtype = "f32" if (HALF_DTYPES.index(dtype) + len(tiling)) % 2 else dtype
    for M, N, K in [(1, 33, 7), (65, 7, 513), (36, 68, 12)]:
        name = mm.variant_name("nn", M, N, K, 1, dtype=dtype, out=c_dtype)
        assert name.startswith(dtype) and tiling in name and ("_out32_" in name) == (c_dtype == "f32")
        rng = np.random.default_rng(M + K)
        a = rng.standard_normal((M, K)).astype(np.float32).astype(NUMPY[dtype])
        b = rng.standard_normal((K, N)).astype(np.float32).astype(NUMPY[dtype])
        pre = _preact(rng, (M, N), c_dtype)
        out = rt.empty((M, N), NUMPY["f32"]) if c_dtype == "f32" else None
        got = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), out=out, gelu_grad=rt.from_numpy(pre)).numpy()
        assert got.dtype == NUMPY[c_dtype]
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ref, _ = mm.reference(a64, b64, gelu_grad=pre.astype(np.float64))
        rounding = ROUNDING[c_dtype] if c_dtype != "f32" else 0.0
        _check(got.astype(np.float64), ref, 2.0 * mm.reference(np.abs(a64), np.abs(b64))[0], extra=1e-5 + rounding)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("tiling", ["reg8x8", "tiled32"])
def test_a_shared_2d_operand_batched_and_its_gradient(layout, tiling, force):
    """b 2-D, shared by every entry of a batched a (the op spec's batched shape has both batched): C per entry, and
    matmul_backward's dB summed over the batch (dA batched like a)."""
    force("matmul", tiling)
    for M, N, K, batch in [(33, 7, 65, 3), (36, 68, 12, 2)]:
        a, b = _operands(layout, M, N, K, batch=batch, b_batched=False)
        ta, tb = layout[0] == "t", layout[1] == "t"
        ref, _ = mm.reference(a.astype(np.float64), b.astype(np.float64), ta, tb)
        got = _run(layout, a, b)
        assert got.shape == (batch, M, N)
        _check(got, ref, _bound(a, b, layout))
        dc = np.random.default_rng(5).standard_normal((batch, M, N)).astype(np.float32)
        da, db = mm.matmul_backward(rt.from_numpy(a), rt.from_numpy(b), rt.from_numpy(dc), ta, tb)
        want_da, want_db = mm.reference_backward(a.astype(np.float64), b.astype(np.float64), dc.astype(np.float64),
                                                 ta, tb)
        assert da.shape == a.shape and db.shape == b.shape
        scale = 1e-5 * np.abs(want_db).max() * batch
        np.testing.assert_allclose(da.numpy(), want_da, rtol=0, atol=1e-5 * np.abs(want_da).max())
        np.testing.assert_allclose(db.numpy(), want_db, rtol=0, atol=scale)


# K-chunked tn products (the matmul_k_chunk family's table: mm.K_CHUNK rows per chunk): M and N of 1, 7, 33 and 65
# (scalar loads, partial blocks, reg12x8a under 16 rows and reg32x8ak above), 68 x 36 (vec4 loads and row stores); K
# of 2 and 3 chunks with a tail not a multiple of 4 (only the last chunk has one) and of 3 whole chunks.
KC = mm.K_CHUNK
CHUNKED = [(1, 7, 2 * KC + 7), (7, 33, 3 * KC + 2), (33, 65, 2 * KC + 7), (65, 1, 3 * KC), (68, 36, 2 * KC + 5)]


def _chunked_or_skip(device, M: int, N: int, K: int) -> int:
    """The chunks the op runs the tn product in, or a skip naming why this device runs it in one dispatch."""
    if not device.info.cpu_profile:
        pytest.skip("K chunks are for CPU drivers (DeviceInfo.cpu_profile), which this device is not")
    if mm.KERNELS["tn"].variant(mm.variant_name("tn", M, N, K, 1)).kind != "reg":
        pytest.skip("K chunks run in register tilings, which this device refuses (matmul.select.runnable: subgroups "
                    "of 8 lanes and shaderInt64)")
    return -(-K // KC)


def _dispatches(fn):
    """(fn's result, the dispatches it recorded)."""
    before = rt.counters()["dispatches"]
    out = fn()
    return out, rt.counters()["dispatches"] - before


@pytest.mark.parametrize("M,N,K", CHUNKED)
@pytest.mark.parametrize("epi", [{}, {"beta": 1.0}, {"alpha": -0.5, "bias": True, "residual": True, "beta": 0.5}],
                         ids=lambda e: "+".join(e) or "plain")
def test_k_chunked_tn_is_bit_identical_to_nt(M, N, K, epi, device):
    """A tn product in K chunks (partial sums carried between dispatches) has the very bits of the same product in nt
    layout, which runs in one dispatch and sums each element's k's in the same order; and the reference's values."""
    chunks = _chunked_or_skip(device, M, N, K)
    rng = np.random.default_rng(M * N + K)
    a, b = _operands("tn", M, N, K, seed=K)
    old = rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if epi.get("bias") else None
    residual = rng.standard_normal((M, N)).astype(np.float32) if epi.get("residual") else None
    beta, alpha = epi.get("beta", 0.0), epi.get("alpha", 1.0)

    def run(layout, x, y):
        return mm.matmul(rt.from_numpy(x), rt.from_numpy(y), trans_a=layout == "tn", trans_b=layout == "nt",
                         bias=None if bias is None else rt.from_numpy(bias), out=rt.from_numpy(old),
                         residual=None if residual is None else rt.from_numpy(residual), beta=beta, alpha=alpha)

    got, n = _dispatches(lambda: run("tn", a, b))
    assert n == chunks
    want, n_nt = _dispatches(lambda: run("nt", np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)))
    assert n_nt == 1
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    f64 = lambda x: None if x is None else x.astype(np.float64)  # noqa: E731
    ref, _ = mm.reference(f64(a), f64(b), True, False, bias=f64(bias), residual=f64(residual), out=f64(old),
                          beta=beta, alpha=alpha)
    _check(got.numpy(), ref, abs(alpha) * _bound(a, b, "tn"), extra=1e-5)


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
def test_k_chunked_tn_in_half_dtypes(dtype, device):
    """dW of mixed precision (half a and b, f32 C accumulated with beta=1) chunks like f32, bit for bit nt's; a half C
    would round the partial sums, so that product runs in one dispatch."""
    M, N, K = 7, 33, 2 * KC + 7
    chunks = _chunked_or_skip(device, M, N, K)
    a, b = (x.astype(NUMPY[dtype]) for x in _operands("tn", M, N, K))
    old = np.random.default_rng(0).standard_normal((M, N)).astype(np.float32)
    at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
    got, n = _dispatches(lambda: mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=True, out=rt.from_numpy(old),
                                           beta=1.0))
    assert n == chunks
    want = mm.matmul(rt.from_numpy(at), rt.from_numpy(bt), trans_b=True, out=rt.from_numpy(old), beta=1.0)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    half, n = _dispatches(lambda: mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=True))
    assert n == 1 and half.dtype == a.dtype


@pytest.mark.parametrize("chunk", mm.K_CHUNKS)
def test_every_k_chunk_choice_is_bit_identical(chunk, force, device):
    """The matmul_k_chunk family's choices (0: one dispatch) are pure speed choices for the tuner: each runs the
    product in ceil(K / chunk) dispatches with nt's bits, at K with a tail and at K a multiple of every chunk."""
    force("matmul_k_chunk", chunk)
    for M, N, K in [(33, 65, 2 * KC + 7), (68, 36, 2048)]:
        _chunked_or_skip(device, M, N, K)
        a, b = _operands("tn", M, N, K, seed=chunk)
        old = np.random.default_rng(1).standard_normal((M, N)).astype(np.float32)
        ta, tb, told = rt.from_numpy(a), rt.from_numpy(b), rt.from_numpy(old)
        got, n = _dispatches(lambda: mm.matmul(ta, tb, trans_a=True, out=told, beta=1.0))  # noqa: B023 (called here)
        assert n == (-(-K // chunk) if chunk else 1)
        want = mm.matmul(rt.from_numpy(np.ascontiguousarray(a.T)), rt.from_numpy(np.ascontiguousarray(b.T)),
                         trans_b=True, out=rt.from_numpy(old), beta=1.0)
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_k_chunk_rule():
    """Table: K_CHUNK rows per chunk on CPU devices above 2 * K_CHUNK, one dispatch on GPUs and below; a forced
    chunk of K rows or more is one dispatch."""
    from types import SimpleNamespace

    def chunk(cpu: bool, K: int, forced=None):
        return selection.declared("matmul_k_chunk").rule(SimpleNamespace(cpu_profile=cpu), (64, 64, K), "f32", forced)

    assert [chunk(True, K) for K in (1024, 1025, 10240)] == [0, mm.K_CHUNK, mm.K_CHUNK]
    assert chunk(False, 10240) == 0
    assert chunk(False, 10240, 256) == 256 and chunk(True, 256, 256) == 0 and chunk(True, 300, 1024) == 0
    with pytest.raises(ValueError, match="unknown matmul_k_chunk choice 100"):
        selection.force("matmul_k_chunk", 100)


def test_k_chunks_leave_the_pre_activation_binding_alone(device):
    """A tn product with GELU's derivative (or GELU) reads the pre-activation binding the chunks carry their sums in,
    so it runs in one dispatch (test_errors: the kernel's two uses of the binding are refused together)."""
    M, N, K = 33, 65, 2 * KC + 7
    _chunked_or_skip(device, M, N, K)
    a, b = _operands("tn", M, N, K)
    pre = _preact(np.random.default_rng(0), (M, N))
    got, n = _dispatches(lambda: mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=True,
                                           gelu_grad=rt.from_numpy(pre)))
    assert n == 1
    ref, _ = mm.reference(a.astype(np.float64), b.astype(np.float64), True, gelu_grad=pre.astype(np.float64))
    _check(got.numpy(), ref, 2.0 * _bound(a, b, "tn"), extra=1e-5)


def _info(cpu: bool, subgroup: int = 8, addresses: bool = False, **changes):
    """This device's DeviceInfo as a CPU or GPU device with the given subgroups and addresses (selection only)."""
    import dataclasses

    from helios.device import get_device

    fields = dict(profile="cpu" if cpu else "gpu", device_type="cpu" if cpu else "discrete_gpu", int64=True,
                  min_subgroup_size=subgroup, buffer_device_address=addresses, cooperative_matrix=(),
                  cooperative_matrix_emulated=False)
    return dataclasses.replace(get_device().info, **(fields | changes))


def test_table_choice_by_device_type():
    assert sel.table_choice(_info(True), 2048, 1152, 1) == "reg32x16"
    assert sel.table_choice(_info(True), 7, 9, 1) == "reg8x8"
    assert sel.table_choice(_info(True, addresses=True), 2048, 1152, 1) == "reg32x8ak"
    assert sel.table_choice(_info(True, addresses=True), 16, 9, 1) == "reg32x8ak"
    assert sel.table_choice(_info(True, addresses=True), 15, 9, 1) == "reg12x8a"
    assert sel.table_choice(_info(True, addresses=True), 1, 9, 1) == "reg12x8a"
    assert sel.table_choice(_info(False), 2048, 1152, 1) == "tiled128"
    assert sel.table_choice(_info(False), 64, 64, 1) == "tiled32"


def test_register_tilings_need_subgroups_of_their_workgroup():
    """Below 8 lanes a register tiling's workgroup spans subgroups: every way to ask for one gives a tiled one."""
    info = _info(True, subgroup=4, addresses=True)
    assert sel.REG_LANES == 8 and not sel.reg_ok(info) and sel.device_tilings(info) == sel.TILED
    assert not any(sel.runnable(info, t) for t in sel.REG + sel.ADDRESSED)
    assert sel.table_choice(info, 2048, 1152, 1) in sel.TILED
    assert sel.choose(info, ("nn", 2048, 1152, 64, 1), forced="reg8x8") in sel.TILED


def test_register_tilings_need_int64():
    """They load A and B as 64-bit words: a CPU device without shaderInt64 gets tiled ones, forced or not."""
    info = _info(True, int64=False)
    assert "Int64" in mm.MATMUL_NN.module("reg8x8").capabilities
    assert not sel.reg_ok(info) and sel.device_tilings(info) == sel.TILED
    assert sel.choose(info, ("nn", 2048, 1152, 64, 1), forced="reg32x16") in sel.TILED


def test_tiled_tilings_only_within_the_workgroup_limit():
    """tiled64 and tiled128 run 256 invocations; Vulkan guarantees 128: there only tiled32 is chosen."""
    info = _info(False, max_workgroup_invocations=128, max_workgroup_size=(128, 128, 64))
    assert sel.table_choice(info, 2048, 1152, 1) == "tiled32" and sel.device_tilings(info) == ("tiled32",)
    assert sel.choose(info, ("nn", 2048, 1152, 64, 1), forced="tiled128") == "tiled32"
    assert sel.table_choice(_info(False), 2048, 1152, 1) == "tiled128"  # negative control: 1024 invocations


def test_addressed_tilings_need_device_addresses():
    info = _info(True, addresses=False)
    with pytest.raises(ValueError, match="device addresses"):
        sel.choose(info, ("nn", 8, 8, 8, 1), forced="reg12x8a")
    assert sel.table_choice(info, 2048, 1152, 1) == "reg32x16"
    assert "reg12x8a" not in sel.device_tilings(info) and sel.runnable(info, "reg8x8")


def test_stored_tuning_winner_is_used(tmp_path, monkeypatch, device):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))  # the store reads each directory's file afresh
    info = device.info
    path = sel.save_tuning(info, {sel.shape_key("nn", 40, 44, 12): "tiled64"})
    assert path.parent == tmp_path and json.loads(path.read_text())["matmul"] == {"nn:40x44x12": "tiled64"}
    tuning.STORE.forget(info)  # as a fresh process: read back from the file
    assert mm.variant_name("nn", 40, 44, 12, 1) == "tiled64"
    assert mm.variant_name("nn", 40, 44, 13, 1) == sel.table_choice(info, 40, 44, 1) + "_scalar"
    a, b = _operands("nn", 40, 44, 12)
    _check(_run("nn", a, b), a.astype(np.float64) @ b, _bound(a, b, "nn"))


def test_errors():
    a, b = rt.from_numpy(np.zeros((3, 4), np.float32)), rt.from_numpy(np.zeros((5, 6), np.float32))
    with pytest.raises(ValueError, match="inner dimensions"):
        mm.matmul(a, b)
    with pytest.raises(ValueError, match="beta"):
        mm.matmul(a, rt.from_numpy(np.zeros((4, 2), np.float32)), beta=1.0)
    with pytest.raises(ValueError, match="bias"):
        mm.matmul(a, rt.from_numpy(np.zeros((4, 2), np.float32)), bias=rt.from_numpy(np.zeros(3, np.float32)))
    b42, pre = rt.from_numpy(np.zeros((4, 2), np.float32)), rt.from_numpy(np.zeros((3, 2), np.float32))
    exclusive = r"gelu_grad .* cannot be combined with gelu=True or preact_out"
    with pytest.raises(ValueError, match=exclusive):
        mm.matmul(a, b42, gelu=True, gelu_grad=pre)
    with pytest.raises(ValueError, match=exclusive):
        mm.matmul(a, b42, preact_out=rt.empty((3, 2)), gelu_grad=pre)
    with pytest.raises(ValueError, match=r"gelu_grad has shape \(2, 2\)"):
        mm.matmul(a, b42, gelu_grad=rt.from_numpy(np.zeros((2, 2), np.float32)))
    # a K chunk's partial sums (ACC_INIT) come through the pre-activation binding: not beside GELU or its derivative
    for gelu, preact_out, gelu_grad in ((True, None, None), (False, pre, None), (False, None, pre)):
        with pytest.raises(ValueError, match="ACC_INIT"):
            launch_params(a, b42, 3, 2, 4, None, gelu, None, preact_out, 0.0, 1.0, gelu_grad, acc_init=True)


def test_linear_layer_gradients_against_torch():
    """y = gelu(x @ W^T + b): forward (nt + epilogue), dX = dZ @ W (nn), dW += dZ^T @ X (tn, accumulated)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 20)).astype(np.float32)
    w = rng.standard_normal((12, 20)).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)
    dy = rng.standard_normal((33, 12)).astype(np.float32)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, bias))
    ty = torch.nn.functional.gelu(tx @ tw.T + tb, approximate="tanh")
    ty.backward(torch.tensor(dy, dtype=torch.float64))

    hx, hw = rt.from_numpy(x), rt.from_numpy(w)
    pre = rt.empty((33, 12))
    y = mm.matmul(hx, hw, trans_b=True, bias=rt.from_numpy(bias), gelu=True, preact_out=pre)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    pre64 = pre.numpy().astype(np.float64)
    tp = torch.tensor(pre64, requires_grad=True)
    torch.nn.functional.gelu(tp, approximate="tanh").backward(torch.tensor(dy, dtype=torch.float64))
    dz = rt.from_numpy(tp.grad.numpy().astype(np.float32))  # the GELU backward belongs to activations.py
    dx = mm.matmul(dz, hw)
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    dw = rt.from_numpy(np.ones((12, 20), np.float32))  # accumulate into an existing gradient
    mm.matmul(dz, hx, trans_a=True, out=dw, beta=1.0)
    np.testing.assert_allclose(dw.numpy(), tw.grad.numpy() + 1.0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", list(L.LIMITS_FMA.variants))
def test_limits_fma(variant):
    chains = L.LIMITS_FMA.variant(variant).chains
    got = L.fma_run(128, 3, variant).numpy()
    np.testing.assert_allclose(got, L.reference_fma(-0.9, 128, 3, chains), rtol=1e-5)


@pytest.mark.parametrize("variant", list(L.LIMITS_COPY.variants))
def test_limits_copy(variant):
    needs_kernel(L.LIMITS_COPY, variant)  # u64x2 needs shaderInt64
    x = np.random.default_rng(0).standard_normal(4 * 1000).astype(np.float32)
    y = L.copy_run(rt.from_numpy(x), rt.empty(x.size), variant)
    np.testing.assert_array_equal(y.numpy(), x)
