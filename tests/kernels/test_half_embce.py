"""bf16 and fp16 embedding, cross-entropy and column copies (the "bf16_*" / "fp16_*" variants), what the op specs'
derived tests (tests/kernels/test_opspecs.py runs embedding and cross_entropy in every dtype, forced choice and
awkward shape) leave out: out-of-range ids, the captured step's plan from half dy, operand dtype errors, a loss
scale as grad_scale, logits far from 0, every row ignored, out= and the dispatch count, and the column copies, for
both half dtypes (the `half` fixture).

Exactness: column copies are bit exact, their accumulate form is one f32 add rounded once. Cross-entropy is f32 math
on half-rounded logits: the loss within f32 error of the float64 reference; dlogits store (softmax - onehot) * coef
computed in f32 and rounded once to the half dtype, so within ~2 half roundings relative plus an absolute term for
p - 1 near the target (f32 cancellation, ~1e-6 of coef) and, in fp16, the subnormal spacing 2^-24.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract.dtypes import NUMPY, ROUNDING
from helios.kernels.indexing import embedding as E
from helios.kernels.indexing.layout import reference_concat
from helios.kernels.rows import cross_entropy as C
from tests.conftest import dtype_params
from tests.kernels.indexing.test_embedding import fixed_and_exact_plan_gradients


@pytest.fixture(params=dtype_params("bf16", "fp16"))
def half(request) -> str:
    return request.param


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """a rounded to the half dtype (to nearest even), as that dtype."""
    return np.asarray(a, np.float32).astype(NUMPY[dtype])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


# -- embedding ---------------------------------------------------------------------------------------

def test_lookup_out_of_range_ids_give_zero_rows(half):
    ids = np.array([[0, -1, 5, 2]], dtype=np.int32)
    table = _rounded(np.arange(20).reshape(5, 4) - 7.5, half)
    out = E.embedding(rt.from_numpy(ids), rt.from_numpy(table)).numpy().astype(np.float32)
    np.testing.assert_array_equal(out, [table[0], np.zeros(4), np.zeros(4), table[2]])


@pytest.mark.parametrize("n_tokens,vocab", [(1, 4), (7, 3), (33, 64), (513, 40)])
def test_fixed_capacity_plan_with_half_dy(half, n_tokens, vocab):
    """The captured step's plan (FixedScatterPlan) gives the exact plan's gradients bit for bit from half dy."""
    rng = np.random.default_rng(n_tokens)
    ids = rng.integers(-1, vocab + 1, (1, n_tokens)).astype(np.int32)
    dy = _rounded(rng.standard_normal((n_tokens, 12)), half)
    got, want = fixed_and_exact_plan_gradients(E.FixedScatterPlan(n_tokens, vocab), ids, dy, vocab)
    np.testing.assert_array_equal(got, want)
    ref, _ = E.reference_backward(ids.astype(np.int64), dy.astype(np.float64), vocab)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-5)


def test_embedding_operand_dtypes_are_checked(half):
    ids = rt.from_numpy(np.zeros((1, 4), np.int32))
    table = rt.from_numpy(np.zeros((5, 4), NUMPY[half]))
    with pytest.raises(TypeError, match="pos_table is f32"):
        E.embedding(ids, table, rt.from_numpy(np.zeros((4, 4), np.float32)))
    with pytest.raises(TypeError, match="out is f32"):
        E.embedding(ids, table, out=rt.empty((4, 4)))
    dy = rt.from_numpy(np.zeros((4, 4), NUMPY[half]))
    with pytest.raises(TypeError, match="dtable_out .*must be float32"):
        E.embedding_backward(ids, table, None, dy, rt.empty((5, 4), NUMPY[half]))
    with pytest.raises(TypeError, match="dpos_table_out .*must be float32"):
        E.embedding_backward(ids, table, table, dy, rt.zeros((5, 4)), rt.empty((5, 4), NUMPY[half]))


# -- cross-entropy -----------------------------------------------------------------------------------

def _ce_case(rows, vocab, dtype, seed=0, scale=3.0, ignore=-1):
    rng = np.random.default_rng(seed)
    logits = _rounded(rng.standard_normal((rows, vocab)) * scale, dtype)  # |x| < 20: far inside fp16's range
    targets = rng.integers(0, vocab, size=rows).astype(np.int32)
    if rows > 2:
        targets[1] = ignore
    return logits, targets


def _check_ce(dtype, logits, targets, loss, dlogits, grad_scale=1.0, ignore_index=-1):
    ref_loss, ref_d = C.reference(logits.astype(np.float64), targets, ignore_index=ignore_index,
                                  grad_scale=grad_scale)
    assert loss.dtype == np.float32 and dlogits.dtype == NUMPY[dtype] and dlogits.shape == logits.shape
    np.testing.assert_allclose(loss.numpy()[0], ref_loss, rtol=2e-6, atol=1e-6)  # f32 math on the same inputs
    n_valid = max(1, int(np.sum((targets != ignore_index) & (targets >= 0) & (targets < logits.shape[-1]))))
    coef = abs(grad_scale) / n_valid
    atol = 1e-6 * coef + (2.0 ** -24 if dtype == "fp16" else 0.0)
    np.testing.assert_allclose(dlogits.numpy().astype(np.float64), ref_d, rtol=2 * ROUNDING[dtype], atol=atol)


@pytest.mark.parametrize("grad_scale", [0.25, 1024.0])
def test_cross_entropy_grad_scale_and_ignore_index(half, grad_scale):
    """A loss scale (how fp16 training keeps small dlogits out of the subnormals), ignore_index -100 and an
    out-of-range target (ignored)."""
    logits, targets = _ce_case(33, 513, half, seed=3, ignore=-100)
    targets[5] = 513
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets), ignore_index=-100,
                                    grad_scale=grad_scale)
    _check_ce(half, logits, targets, loss, dlogits, grad_scale=grad_scale, ignore_index=-100)
    assert not np.any(dlogits.numpy()[[1, 5]].astype(np.float32))


def test_cross_entropy_large_logits_subtract_the_max(half):
    """Logits around 1000 (bf16 spacing 4 there, fp16 0.5): the row max is an element, so x - max is exact."""
    rng = np.random.default_rng(4)
    logits = _rounded(rng.standard_normal((2, 5, 64)) * 10 + 1000, half)
    targets = rng.integers(0, 64, size=(2, 5)).astype(np.int32)
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets))
    _check_ce(half, logits.reshape(10, 64), targets.reshape(10), loss, dlogits.reshape((10, 64)))


def test_cross_entropy_all_rows_ignored(half):
    logits, _ = _ce_case(4, 9, half)
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(np.full(4, -1, np.int32)))
    assert loss.numpy()[0] == 0.0
    assert not np.any(dlogits.numpy().astype(np.float32))


def test_cross_entropy_into_out_and_three_dispatches(half):
    logits, targets = _ce_case(7, 33, half, seed=5)
    lt, tt = rt.from_numpy(logits), rt.from_numpy(targets)
    out = rt.empty((7, 33), NUMPY[half])
    rt.sync()
    before = rt.counters()["dispatches"]
    loss, dlogits = C.cross_entropy(lt, tt, out=out)
    assert dlogits is out and rt.counters()["dispatches"] - before == 3
    _check_ce(half, logits, targets, loss, dlogits)
    with pytest.raises(TypeError, match="out is f32"):
        C.cross_entropy(lt, tt, out=rt.empty((7, 33)))


# -- layout ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("widths", [(1,), (1, 7), (33, 4, 513)])
def test_concat_and_slice_are_bit_exact(half, rows, widths):
    rng = np.random.default_rng(rows + sum(widths))
    parts = [_rounded(rng.standard_normal((rows, w)) * 5, half) for w in widths]
    out = ops.concat([rt.from_numpy(p) for p in parts])
    want = reference_concat(parts)
    assert out.dtype == NUMPY[half]
    np.testing.assert_array_equal(_bits(out.numpy()), _bits(want))
    start = widths[0] // 2
    got = ops.slice_columns(out, start, want.shape[1])
    assert got.dtype == NUMPY[half]
    np.testing.assert_array_equal(_bits(got.numpy()), _bits(want[:, start:]))


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (33, 513)])
def test_copy_columns_accumulates_once_rounded(half, rows, cols):
    rng = np.random.default_rng(cols)
    src = _rounded(rng.standard_normal((rows, cols)), half)
    dst = _rounded(rng.standard_normal((rows, cols + 3)) * 100, half)
    d = rt.from_numpy(dst)
    n = max(1, cols - 1)
    ops.copy_columns(rt.from_numpy(src), d, src_off=cols - n, dst_off=2, n=n, accumulate=True)
    want = dst.astype(np.float32)
    want[:, 2:2 + n] += src[:, cols - n:].astype(np.float32)
    np.testing.assert_array_equal(_bits(d.numpy()), _bits(_rounded(want, half)))


def test_layout_operand_dtypes_are_checked(half):
    a = rt.from_numpy(np.zeros((2, 3), NUMPY[half]))
    with pytest.raises(TypeError, match=r"parts\[1\] is f32"):
        ops.concat([a, rt.zeros((2, 3))])
    with pytest.raises(TypeError, match="dst is f32"):
        ops.copy_columns(a, rt.zeros((2, 3)), src_off=0, dst_off=0, n=3)


# -- chunked cross-entropy's gradient gather ---------------------------------------------------------

def test_row_chunks_gather_keeps_the_half_dtype(half):
    """_RowChunks.backward writes the chunks' half gradients into a tensor of x's dtype (an f32 one would
    not even have the bytes of the chunks)."""
    from types import SimpleNamespace

    from autograd.chunked_loss import _RowChunks, row_bounds

    rows, cols = 150, 6
    bounds = row_bounds(rows, 64)
    x = _rounded(np.random.default_rng(0).standard_normal((rows, cols)), half)
    ctx = SimpleNamespace(shape=(rows, cols), dtype=NUMPY[half], bounds=bounds)
    grads = [rt.from_numpy(x[r0:r1]) for r0, r1 in bounds]
    grads[1] = None  # a chunk without gradient: zeros
    full = _RowChunks.backward(ctx, *grads)
    want = x.copy()
    want[bounds[1][0]:bounds[1][1]] = 0
    assert full.dtype == NUMPY[half]
    np.testing.assert_array_equal(_bits(full.numpy()), _bits(want))
