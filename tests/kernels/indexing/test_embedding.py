"""Embedding lookup and its scatter-add backward, what its op spec's derived tests (tests/kernels/test_opspecs.py:
every dtype and scatter at awkward shapes, with and without positions, into sinks, the reference VJP) leave out:
out-of-range ids, the default scatter, bit-reproducible sorted and scan sums, torch as an independent oracle, grids
past 65535 workgroups, the captured step's fixed-capacity plan, and spirv-val of every variant.

Tolerances: the lookup is a copy (exact); the backward sums at most a few dozen rows per table entry
(~1e-6 absolute on unit-scale values).
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.indexing import embedding as E

KERNELS = [E.EMBEDDING, E.EMBEDDING_BACKWARD_ATOMIC, E.EMBEDDING_BACKWARD_SCAN, E.EMBEDDING_BACKWARD_SORTED,
           E.EMBEDDING_POS_BACKWARD]
@pytest.mark.parametrize("kernel,variant", [(k, v) for k in KERNELS for v in k.variants])
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _data(b, t, v, d, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, v, size=(b, t)).astype(np.int32)
    table = rng.standard_normal((v, d)).astype(np.float32)
    pos = rng.standard_normal((t + 3, d)).astype(np.float32)
    dy = rng.standard_normal((b * t, d)).astype(np.float32)
    return ids, table, pos, dy


def test_lookup_out_of_range_ids_give_zero_rows():
    ids = np.array([[0, -1, 5, 2]], dtype=np.int32)
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    out = E.embedding(rt.from_numpy(ids), rt.from_numpy(table)).numpy()
    np.testing.assert_array_equal(out, [table[0], np.zeros(4), np.zeros(4), table[2]])


def test_backward_default_variant_and_skip_invalid_ids():
    ids = np.array([[1, -1, 9, 1]], dtype=np.int32)
    dy = np.ones((4, 3), dtype=np.float32)
    tg = rt.zeros((4, 3))
    table_grad, pos_grad = E.embedding_backward(rt.from_numpy(ids), tg, None, rt.from_numpy(dy), tg)
    assert table_grad is tg and pos_grad is None
    expected = np.zeros((4, 3), dtype=np.float32)
    expected[1] = 2.0
    np.testing.assert_array_equal(tg.numpy(), expected)


def test_sorted_is_bit_reproducible_and_skips_invalid_ids():
    ids, _, _, dy = _data(8, 64, 4, 16, seed=5)  # few rows, many repeats: where atomics reorder sums
    ids[0, :3] = (-1, 4, 99)  # out of range: dropped, as the other variants drop them
    results = set()
    for _ in range(5):
        tg = rt.zeros((4, 16))
        E.embedding_backward(rt.from_numpy(ids), tg, None, rt.from_numpy(dy), tg, plan=E.sorted_segments(ids, 4))
        results.add(tg.numpy().tobytes())
    assert len(results) == 1
    expected, _ = E.reference_backward(ids.astype(np.int64), dy.astype(np.float64), 4, 64)
    # ~128 float32 terms per row: absolute rounding of the sum is ~1e-5 where terms cancel
    np.testing.assert_allclose(np.frombuffer(results.pop(), np.float32).reshape(4, 16), expected, rtol=1e-5,
                               atol=2e-5)


def test_scan_is_deterministic(force):
    ids, _, _, dy = _data(4, 33, 9, 8, seed=3)  # many repeats per row
    results = []
    for _ in range(2):
        tg = rt.empty((9, 8))
        force("embedding_backward", "scan")
        E.embedding_backward(rt.from_numpy(ids), tg, None, rt.from_numpy(dy), tg)
        results.append(tg.numpy())
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("shape", [(2, 7, 33, 12), (3, 5, 10, 7)])
def test_against_torch(shape):
    import torch
    ids, table, pos, dy = _data(*shape, seed=4)
    b, t, v, d = shape
    tt = torch.tensor(table, requires_grad=True)
    tp = torch.tensor(pos, requires_grad=True)
    ti = torch.tensor(ids, dtype=torch.long)
    y = torch.nn.functional.embedding(ti, tt) + tp[:t][None]
    y.backward(torch.tensor(dy.reshape(b, t, d)))
    out = E.embedding(rt.from_numpy(ids), rt.from_numpy(table), rt.from_numpy(pos))
    np.testing.assert_allclose(out.numpy().reshape(b, t, d), y.detach().numpy(), rtol=1e-6, atol=1e-6)
    tg, pg = rt.empty((v, d)), rt.empty(pos.shape)
    E.embedding_backward(rt.from_numpy(ids), tg, pg, rt.from_numpy(dy), tg, pg)
    np.testing.assert_allclose(tg.numpy(), tt.grad.numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(pg.numpy(), tp.grad.numpy(), rtol=1e-5, atol=2e-6)


def test_grid_past_65535_workgroups():
    """4.2M scalar outputs need more than 65535 workgroups of 64: the 2-D grid path."""
    ids = (np.arange(4097, dtype=np.int32) * 7 % 50).reshape(1, -1)
    table = np.random.default_rng(6).standard_normal((50, 1025)).astype(np.float32)
    out = E.embedding(rt.from_numpy(ids), rt.from_numpy(table))
    np.testing.assert_array_equal(out.numpy(), table[ids[0]])


def fixed_and_exact_plan_gradients(fixed, ids: np.ndarray, dy: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The table gradients of the embedding backward through a captured step's FixedScatterPlan (its arrays
    uploaded for ids) and through the exact sorted plan, from the same dy."""
    for tensor, array in zip(fixed.tensors, fixed.arrays(ids), strict=True):
        tensor.runtime.upload(tensor.storage, 0, array)
    got, want = rt.zeros((vocab, dy.shape[1])), rt.zeros((vocab, dy.shape[1]))
    E.embedding_backward(rt.from_numpy(ids), got, None, rt.from_numpy(dy), got, accumulate=True, plan=fixed.plan)
    E.embedding_backward(rt.from_numpy(ids), want, None, rt.from_numpy(dy), want, accumulate=True,
                         plan=E.sorted_segments(ids, vocab))
    return got.numpy(), want.numpy()


@pytest.mark.parametrize("n_tokens,vocab", [(1, 4), (7, 3), (33, 64), (513, 40)])
def test_fixed_capacity_plan_gives_the_exact_plans_result(n_tokens, vocab):
    """A captured step's plan (FixedScatterPlan: padded to min(tokens, vocab) segments, the padding empty and
    never written) sums each row in the same order as the exact plan: bit-identical gradients."""
    rng = np.random.default_rng(n_tokens)
    ids = rng.integers(-1, vocab + 1, (1, n_tokens)).astype(np.int32)  # a few out of range: dropped
    dy = rng.standard_normal((n_tokens, 12)).astype(np.float32)
    fixed = E.FixedScatterPlan(n_tokens, vocab)
    got, want = fixed_and_exact_plan_gradients(fixed, ids, dy, vocab)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="holds"):
        fixed.arrays(ids[:, :0] if n_tokens > 1 else np.zeros((1, 2), np.int32))
