"""ops.matmul_pair: a Linear's input gradient (nn, here with GELU's derivative too) and its weight gradient (tn, added
into a held sink with its bias sums) in one dispatch (matmul/pair.py) where both are plain launches of one f32
register tiling, else as two. Either way each result is bit for bit what its own matmul gives.

Shapes (tokens M, outputs N, inputs K; dX = dY [M, N] @ W [N, K], dW = dY^T @ X [M, K]): one of everything, a K % 4
tail and N, K off every block (7, 33, 5: scalar loads, no pair), and 4-wide ones past one workgroup (36, 12, 132;
256, 128, 384, the default config's attention projection pair is 256, 128, 128).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract import selection
from helios.kernels.matmul import pair as P
from helios.kernels.matmul.reg import REG_TILINGS
from tests.conftest import needs_kernel

SHAPES = [(1, 4, 4), (7, 33, 5), (36, 12, 132), (256, 128, 384), (33, 8, 4)]  # M, N, K
_SUBGROUP = ("reg8x8", "reg12x8a", "reg32x8ak")  # the matmul rule's subgroup cases: sharing lanes' broadcasts


def _cases() -> list:
    return [pytest.param(t, marks=[pytest.mark.subgroup("matmul_pair")] if t in _SUBGROUP else [], id=t)
            for t in REG_TILINGS]


def _products(M: int, N: int, K: int, seed: int):
    """(first, second, sink values, bias-sum values): the two products' matmul arguments, whose sink and bias sums
    are fresh copies of held values on each call."""
    rng = np.random.default_rng(seed)
    dy, w, x = (rng.standard_normal(s).astype(np.float32) for s in ((M, N), (N, K), (M, K)))
    pre = rng.standard_normal((M, K)).astype(np.float32)
    held, sums = rng.standard_normal((N, K)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    tdy, tw, tx, tpre = (rt.from_numpy(a) for a in (dy, w, x, pre))

    def args():
        first = {"a": tdy, "b": tw, "gelu_grad": tpre}
        second = {"a": tdy, "b": tx, "trans_a": True, "out": rt.from_numpy(held), "beta": 1.0,
                  "a_sums": rt.from_numpy(sums), "a_sums_accumulate": True}
        return first, second

    return args


def _bits(t) -> np.ndarray:
    return t.numpy().view(np.uint32)


@pytest.mark.parametrize("tiling", _cases())
def test_pair_is_bit_identical_to_its_two_products(tiling, force):
    needs_kernel(P.MATMUL_PAIR, P.variant_name("nn", "tn", tiling))  # its products' tilings, device addresses and all
    force("matmul", tiling)
    for M, N, K in SHAPES:
        args = _products(M, N, K, M * 100 + N + K)
        f1, s1 = args()
        before = rt.counters()["dispatches"]
        want = [_bits(t) for t in (ops.matmul(**f1), ops.matmul(**s1), s1["a_sums"])]
        separate = rt.counters()["dispatches"] - before
        for how in P.PAIR_CHOICES:
            force("matmul_pair", how)
            f2, s2 = args()
            before = rt.counters()["dispatches"]
            got = ops.matmul_pair(f2, s2)
            n = rt.counters()["dispatches"] - before
            what = f"{tiling} {how} M={M} N={N} K={K}"
            for k, (g, e) in enumerate(zip([*got, s2["a_sums"]], want, strict=True)):
                assert np.array_equal(_bits(g), e), f"{what}: result {k} differs from its own matmul's"
            paired = how == "paired" and _would_pair(f2, s2)
            assert n == separate - paired, f"{what}: {n} dispatches, expected {separate - paired}"


def _would_pair(first: dict, second: dict) -> bool:
    """Whether the pair runs in one dispatch here: both plain launches of one f32 vec4 register tiling."""
    deferred: list = []
    ops.matmul(**first, defer=deferred)
    ops.matmul(**second, defer=deferred)
    name = P._pairable(*deferred) if len(deferred) == 2 else None
    return name is not None and selection.choose("matmul_pair", (name,), "f32") == "paired"


def test_the_rule_pairs_on_cpu_devices_where_the_pair_fits():
    """CPU devices pair (a dispatch's fixed cost dominates there); GPUs run two dispatches, even when forced only
    where the pair does not fit; a device binding fewer buffers than the pair's 13 never pairs."""
    from helios.device import get_device

    info = get_device().info
    name = P.variant_name("nn", "tn", "reg8x8")
    cpu, gpu = dataclasses.replace(info, profile="cpu"), dataclasses.replace(info, profile="gpu")
    small = dataclasses.replace(cpu, max_per_stage_storage_buffers=8)
    assert selection.choose("matmul_pair", (name,), info=gpu) == "separate"
    if P.contract_fits(name, cpu):
        assert selection.choose("matmul_pair", (name,), info=cpu) == "paired"
        with selection.forcing("matmul_pair", "separate"):
            assert selection.choose("matmul_pair", (name,), info=cpu) == "separate"
    with selection.forcing("matmul_pair", "paired"):
        assert selection.choose("matmul_pair", (name,), info=small) == "separate"
    with pytest.raises(ValueError, match="matmul_pair"):
        selection.force("matmul_pair", "fused")
