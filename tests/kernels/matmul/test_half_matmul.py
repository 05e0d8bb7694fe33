"""bfloat16 and float16 matmul beyond the op spec's derived tests (tests/kernels/test_opspecs.py runs the "bf16_*"/
"fp16_*" variants, half a, b and C, of the register, tiled and matrix-unit tilings in every layout and load width,
forward and backward): "bf16_out32_*"/"fp16_out32_*" (half a and b, f32 C: parameter gradients into the fp32 grad
arena) in every layout and load width, the fused epilogues and batching in both C dtypes, against float64 numpy of
the same half-rounded inputs at awkward shapes (1, 7, 33, 65; nothing a multiple of a tile). Each (dtype, width)
meets all four layouts at both tilings, so every load path (vec4 as one u64 word or as 4 u16s, scalar; operand
contiguous along K or not) runs for both half dtypes. Mixing dtypes against the rule is a TypeError that says what
to do. spirv-val of every variant is test_opspecs.py's test_spirv_valid (test_variant_table checks they are there).

Tolerance, elementwise: |C - C_ref| <= 1e-5 * B + ROUNDING[C dtype] * |C_ref| + atol, where
- B = |alpha| * (|op(a)| @ |op(b)|) (x2 with GELU, whose slope is < 1.13) + |bias| + |residual| + |beta * C_old|: the
  float32 accumulation of K <= 65 products errs by at most ~K * 2^-24 < 1e-5 of the sum of their magnitudes, and the
  epilogue adds a few more f32 roundings of its terms;
- ROUNDING * |C_ref| is the one rounding of the stored half output (0 for an f32 C beyond the f32 terms above);
- atol 1e-6 for fp16 subnormals (2^-24 steps) near zero and GELU's tanh polynomial (a few f32 ulp).
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import matmul as mm
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import HALF_DTYPES, NUMPY, ROUNDING
from helios.kernels.matmul import select as sel
from tests.conftest import dtype_params

LAYOUTS = ["nn", "nt", "tn", "tt"]
SHAPES_ANY = [(33, 65, 7), (1, 7, 33), (65, 1, 1)]  # (M, N, K): scalar variants
SHAPES_VEC4 = [(36, 68, 12), (4, 20, 36)]  # contiguous dimensions multiples of 4, no tile multiples


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    selection.force("matmul", None)


def _half(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(NUMPY[dtype])


def _operands(dtype, layout, M, N, K, batch=None, b_batched=True, seed=0):
    rng = np.random.default_rng(seed)
    ash = (K, M) if layout[0] == "t" else (M, K)
    bsh = (N, K) if layout[1] == "t" else (K, N)
    if batch is not None:
        ash, bsh = (batch, *ash), ((batch, *bsh) if b_batched else bsh)
    return _half(rng, ash, dtype), _half(rng, bsh, dtype)


def f64(x):
    return None if x is None else np.asarray(x).astype(np.float64)


def _magnitude(a, b, layout):
    """|op(a)| @ |op(b)| in float64: the scale of the f32 accumulation error of each output."""
    mag, _ = mm.reference(np.abs(f64(a)), np.abs(f64(b)), layout[0] == "t", layout[1] == "t")
    return mag


def _check(got: np.ndarray, ref, bound, c_dtype: str, extra: float = 0.0) -> None:
    assert got.dtype == NUMPY[c_dtype] and got.shape == ref.shape
    rounding = ROUNDING[c_dtype] if c_dtype != "f32" else 0.0
    err = np.abs(got.astype(np.float64) - ref)
    tol = 1e-5 * bound + (rounding + extra) * np.abs(ref) + 1e-6
    assert np.all(err <= tol), f"max error {err.max():.3g} (worst excess {(err - tol).max():.3g})"


def _tiling(*indices: int) -> str:
    """reg8x8 (lavapipe's kind) or tiled32 (GPUs'), alternating over a test's parameters."""
    return ("reg8x8", "tiled32")[sum(indices) % 2]


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
@pytest.mark.parametrize("width", ["vec4", "scalar"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_f32_c_in_every_layout(dtype, width, layout, force):
    """The `_out32` variants (a half C: the op spec's derived tests, which run every layout in every dtype)."""
    c_dtype = "f32"
    force("matmul", _tiling(LAYOUTS.index(layout), width == "scalar", dtype == "fp16"))
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    for M, N, K in SHAPES_VEC4 if width == "vec4" else SHAPES_ANY:
        name = mm.variant_name(layout, M, N, K, 1, dtype=dtype, out=c_dtype)
        assert name.endswith("_scalar") == (width == "scalar")
        assert name.startswith(f"{dtype}_out32_" if c_dtype == "f32" else f"{dtype}_")
        a, b = _operands(dtype, layout, M, N, K)
        ref, _ = mm.reference(f64(a), f64(b), **trans)
        out = rt.empty((M, N), NUMPY["f32"]) if c_dtype == "f32" else None
        got = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), out=out, **trans).numpy()
        _check(got, ref, _magnitude(a, b, layout), c_dtype)


