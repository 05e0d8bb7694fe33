"""The mixed-precision benchmarks run and report both dtypes side by side (not timed: figures live in
docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse

import pytest

from helios.bench import bf16

# Tensors each op reads or writes in full (the row ops' per-row weights and statistics are left out, as the bench
# leaves them out): counted here from the ops' signatures, not taken from the kernels' byte counts the bench uses.
OPERANDS = {"add": 3, "scale": 2, "add_inplace": 3, "gelu": 2, "gelu_backward": 3, "swiglu": 3, "dropout": 2,
            "residual_dropout_add": 3, "layernorm": 2, "softmax": 2, "softmax_backward": 3, "cross_entropy": 2}
ROW_OPS = {"layernorm", "softmax", "softmax_backward", "cross_entropy"}


@pytest.mark.needs(dtype="bf16")
def test_bf16_bench_times_every_kernel_in_both_dtypes():
    records = bf16.run(argparse.Namespace(quick=True, repeats=1))
    names = [r["kernel"] for r in records]
    assert set(names) == set(OPERANDS)
    assert len(names) == len(set(names))
    n = bf16.QUICK[0]
    for r in records:
        assert r["variant"] == "bf16" and r["ref"] == "fp32" and r["shape"] == f"n={n}"
        assert r["ms"] > 0 and r["ref_ms"] > 0 and r["ratio"] > 0
        elements = (n // 768) * 768 if r["kernel"] in ROW_OPS else n  # rows of 768, as GPT-2 small's n_embd
        moved = OPERANDS[r["kernel"]] * elements
        # GB/s times ms gives back the bytes each side moved: 2 per element in bf16, 4 in fp32.
        assert r["gbps"] * r["ms"] * 1e6 == pytest.approx(2 * moved, rel=1e-9), r["kernel"]
        assert r["ref_gbps"] * r["ref_ms"] * 1e6 == pytest.approx(4 * moved, rel=1e-9), r["kernel"]
