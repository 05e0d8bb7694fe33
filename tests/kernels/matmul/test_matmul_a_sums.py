"""matmul's a_sums: the column sums of a tn product's a ([K, M]), a Linear's bias gradient beside its weight
gradient dW = dY^T @ X. Where the product's kernel takes them (a register tiling's tn kernel, reg._ASums, where
sum_rows would sum in one pass) they cost no dispatch; elsewhere sum_rows runs. Either way they are sum_rows's
bits, stored or added into what a_sums held, and C is untouched by them.

Shapes: K of 1, 7, 33, 256 and 513 (a K % 4 tail), M of 1, 7 and 33 (scalar loads, partial blocks, lanes whose load
slots wrap round) and 36, 384 (vec4 units), N of 1, 5 and 65 (one column of workgroups, several); a K-chunked product
(sums by sum_rows); a block past sum_rows's one pass (its two-stage order, so not fused).
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels import matmul as mm
from helios.kernels.contract.dtypes import HALF_DTYPES, NUMPY
from helios.kernels.matmul.reg import REG_TILINGS
from helios.kernels.rows import reduce
from tests.conftest import dtype_params

SHAPES = [(1, 1, 1), (7, 33, 5), (33, 7, 65), (513, 36, 1), (256, 384, 65), (2 * mm.K_CHUNK + 7, 33, 5)]  # K, M, N


def _bits(t) -> np.ndarray:
    return t.numpy().view(np.uint32)


def _fused(M: int, N: int, K: int, dtype: str) -> bool:
    """Whether the op takes the sums inside the product's one dispatch here (what the test expects to count)."""
    variant = mm.KERNELS["tn"].variant(mm.variant_name("tn", M, N, K, 1, dtype=dtype))
    chunked = mm._chunks_k("tn", variant, False, M, N, K, dtype, False)
    return not chunked and mm._fuses_a_sums(variant, M, K, dtype)


def _dispatches(fn) -> int:
    before = rt.counters()["dispatches"]
    fn()
    return rt.counters()["dispatches"] - before


def _case(K: int, M: int, N: int, dtype: str, accumulate: bool) -> None:
    rng = np.random.default_rng(K * 1000 + M * 10 + N)
    a = rng.standard_normal((K, M)).astype(NUMPY[dtype])
    b = rng.standard_normal((K, N)).astype(NUMPY[dtype])
    a[0, 0] = -0.0  # a lone -0.0 sums to +0.0 from 0, as sum_rows's
    held = rng.standard_normal(M).astype(np.float32)
    ta, tb = rt.from_numpy(a), rt.from_numpy(b)
    fused_sums, plain_sums = rt.from_numpy(held), rt.from_numpy(held)
    c = None

    def fused():
        nonlocal c
        c = ops.matmul(ta, tb, trans_a=True, a_sums=fused_sums, a_sums_accumulate=accumulate)

    n = _dispatches(fused)
    alone = _dispatches(lambda: ops.sum_rows(ta, out=plain_sums, accumulate=accumulate))
    product = _dispatches(lambda: ops.matmul(ta, tb, trans_a=True))
    np.testing.assert_array_equal(_bits(fused_sums), _bits(plain_sums))
    np.testing.assert_array_equal(c.numpy(), ops.matmul(ta, tb, trans_a=True).numpy())
    assert n == (product if _fused(M, N, K, dtype) else product + alone), (n, product, alone)


@pytest.mark.subgroup("matmul_tn")
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "add"])
@pytest.mark.parametrize("K,M,N", SHAPES)
def test_a_sums_are_sum_rows_bits_in_the_product(K, M, N, accumulate):
    """At the tiling the rule picks (on lavapipe reg32x8ak, or reg12x8a under 16 rows)."""
    _case(K, M, N, "f32", accumulate)


@pytest.mark.parametrize("tiling", [t for t in REG_TILINGS if t != "reg32x16"] + ["tiled32"])
def test_a_sums_at_every_tiling(tiling, force, device):
    """Forced register tilings (their _ASums, lanes sharing loads) and a tiled one (sum_rows beside it); reg32x16
    shares reg16x16's code and JITs for ~10 s cold."""
    from helios.kernels.matmul import select as sel

    if not sel.runnable(device.info, tiling):
        pytest.skip(f"{tiling} does not run on this device (matmul.select.runnable)")
    force("matmul", tiling)
    for K, M, N in SHAPES[:5]:
        _case(K, M, N, "f32", True)


@pytest.mark.parametrize("dtype", dtype_params(*HALF_DTYPES))
def test_a_sums_of_half_operands(dtype):
    """dY in bf16/fp16 (mixed precision): loaded exactly as f32 and summed in f32, like sum_rows."""
    for K, M, N in [(33, 7, 65), (256, 384, 65)]:
        _case(K, M, N, dtype, True)


def test_a_sums_past_one_pass_keep_sum_rows_order():
    """Past reduce.ONE_PASS_ELEMENTS sum_rows sums chunks first (another order): the kernel leaves them to it."""
    M = 1024
    K = reduce.ONE_PASS_ELEMENTS // M + 4
    assert not reduce.sums_in_one_pass(K, M, "f32")
    _case(K, M, 5, "f32", False)


def test_a_sums_errors():
    a, b = rt.from_numpy(np.ones((4, 3), np.float32)), rt.from_numpy(np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="trans_a=True"):
        ops.matmul(rt.from_numpy(np.ones((3, 4), np.float32)), b, a_sums=rt.empty((3,)))
    with pytest.raises(ValueError, match="float32 tensor of M = 3"):
        ops.matmul(a, b, trans_a=True, a_sums=rt.empty((4,)))
    with pytest.raises(ValueError, match="float32 tensor of M = 3"):
        ops.matmul(a, b, trans_a=True, a_sums=rt.from_numpy(np.ones(3, np.int32)))