EPILOGUES = [
    {"bias": True},
    {"bias": True, "gelu": True, "preact": True},
    {"residual": True, "alpha": 0.5},
    {"beta": 1.0},
    {"bias": True, "gelu": True, "preact": True, "residual": True, "beta": -0.5, "alpha": 2.0},
]
EPI_SHAPES = {"nt": (33, 65, 12), "nn": (7, 36, 65), "tn": (36, 33, 7), "tt": (1, 20, 33)}


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
@pytest.mark.parametrize("c_dtype", ["half", "f32"])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(e))
def test_epilogues(dtype, c_dtype, epi, force):
    c_dtype = dtype if c_dtype == "half" else "f32"
    i = EPILOGUES.index(epi)
    # Rotated so the training forms are among them: half C nt + bias + GELU (a layer's forward), f32 C tn + beta=1
    # (dW = dY^T @ X accumulated into the fp32 grad arena).
    layout = LAYOUTS[(i + 3 * (c_dtype == "f32")) % 4]
    force("matmul", _tiling(i, c_dtype == "f32", dtype == "fp16"))
    M, N, K = EPI_SHAPES[layout]
    rng = np.random.default_rng(1)
    a, b = _operands(dtype, layout, M, N, K)
    bias = _half(rng, N, c_dtype) if epi.get("bias") else None
    residual = _half(rng, (M, N), c_dtype) if epi.get("residual") else None
    old = _half(rng, (M, N), c_dtype)
    beta, alpha, gelu = epi.get("beta", 0.0), epi.get("alpha", 1.0), epi.get("gelu", False)
    ref, pre_ref = mm.reference(f64(a), f64(b), layout[0] == "t", layout[1] == "t", bias=f64(bias), gelu=gelu,
                                residual=f64(residual), out=f64(old), beta=beta, alpha=alpha)
    out = rt.from_numpy(old)
    preact = rt.empty((M, N), NUMPY[c_dtype]) if epi.get("preact") else None
    dev = lambda x: None if x is None else rt.from_numpy(x)  # noqa: E731
    got = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                    bias=dev(bias), gelu=gelu, residual=dev(residual), out=out, beta=beta, alpha=alpha,
                    preact_out=preact)
    assert got is out
    terms = sum(np.abs(f64(t)) for t in (bias, residual) if t is not None) + abs(beta) * np.abs(f64(old))
    mag = abs(alpha) * _magnitude(a, b, layout)
    _check(got.numpy(), ref, mag * (2.0 if gelu else 1.0) + terms, c_dtype, extra=1e-5 if gelu else 0.0)
    if preact is not None:
        _check(preact.numpy(), pre_ref, mag + np.abs(f64(bias)), c_dtype)


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
@pytest.mark.parametrize("b_batched", [True, False])
def test_batched(dtype, b_batched, force):
    for layout, c_dtype, (M, N, K, batch) in [("nt", dtype, (33, 7, 65, 3)), ("tn", "f32", (36, 68, 12, 2))]:
        force("matmul", _tiling(b_batched, c_dtype == "f32"))
        a, b = _operands(dtype, layout, M, N, K, batch=batch, b_batched=b_batched)
        ref, _ = mm.reference(f64(a), f64(b), layout[0] == "t", layout[1] == "t")
        out = rt.empty((batch, M, N), NUMPY["f32"]) if c_dtype == "f32" else None
        got = mm.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                        out=out).numpy()
        _check(got, ref, _magnitude(a, b, layout), c_dtype)


def test_variant_table():
    """Every f32 variant has its bf16_/fp16_ (half C) and bf16_out32_/fp16_out32_ (f32 C) twins, params to match;
    the cooperative-matrix tilings are half-only, in both C dtypes (test_matmul_coopmat.py checks them)."""
    for kernel in mm.KERNELS.values():
        f32_names = [n for n, v in kernel.variants.items() if v.get("dtype", "f32") == "f32"]
        cm_names = [n for n, v in kernel.variants.items() if v.get("kind") == "coopmat"]
        assert len(f32_names) == 2 * (len(sel.BLOCKS) - len(sel.COOPMAT))
        assert len(cm_names) == 4 * len(sel.COOPMAT) and len(kernel.variants) == 5 * len(f32_names) + len(cm_names)
        for name in f32_names:
            params = kernel.variant(name).params
            assert "dtype" not in params and "out" not in params  # the f32 variants are untouched
            for dtype in HALF_DTYPES:
                assert kernel.variant(f"{dtype}_{name}").params == {**params, "dtype": dtype}
                assert kernel.variant(f"{dtype}_out32_{name}").params == {**params, "dtype": dtype, "out": "f32"}


@pytest.mark.needs(dtype="bf16")
def test_dtype_errors():
    rng = np.random.default_rng(0)
    ab = rt.from_numpy(_half(rng, (3, 4), "bf16"))
    bb = rt.from_numpy(_half(rng, (4, 5), "bf16"))
    b32 = rt.from_numpy(np.zeros((4, 5), np.float32))
    with pytest.raises(TypeError, match=r"a is bf16 but b is f32.*convert one first \(helios\.ops\.cast"):
        mm.matmul(ab, b32)
    with pytest.raises(TypeError, match="out is fp16"):
        mm.matmul(ab, bb, out=rt.empty((3, 5), NUMPY["fp16"]))
    with pytest.raises(TypeError, match="a and b are f32 but out is bf16"):
        mm.matmul(rt.from_numpy(np.zeros((3, 4), np.float32)), b32, out=rt.empty((3, 5), NUMPY["bf16"]))
    with pytest.raises(TypeError, match="bias must be f32 like C"):  # f32 C: epilogue tensors are f32 too
        mm.matmul(ab, bb, out=rt.empty((3, 5), NUMPY["f32"]), bias=rt.from_numpy(_half(rng, 5, "bf16")))
    with pytest.raises(TypeError, match="residual must be bf16 like C"):
        mm.matmul(ab, bb, residual=rt.from_numpy(np.zeros((3, 5), np.float32)))
