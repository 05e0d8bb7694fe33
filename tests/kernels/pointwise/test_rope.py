"""RoPE beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs rope and rope_backward against the
float64 reference in every dtype and forced width, GQA and a 2048-position table included): rotation in place
(`out=qkv`, the "*_inplace" variants, which leave the v columns untouched) in every dtype and width, the
convention shared with the trainer's torch backend, and the errors for a bad layout.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract.dtypes import DTYPES, NUMPY
from helios.kernels.contract.spec import spec_of
from helios.kernels.pointwise import rope as R
from tests.conftest import dtype_params

SPEC = spec_of("rope")


@pytest.mark.parametrize("width", R.WIDTHS)
@pytest.mark.parametrize("dtype", dtype_params(*DTYPES))
def test_in_place(dtype, width, force):
    """Every spec case, forward and backward, rotated in place: the result is the reference's (the spec's
    tolerance), the v columns keep their bits, and the output is the input tensor."""
    force("rope", width)
    rng = np.random.default_rng(0)
    for shape, scalars in zip(SPEC.shapes, SPEC.scalar_cases(), strict=True):
        (x,) = SPEC.inputs(rng, shape, **scalars)
        x = x.astype(NUMPY[dtype])
        v0 = (scalars["n_head"] + scalars["n_kv_head"]) * scalars["head_dim"]
        for op, ref in ((R.rope, R.reference), (R.rope_backward, R.reference_backward)):
            xt = rt.from_numpy(x)
            assert op(xt, **scalars, out=xt) is xt
            got = xt.numpy()
            SPEC.tolerance["y"].check(got, ref(x.astype(np.float64), **scalars), dtype, f"{op.__name__} {shape}")
            np.testing.assert_array_equal(got[..., v0:], x[..., v0:])


def test_matches_trainer_torch_backend():
    """The torch reference backend uses the same (half-split) convention and table."""
    import torch

    from trainer.backends import torch_model as tm
    b, t, h, hkv, d = 2, 6, 2, 1, 8
    x = np.random.default_rng(5).standard_normal((b, t, (h + 2 * hkv) * d)).astype(np.float32)
    cos, sin = (torch.tensor(a, dtype=torch.float32) for a in R.rope_table(t, d, 10000.0))
    q = torch.tensor(x[..., : h * d]).reshape(b, t, h, d).transpose(1, 2)  # [B, H, T, D]
    expected = tm.apply_rope(q, cos, sin).transpose(1, 2).reshape(b, t, h * d).numpy()
    got = R.rope(rt.from_numpy(x), h, hkv, d, 10000.0).numpy()[..., : h * d]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_bad_layout_is_a_clear_error():
    x = rt.from_numpy(np.ones((1, 2, 12), np.float32))
    with pytest.raises(ValueError, match="even head_dim"):
        R.rope(x, 1, 1, 3, 500.0)
    with pytest.raises(ValueError, match=r"expected \(H \+ 2\*Hkv\) \* D = 16"):
        R.rope(x, 2, 1, 4, 500.0)
