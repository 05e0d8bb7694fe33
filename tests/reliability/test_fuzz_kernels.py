"""Property-based tests: the elementwise, reduction, softmax, LayerNorm, matmul and attention ops at shapes
hypothesis picks (odd sizes, single rows and columns, broadcasts, GQA groups, ragged sequence lengths)
agree with their numpy references (`reference*` in helios/kernels/*.py) computed in float64.

Bounded for lavapipe: few examples each, no deadline. Shapes travel in push constants, so no example compiles a
pipeline the kernel tests did not; attention keeps head_dim and flags to combinations the suite already builds.
(Config files are fuzzed in tests/trainer/test_config_property.py.)
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import helios.runtime as rt
from helios import ops
from helios.kernels import attention as attn
from helios.kernels import matmul as mm
from helios.kernels.pointwise import activations as act
from helios.kernels.pointwise import elementwise as ew
from helios.kernels.rows import norms
from helios.kernels.rows import reduce as red
from helios.kernels.rows import softmax as sm

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.integers(min_value=1, max_value=70)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
scales = st.sampled_from([1e-3, 1.0, 30.0])


def normal(rng: np.random.Generator, shape, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def close_to(got: np.ndarray, want: np.ndarray, rel: float, what: str, floor: float = 1e-6) -> None:
    """|got - want| <= rel * max(max|want|, floor): errors relative to the result's scale, shapes equal."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bound = rel * max(float(np.abs(want).max(initial=0.0)), floor)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


@FUZZ
@given(op=st.sampled_from(["add", "sub", "mul", "div"]), rows=dims, cols=dims,
       form=st.sampled_from(["same", "row", "column"]), seed=seeds, scale=scales)
def test_binary_elementwise(op, rows, cols, form, seed, scale):
    rng = np.random.default_rng(seed)
    a = normal(rng, (rows, cols), scale)
    b_shape = {"same": (rows, cols), "row": (cols,), "column": (rows, 1)}[form]
    b = normal(rng, b_shape, scale, shift=3.0 * scale if op == "div" else 0.0)  # keep divisors off zero
    got = getattr(ops, op)(rt.from_numpy(a), rt.from_numpy(b)).numpy()
    want = ew.reference_binary(op, a.astype(np.float64), b.astype(np.float64))
    # One rounding of an exact result: 1 ulp relative (division: the 2.5 ulp Vulkan allows).
    np.testing.assert_allclose(got, want, rtol=4e-7 if op == "div" else 1.2e-7, atol=0)


@FUZZ
@given(n=st.integers(min_value=1, max_value=5000), seed=seeds)
def test_gelu_forward_and_backward(n, seed):
    rng = np.random.default_rng(seed)
    x, dy = normal(rng, (n,), 3.0), normal(rng, (n,))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(ops.gelu(rt.from_numpy(x)).numpy(), act.reference_gelu(x64), rtol=1e-5, atol=1e-6)
    dx = ops.gelu_backward(rt.from_numpy(x), rt.from_numpy(dy)).numpy()
    np.testing.assert_allclose(dx, act.reference_gelu_grad(x64) * dy, rtol=1e-5, atol=1e-5)


@FUZZ
@given(shape=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=3).map(tuple),
       axis=st.sampled_from([-1, None]), seed=seeds, scale=scales)
def test_reductions(shape, axis, seed, scale):
    rng = np.random.default_rng(seed)
    x = normal(rng, shape, scale)
    x64, t = x.astype(np.float64), rt.from_numpy(x)
    want_shape = (1,) if axis is None or len(shape) == 1 else shape[:-1]
    for op, ref in ((ops.sum, red.reference_sum), (ops.mean, red.reference_mean)):
        want = ref(x64, axis).reshape(want_shape)
        n = x.size if axis is None else shape[-1]
        np.testing.assert_allclose(op(t, axis=axis).numpy(), want, rtol=1e-4,
                                   atol=1e-5 * scale * np.sqrt(n), err_msg=op.__name__)
    np.testing.assert_array_equal(ops.max(t, axis=axis).numpy(), red.reference_max(x, axis).reshape(want_shape))


@FUZZ
@given(rows=st.integers(min_value=1, max_value=400), cols=dims, seed=seeds)
def test_sum_rows(rows, cols, seed):
    x = normal(np.random.default_rng(seed), (rows, cols))
    want = red.reference_sum_rows(x.astype(np.float64))
    np.testing.assert_allclose(ops.sum_rows(rt.from_numpy(x)).numpy(), want, rtol=1e-4, atol=1e-5 * np.sqrt(rows))


@FUZZ
@given(rows=dims, cols=st.integers(min_value=1, max_value=1500), seed=seeds,
       spread=st.sampled_from([0.1, 4.0, 40.0]), shift=st.sampled_from([0.0, 30.0, -1000.0]))
def test_softmax_forward_and_backward(rows, cols, seed, spread, shift):
    rng = np.random.default_rng(seed)
    x, dy = normal(rng, (rows, cols), spread, shift), normal(rng, (rows, cols))
    y = ops.softmax(rt.from_numpy(x))
    want = sm.reference(x.astype(np.float64))
    np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=2e-6)
    y32 = want.astype(np.float32)
    dx = ops.softmax_backward(rt.from_numpy(y32), rt.from_numpy(dy)).numpy()
    # Near one-hot rows have tiny gradients made by cancellation (y * (dy - sum y dy)): errors are measured
    # against the scale of the terms, max|dy|, not of the result.
    close_to(dx, sm.reference_backward(y32.astype(np.float64), dy.astype(np.float64)), 1e-6, "softmax dx",
             float(np.abs(dy).max()))


