"""Softmax beyond its op spec's derived tests (tests/kernels/test_opspecs.py: every layout and width at awkward
shapes, finite differences, spirv-val): the big register tiers, the variant choice, many long rows, masked and
huge logits (PyTorch: tests/kernels/test_torch_parity.py).

Tolerance: the spec's, 2e-6 absolute on probabilities (each is exp of an f32 difference over an f32 sum) and
1e-5 relative to max |dx| for the backward.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract import selection
from helios.kernels.lib import row_workers as RW
from helios.kernels.rows import softmax as S
from tests.kernels.rows.row_variants import force_variant


def _data(rows, cols, seed=0):
    rng = np.random.default_rng(seed + rows * 10007 + cols)
    x = (rng.standard_normal((rows, cols)) * 4 + 30).astype(np.float32)  # large offset: needs the max shift
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    return x, dy


@pytest.mark.parametrize("cache,cols", [(16, 512), (32, 1024), (32, 1023)])
def test_large_register_tiers(cache, cols, force):
    """The big cached tiers (slow to compile on lavapipe, so one shape each)."""
    force_variant(force, "sg", "u64x2", cache, runs=(S.SOFTMAX, S.SOFTMAX_BACKWARD))
    x, dy = _data(9, cols)
    y = S.softmax(rt.from_numpy(x))
    want = S.reference(x.astype(np.float64))
    np.testing.assert_allclose(y.numpy(), want, atol=2e-6)
    dx = S.softmax_backward(y, rt.from_numpy(dy)).numpy()
    want_dx = S.reference_backward(want, dy.astype(np.float64))
    np.testing.assert_allclose(dx, want_dx, atol=1e-5 * np.abs(want_dx).max())


def test_variant_choice():
    """Smallest register tier the row fits on CPUs; on GPUs a workgroup per long row."""
    def choose(rows, cols, **info):
        return selection.choose("rows", (rows, cols, True), info=SimpleNamespace(int64=True, **info))

    cpu = {"cpu_profile": True, "subgroup_size": 8, "min_subgroup_size": 8}
    assert choose(1024, 256, **cpu) == "sg_u64x2_reg8"
    assert choose(1024, 33, **cpu) == "sg_scalar_reg8"
    assert choose(3, 1024, **cpu) == "sg_u64x2_reg32"
    assert choose(3, 4097, **cpu) == "sg_scalar"
    assert choose(3, 4096, **cpu) == "sg_u64x2"
    gpu = {"cpu_profile": False, "subgroup_size": 32, "min_subgroup_size": 32}
    assert choose(3, 256, **gpu) == "sg_vec4_reg4"
    assert choose(3, 4096, **gpu) == "wg_vec4_reg4"
    assert choose(3, 8192, **gpu) == "wg_vec4"
    assert choose(3, 999, **gpu) == "wg_scalar_reg4"
    with pytest.raises(ValueError, match="unknown row kernel choice"):
        selection.force("rows", RW.RowChoice(width="vec8"))


@pytest.mark.subgroup("softmax")
def test_long_rows_many_rows():
    """513 rows of 4097 (odd row length: scalar variant) and a 3-D input."""
    x, dy = _data(513, 4097)
    np.testing.assert_allclose(S.softmax(rt.from_numpy(x)).numpy(), S.reference(x.astype(np.float64)), atol=2e-6)
    x3 = x[:66, :36].reshape(6, 11, 36)
    np.testing.assert_allclose(S.softmax(rt.from_numpy(x3)).numpy(), S.reference(x3.astype(np.float64)), atol=2e-6)


def test_extreme_values():
    """-inf entries (masks) get probability 0; huge logits do not overflow."""
    x = np.array([[0.0, -np.inf, 1.0, -np.inf, 2.0], [1e30, 1e30, -1e30, 0.0, 3.0]], np.float32)
    got = S.softmax(rt.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, S.reference(x.astype(np.float64)), atol=1e-7)


