"""The mixed-precision benchmarks run and report both dtypes side by side (not timed: figures live in
docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse

import pytest

from helios.bench import bf16


@pytest.mark.needs(dtype="bf16")
def test_bf16_bench_times_every_kernel_in_both_dtypes():
    records = bf16.run(argparse.Namespace(quick=True, repeats=1))
    names = [r["kernel"] for r in records]
    assert {"add", "gelu", "residual_dropout_add", "layernorm", "softmax", "cross_entropy"} <= set(names)
    assert len(names) == len(set(names))
    for r in records:
        assert r["variant"] == "bf16" and r["ref"] == "fp32"
        assert r["ms"] > 0 and r["ref_ms"] > 0 and r["gbps"] > 0
        assert abs(r["ratio"] - r["ref_ms"] / r["ms"]) < 1e-12
