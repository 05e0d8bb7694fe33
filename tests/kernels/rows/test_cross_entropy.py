"""Fused softmax cross-entropy, what its op spec's derived tests (tests/kernels/test_opspecs.py: every dtype, row
layout and awkward shape, ignore_index and out-of-range targets, the reference VJP) leave out: torch as an
independent oracle with a grad_scale, logits far from 0, every row ignored, zero host reads until the caller
asks, more rows than one grid dimension, and spirv-val of the count and mean kernels.

Tolerances: the loss is a mean of logsumexps over rows of up to 50257 f32 values (~1e-5 relative);
dlogits are softmax probabilities scaled by grad_scale / n_valid (~1e-6 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.rows import cross_entropy as C

KERNELS = [C.CROSS_ENTROPY_COUNT, C.CROSS_ENTROPY_MEAN]  # the rows kernel's variants: test_opspecs.py


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in KERNELS for v in k.variants])
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _case(rows, vocab, seed=0, scale=3.0, ignore=-1):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    targets = rng.integers(0, vocab, size=rows).astype(np.int32)
    if rows > 2:
        targets[1] = ignore
    return logits, targets


@pytest.mark.parametrize("rows,vocab", [(7, 517), (33, 12), (4, 4096)])
def test_against_torch(rows, vocab):
    import torch
    logits, targets = _case(rows, vocab, seed=1, ignore=-100)
    tl = torch.tensor(logits, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tl, torch.tensor(targets, dtype=torch.long), ignore_index=-100)
    (tloss * 2.0).backward()
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets), ignore_index=-100,
                                    grad_scale=2.0)
    np.testing.assert_allclose(loss.numpy()[0], tloss.item(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dlogits.numpy(), tl.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_three_dimensional_logits_and_large_offsets():
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((2, 5, 64)) * 10 + 1e4).astype(np.float32)  # softmax must subtract the max
    targets = rng.integers(0, 64, size=(2, 5)).astype(np.int32)
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets))
    ref_loss, ref_d = C.reference(logits.astype(np.float64), targets)
    np.testing.assert_allclose(loss.numpy()[0], ref_loss, rtol=1e-4)
    np.testing.assert_allclose(dlogits.numpy(), ref_d, rtol=1e-4, atol=1e-6)


def test_all_rows_ignored_gives_zero():
    logits, _ = _case(4, 9)
    targets = np.full(4, -1, dtype=np.int32)
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets))
    assert loss.numpy()[0] == 0.0
    assert not np.any(dlogits.numpy())


def test_no_host_reads_until_numpy():
    logits, targets = _case(33, 517, seed=4)
    lt, tt = rt.from_numpy(logits), rt.from_numpy(targets)
    rt.sync()
    before = rt.counters()
    loss, dlogits = C.cross_entropy(lt, tt)
    after = rt.counters()
    assert after["host_waits"] == before["host_waits"]
    assert after["downloads"] == before["downloads"]
    assert after["dispatches"] - before["dispatches"] == 3
    ref_loss, _ = C.reference(logits.astype(np.float64), targets)
    np.testing.assert_allclose(loss.numpy()[0], ref_loss, rtol=1e-5)  # the first host read
    assert rt.counters()["downloads"] == before["downloads"] + 1


def test_more_rows_than_one_grid_dimension():
    """70000 rows need a 2-D grid of row workgroups."""
    logits, targets = _case(70_000, 3, seed=7)
    loss, dlogits = C.cross_entropy(rt.from_numpy(logits), rt.from_numpy(targets))
    ref_loss, ref_d = C.reference(logits.astype(np.float64), targets)
    np.testing.assert_allclose(loss.numpy()[0], ref_loss, rtol=1e-5)
    np.testing.assert_allclose(dlogits.numpy(), ref_d, rtol=1e-4, atol=1e-8)