@FUZZ
@given(rows=dims, cols=st.integers(min_value=1, max_value=1100), bias=st.booleans(), seed=seeds,
       shift=st.sampled_from([0.0, 8.0]))
@example(rows=15, cols=2, bias=False, seed=1, shift=8.0)  # a row of two values 0.01 apart at 8.6: rstd 157
def test_layernorm_forward_and_backward(rows, cols, bias, seed, shift):
    rng = np.random.default_rng(seed)
    x, dy = normal(rng, (rows, cols), 3.0, shift), normal(rng, (rows, cols))
    w, b = normal(rng, (cols,), 0.5, 1.0), normal(rng, (cols,)) if bias else None
    eps = 1e-5
    y, mean, rstd = ops.layernorm(rt.from_numpy(x), rt.from_numpy(w), rt.from_numpy(b) if bias else None, eps)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ry, rmean, rrstd = norms.reference_layernorm(x64, w64, None if b is None else b.astype(np.float64), eps)
    # x - mean rounds x to f32 first (|x| ulp), and rstd amplifies that into xhat = (x - mean) * rstd: rows of
    # nearly equal values (rstd >> 1, e.g. two values 0.01 apart at 8.6) lose digits in any f32 layernorm,
    # torch's included. xhat_err is that absolute error per row; each bound adds what it becomes.
    rstd_rows = rrstd.reshape(-1, 1)
    xhat_err = 4 * np.finfo(np.float32).eps * np.abs(x).max(1, keepdims=True) * rstd_rows
    assert np.all(np.abs(y.numpy() - ry) <= 1e-5 * np.abs(ry).max() + xhat_err * np.abs(w).max()), "layernorm y"
    np.testing.assert_allclose(mean.numpy(), rmean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd.numpy(), rrstd, rtol=1e-4)
    dx, dw, db = ops.layernorm_backward(rt.from_numpy(x), rt.from_numpy(w), mean, rstd, rt.from_numpy(dy))
    rdx, rdw, rdb = norms.reference_layernorm_backward(x64, w64, rmean, rrstd, dy.astype(np.float64))
    # dx cancels to ~0 for rows of (nearly) equal values: the scale of its terms is rstd * |w * dy|.
    g_rows = np.abs(dy * w).max(1, keepdims=True)
    xhat_rows = np.maximum(1.0, np.abs((x64 - rmean.reshape(-1, 1)) * rstd_rows).max(1, keepdims=True))
    dx_bound = 1e-5 * float(rrstd.max() * np.abs(dy * w).max()) + 4 * xhat_err * rstd_rows * g_rows * xhat_rows
    assert np.all(np.abs(dx.numpy() - rdx) <= dx_bound), "layernorm dx"
    dw_bound = 1e-4 * max(float(np.abs(rdw).max()), 1e-6) + (np.abs(dy) * xhat_err).sum(0)
    assert np.all(np.abs(dw.numpy() - rdw) <= dw_bound), "layernorm dw"
    if bias:
        close_to(db.numpy(), rdb, 1e-4, "layernorm db")


@FUZZ
@given(m=dims, n=dims, k=st.integers(min_value=1, max_value=200), batch=st.sampled_from([None, 1, 3]),
       trans_a=st.booleans(), trans_b=st.booleans(), seed=seeds, scale=scales)
def test_matmul(m, n, k, batch, trans_a, trans_b, seed, scale):
    rng = np.random.default_rng(seed)
    lead = () if batch is None else (batch,)
    a = normal(rng, lead + ((k, m) if trans_a else (m, k)), scale)
    b = normal(rng, lead + ((n, k) if trans_b else (k, n)), scale)
    got = ops.matmul(rt.from_numpy(a), rt.from_numpy(b), trans_a=trans_a, trans_b=trans_b).numpy()
    want, _ = mm.reference(a.astype(np.float64), b.astype(np.float64), trans_a, trans_b)
    bound, _ = mm.reference(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64), trans_a, trans_b)
    assert got.shape == want.shape
    err = np.abs(got - want)
    assert np.all(err <= 1e-5 * bound + 1e-6 * scale * scale), f"max error {err.max():.3g}"


# (head_dim, causal): the tiny trainer models' head_dim 16 (tests/trainer/conftest.py), and 64 as in the attention
# op spec's causal cases (helios/kernels/attention/__init__.py): pipelines those tests build already.
ATTENTION_SPECS = [(16, True), (64, True)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.sampled_from(ATTENTION_SPECS), B=st.integers(min_value=1, max_value=2),
       T=st.integers(min_value=1, max_value=80), n_kv=st.integers(min_value=1, max_value=3),
       group=st.integers(min_value=1, max_value=3), seed=seeds)
def test_attention_forward_and_backward(spec, B, T, n_kv, group, seed):
    D, causal = spec
    H = n_kv * group
    rng = np.random.default_rng(seed)
    qkv, do = normal(rng, (B, T, (H + 2 * n_kv) * D)), normal(rng, (B, T, H * D))
    t_qkv = rt.from_numpy(qkv)
    o, lse = ops.flash_attention(t_qkv, B, T, H, n_kv, D, causal=causal)
    qkv64 = qkv.astype(np.float64)
    ro, rlse = attn.reference(qkv64, B, T, H, n_kv, D, causal)
    close_to(o.numpy(), ro, 1e-5, "attention o")
    np.testing.assert_allclose(lse.numpy(), rlse, rtol=1e-5, atol=1e-5)
    dqkv = ops.flash_attention_backward(t_qkv, o, lse, rt.from_numpy(do), B, T, H, n_kv, D, causal=causal)
    close_to(dqkv.numpy(), attn.reference_backward(qkv64, do.astype(np.float64), B, T, H, n_kv, D, causal), 1e-4,
             "attention dqkv")
