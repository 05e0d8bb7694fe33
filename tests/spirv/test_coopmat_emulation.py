"""Emulated cooperative matrices (helios/spirv/coopmat_emulated.py) run on lavapipe at its subgroup size
(4, 8 or 16 with LP_NATIVE_VECTOR_WIDTH=128, 256, 512) and match numpy: fill, load and store in row and
column layouts with strides, MulAdd, conversions between element types and uses, f16 and bf16; every
subgroup of a workgroup works on its own tiles; the modules are valid SPIR-V without the extension.

The lowering is a builder switch, so these kernels run on any device; HELIOS_COOPMAT=emulate only decides
whether the selection rules pick emulated kernels (tests/kernels/matmul/test_matmul_coopmat.py runs that path).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from helios import runtime as rt
from helios.device import get_device
from helios.spirv import Kernel, KernelBuilder, SpirvError, bf16, f16, f32, u32, validate
from helios.spirv.coopmat import coopmat
from helios.spirv.tools import disassemble
from tests.conftest import needs

HALF = {"f16": (f16, np.dtype(np.float16)), "bf16": (bf16, np.dtype(ml_dtypes.bfloat16))}
LOCAL = 64  # lanes per workgroup: 16 subgroups of 4 down to 1 subgroup of 64
MAX_SUBGROUPS = LOCAL // 4
T = 16  # tile size
LDA, LDB, LDC, LDD = 20, 24, 16, 18  # strides (elements) between the rows or columns of each region
REGION_A, REGION_B, REGION_C, REGION_D = T * LDA, T * LDB, T * LDC, T * LDD


def _ops(b: KernelBuilder, v) -> None:
    """Subgroup s of the workgroup works on region s of every buffer:
    d = A @ B + C (f32, row-major, stride LDD), e = the same stored column-major, h = d converted to the half
    type, g = A stored back in the other layout, p = (h as an "a" operand) @ B + fill(0.25), q = fill(-1.5)."""
    b.coopmat_lowering("emulated")
    b.local_size(LOCAL)
    elem, _ = HALF[v.dtype]
    a, bb, c = b.buffer(0, elem, "r"), b.buffer(1, elem, "r"), b.buffer(2, f32, "r")
    d, e, h = b.buffer(3, f32, "w"), b.buffer(4, f32, "w"), b.buffer(5, elem, "w")
    g, p, q = b.buffer(6, elem, "w"), b.buffer(7, f32, "w"), b.buffer(8, f32, "w")
    info = b.buffer(9, u32, "w")
    A, B = coopmat(elem, T, T, "a"), coopmat(elem, T, T, "b")
    C, H = coopmat(f32, T, T, "acc"), coopmat(elem, T, T, "acc")
    other = "col" if v.layout == "row" else "row"
    s = b.subgroup_id()
    ma = b.coopmat_load(A, a, s * REGION_A, LDA, layout=v.layout)
    mb = b.coopmat_load(B, bb, s * REGION_B, LDB, layout=other)
    mc = b.coopmat_load(C, c, s * REGION_C, LDC)
    md = b.coopmat_muladd(ma, mb, mc)
    b.coopmat_store(d, s * REGION_D, md, LDD)
    b.coopmat_store(e, s * REGION_D, md, LDD, layout="col")
    b.coopmat_store(h, s * REGION_D, b.coopmat_convert(md, H), LDD)
    b.coopmat_store(g, s * REGION_A, ma, LDA, layout=other)
    mp = b.coopmat_muladd(b.coopmat_convert(md, A), mb, b.coopmat_fill(C, 0.25))
    b.coopmat_store(p, s * REGION_D, mp, LDD)
    b.coopmat_store(q, s * REGION_D, b.coopmat_fill(C, -1.5), LDD)
    with b.if_(b.subgroup_local_id().eq(0)):
        info[s * 2] = b.subgroup_size()
        info[s * 2 + 1] = b.num_subgroups()


OPS = Kernel("test_coopmat_emulated_ops", _ops,
             variants={f"{d}_{lay}": {"dtype": d, "layout": lay} for d in HALF for lay in ("row", "col")},
             register=False)


def _tile(region: np.ndarray, ld: int, layout: str) -> np.ndarray:
    """The 16x16 tile of a region whose rows ("row") or columns ("col") are ld elements apart."""
    m = region.reshape(T, ld)[:, :T]
    return m if layout == "row" else m.T


def _round(x: np.ndarray, half: np.dtype) -> np.ndarray:
    return x.astype(np.float32).astype(half).astype(np.float64)


@pytest.mark.subgroup()  # each op's lowering at subgroup scope: CI runs it again at subgroup sizes 4 and 16
@pytest.mark.parametrize("variant", list(OPS.variants))
def test_each_op_matches_numpy(variant):
    v = OPS.variant(variant)
    _, half = HALF[v.dtype]
    needs(dtype=half)
    other = "col" if v.layout == "row" else "row"
    n = MAX_SUBGROUPS
    rng = np.random.default_rng(7)
    a = rng.standard_normal(n * REGION_A).astype(half)
    bm = rng.standard_normal(n * REGION_B).astype(half)
    c = rng.standard_normal(n * REGION_C).astype(np.float32)
    outs = {3: np.zeros(n * REGION_D, np.float32), 4: np.zeros(n * REGION_D, np.float32),
            5: np.zeros(n * REGION_D, half), 6: np.zeros(n * REGION_A, half),
            7: np.zeros(n * REGION_D, np.float32), 8: np.zeros(n * REGION_D, np.float32),
            9: np.zeros(2 * n, np.uint32)}
    arrays = [a, bm, c, *(outs[k] for k in sorted(outs))]
    tensors = [rt.from_numpy(x) for x in arrays]
    rt.launch(OPS.module(variant), buffers=tensors, grid=1)  # the runtime keeps the pipeline for the run
    got = {k: t.numpy() for k, t in enumerate(tensors) if k >= 3}

    size = get_device().info.subgroup_size
    groups = LOCAL // size
    np.testing.assert_array_equal(got[9][: 2 * groups], np.tile([size, groups], groups))
    for s in range(groups):
        sa, sb = a[s * REGION_A:(s + 1) * REGION_A], bm[s * REGION_B:(s + 1) * REGION_B]
        ta = _tile(sa.astype(np.float64), LDA, v.layout)
        tb = _tile(sb.astype(np.float64), LDB, other)
        tc = _tile(c[s * REGION_C:(s + 1) * REGION_C].astype(np.float64), LDC, "row")
        want = ta @ tb + tc
        tol = 1e-6 * (np.abs(ta) @ np.abs(tb) + np.abs(tc)) + 1e-7
        region = slice(s * REGION_D, (s + 1) * REGION_D)
        d = _tile(got[3][region].astype(np.float64), LDD, "row")
        assert np.all(np.abs(d - want) <= tol), f"subgroup {s}: MulAdd"
        np.testing.assert_array_equal(_tile(got[4][region], LDD, "col"), d, err_msg=f"subgroup {s}: col store")
        np.testing.assert_array_equal(_tile(got[5][region].astype(np.float64), LDD, "row"), _round(d, half),
                                      err_msg=f"subgroup {s}: convert to {v.dtype}")
        g = got[6][s * REGION_A:(s + 1) * REGION_A].astype(np.float64)
        np.testing.assert_array_equal(_tile(g, LDA, other), ta, err_msg=f"subgroup {s}: store in {other} layout")
        tp = _round(d, half) @ tb + 0.25
        p = _tile(got[7][region].astype(np.float64), LDD, "row")
        assert np.all(np.abs(p - tp) <= 1e-6 * (np.abs(_round(d, half)) @ np.abs(tb) + 0.25)), f"subgroup {s}: a use"
        np.testing.assert_array_equal(_tile(got[8][region], LDD, "row"), np.full((T, T), -1.5), err_msg="fill")
        # what lies between the tiles' rows (the stride's padding) is never written
        assert not got[3][region].reshape(T, LDD)[:, T:].any()
    assert not got[3][groups * REGION_D:].any(), "no subgroup beyond NumSubgroups wrote"


@pytest.mark.parametrize("variant", list(OPS.variants))
def test_emulated_modules_are_plain_spirv(variant):
    module = OPS.module(variant)
    validate(module)
    text = disassemble(module)
    assert "Cooperative" not in text and "SPV_KHR" not in text
    assert "OpGroupNonUniformShuffle" in text  # MulAdd reads the operands' elements across lanes


def test_lowering_is_chosen_before_the_first_matrix_op():
    b = KernelBuilder("late")
    b.local_size(32)
    b.coopmat_fill(coopmat(f16, 16, 16, "acc"), 0.0)
    with pytest.raises(SpirvError, match="before the first cooperative-matrix op"):
        b.coopmat_lowering("emulated")
    with pytest.raises(SpirvError, match="lowering must be one of"):
        KernelBuilder("bad").coopmat_lowering("software")


def test_emulation_refuses_elements_it_cannot_hold():
    from helios.spirv import i32

    b = KernelBuilder("ints")
    b.coopmat_lowering("emulated")
    b.local_size(32)
    with pytest.raises(SpirvError, match="hold f16, bf16 or f32 elements"):
        b.coopmat_fill(coopmat(i32, 16, 16, "acc"), 0)
    with pytest.raises(SpirvError, match="rows \\* cols a multiple of 128 and a power-of-two column count"):
        b.coopmat_fill(coopmat(f16, 8, 8, "acc"), 0.0)
    with pytest.raises(SpirvError, match="needs K = N"):
        b.coopmat_muladd(b.coopmat_fill(coopmat(f16, 16, 8, "a"), 0.0), b.coopmat_fill(coopmat(f16, 8, 16, "b"), 0.0),
                         b.coopmat_fill(coopmat(f32, 16, 16, "acc"), 0.0))
