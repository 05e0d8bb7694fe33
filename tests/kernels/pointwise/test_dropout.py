"""Dropout's RNG and statistics, beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs dropout
and residual_dropout_add forward and backward in every dtype and access against the numpy reference, whose mask
is the device's bit for bit): the device hash equals its numpy twin bit for bit, masks are deterministic in
(seed, offset), the keep rate is 1 - p, draws for different offsets, seeds and streams are uncorrelated, the
scaling is torch's, and a captured step's device counter adds to the offset.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios.kernels.lib import rng as R
from helios.kernels.pointwise import dropout as D


@pytest.mark.parametrize("kernel,variant", [(R.RAND, v) for v in R.RAND.variants],
                         ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


@pytest.mark.parametrize("seed,offset,stream", [(0, 0, 0), (1234, 5, 0), (2**40 + 3, 2**33 + 1, 77), (7, 1, 2**31)])
def test_device_uniform_matches_numpy_bit_exactly(seed, offset, stream, access):
    for n in (1, 7, 4097):
        got = R.rand(n, seed, offset, stream).numpy()
        np.testing.assert_array_equal(got, R.uniform_reference(seed, offset, np.arange(n), stream))


def test_seed_folding():
    assert R.seed_words(5, 3) == (5, 3)
    assert R.seed_words(2**32 + 5, 2**32 + 3) == (4, 3)  # high word xor-folded into the low one
    assert R.seed_words(2**64 - 1, 0)[0] == 0


def test_uniform_statistics():
    n = 1 << 18
    u = R.uniform_reference(42, 0, np.arange(n))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    hist = np.bincount((u * 64).astype(int), minlength=64)
    chi2 = ((hist - n / 64) ** 2 / (n / 64)).sum()
    assert chi2 < 120  # 63 degrees of freedom: p < 1e-5 to fail by chance
    for other in (R.uniform_reference(42, 1, np.arange(n)), R.uniform_reference(43, 0, np.arange(n)),
                  R.uniform_reference(42, 0, np.arange(n), stream=1), u[1:]):
        assert abs(np.corrcoef(u[: other.size], other)[0, 1]) < 0.01


def test_deterministic_and_offset_dependent():
    x = rt.from_numpy(np.ones(10_000, np.float32))
    a = D.dropout(x, 0.3, 5, 0).numpy()
    np.testing.assert_array_equal(a, D.dropout(x, 0.3, 5, 0).numpy())
    b = D.dropout(x, 0.3, 5, 1).numpy()
    c = D.dropout(x, 0.3, 6, 0).numpy()
    assert (a != b).mean() > 0.3 and (a != c).mean() > 0.3  # independent masks differ in ~42% of places
    keep = (a != 0).mean()
    assert abs(keep - 0.7) < 0.02
    np.testing.assert_allclose(a[a != 0], np.float32(1 / 0.7))


def test_expected_value_matches_torch_semantics():
    """Like torch.nn.functional.dropout: zeros or x / (1 - p), mean preserved."""
    x = np.random.default_rng(2).uniform(0.5, 1.5, 50_000).astype(np.float32)  # positive: the mean is ~1, not ~0
    p = 0.2
    y = D.dropout(rt.from_numpy(x), p, 11, 0).numpy()
    # mean(y) - mean(x) has standard deviation sqrt(mean(x^2) p / (1 - p) / n) ~ 0.0023: 0.012 is over 5 of them.
    assert abs(y.mean() - x.mean()) < 0.012
    t = torch.nn.functional.dropout(torch.from_numpy(x), p, training=True).numpy()
    assert set(np.unique(np.round(y[y != 0] / x[y != 0], 5))) == set(np.unique(np.round(t[t != 0] / x[t != 0], 5)))
    assert abs((y != 0).mean() - (t != 0).mean()) < 0.01


def test_bad_probability():
    with pytest.raises(ValueError, match="probability"):
        D.dropout(rt.zeros(4), 1.5, 0, 0)


@pytest.mark.parametrize("n", [1, 7, 33, 513])
def test_counter_buffer_adds_to_the_offset(n, access):
    """A captured step reads its per-pass RNG base from a device counter: offset k with counter c draws the
    masks of offset k + c (mod 2**32), for dropout and the fused residual dropout-add."""
    from helios.kernels.pointwise import fused as F

    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    tx = rt.from_numpy(x)
    for base, k in ((5 << 16, 3), (0xFFFF0000, 0x20000)):
        counter = rt.from_numpy(np.array([base], np.uint32))
        want = D.dropout(tx, 0.3, 11, (base + k) & 0xFFFFFFFF).numpy()
        np.testing.assert_array_equal(D.dropout(tx, 0.3, 11, k, counter).numpy(), want)
        np.testing.assert_array_equal(D.dropout_backward(tx, 0.3, 11, k, counter).numpy(), want)
        np.testing.assert_array_equal(F.residual_dropout_add(tx, tx, 0.3, 11, k, counter).numpy(),
                                      F.residual_dropout_add(tx, tx, 0.3, 11, (base + k) & 0xFFFFFFFF).numpy())


def test_counter_must_be_one_u32_word():
    x = rt.from_numpy(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="uint32 tensor of one element"):
        D.dropout(x, 0.5, 1, 0, rt.from_numpy(np.ones(1, np.float32)))
