"""The norm backwards' column sums in the row kernel (the "norm_sums" family's "last_worker": the last worker to
finish sums the partial dw and db rows, one dispatch instead of two) against sum_rows' own dispatch ("separate"):
bit for bit, at every forced subgroup-layout row variant in f32 (scalar and 4-wide rows, register tiers and
streaming) and one per storage width in the half dtypes, over rows 1, 7, 33, 513 x cols 7, 33, 128, 516, into fresh
tensors and added into sinks holding values, with the default workers and with 3 (rows shared unevenly). Also: the
dispatch count, the counter back at zero after each launch, and the rule (GPUs sum separately, even forced).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY
from helios.kernels.lib.row_workers import worker_counter
from helios.kernels.rows import norms as N
from tests.kernels.rows.row_variants import force_variant, norm_backward_cases

F = rt.from_numpy
SHAPES = [(r, c) for r in (1, 7, 33, 513) for c in (7, 33, 128, 516)]


def _data(rng, rows: int, cols: int, dtype: str):
    x = (rng.standard_normal((rows, cols)) * 3 + 8).astype(NUMPY[dtype])
    w = (rng.standard_normal(cols) * 0.5 + 1).astype(NUMPY[dtype])
    b = rng.standard_normal(cols).astype(NUMPY[dtype])
    dy = rng.standard_normal((rows, cols)).astype(NUMPY[dtype])
    return x, w, b, dy


def _backwards(x, w, b, dy, sinks: np.ndarray | None) -> tuple[list[np.ndarray], int]:
    """(dx, dw, db of layernorm with and without a bias, dx and dw of rmsnorm; dispatches) under the forced choice,
    into fresh tensors (sinks None) or added into copies of `sinks`."""
    before = rt.counters()["dispatches"]
    out = []
    acc = sinks is not None
    for bias in (b, None):
        _, mean, rstd = N.layernorm(x, w, bias)
        dw, db = (F(sinks[0]), F(sinks[1])) if acc else (None, None)
        out += N.layernorm_backward(x, w, mean, rstd, dy, dw_out=dw, db_out=db if bias is not None else None,
                                    accumulate=acc, has_bias=bias is not None)
    _, rstd = N.rmsnorm(x, w)
    out += N.rmsnorm_backward(x, w, rstd, dy, dw_out=F(sinks[0]) if acc else None, accumulate=acc)
    got = [t.numpy().copy() for t in out if t is not None]
    return got, rt.counters()["dispatches"] - before


@pytest.mark.parametrize("choice,dtype", norm_backward_cases(layouts=("sg",)))  # "wg" always sums separately
def test_sums_in_the_row_kernel_are_bit_identical(choice, dtype, force):
    from helios.device import get_device

    if not get_device().info.cpu_profile:
        pytest.skip("the rule sums in the row kernel on CPU devices only")
    force_variant(force, *choice, runs=(N.LAYERNORM_BACKWARD, N.RMSNORM_BACKWARD))
    rng = np.random.default_rng(5)
    for rows, cols in SHAPES:
        data = [F(a) for a in _data(rng, rows, cols, dtype)]
        sinks = rng.standard_normal((2, cols)).astype(np.float32)
        for workers in (None, 3):
            force("norm_workers", workers)
            for into in (None, sinks):
                results = {}
                for how in N.NORM_SUMS:
                    force("norm_sums", how)
                    results[how] = _backwards(*data, into)
                (want, separate), (got, fused) = results["separate"], results["last_worker"]
                what = f"{rows}x{cols}, workers {workers or 'default'}, {'added' if into is not None else 'fresh'}"
                assert fused == separate - 3, f"{what}: {fused} dispatches, expected {separate - 3}"
                for k, (a, e) in enumerate(zip(got, want, strict=True)):
                    bits = np.uint16 if a.itemsize == 2 else np.uint32
                    bad = np.flatnonzero(a.view(bits).reshape(-1) != e.view(bits).reshape(-1))
                    assert not bad.size, f"{what}: output {k} differs from sum_rows' at {bad.size} elements"
                assert int(worker_counter().numpy()[0]) == 0, f"{what}: the worker counter was not put back"


def test_last_worker_only_on_cpu_devices():
    """A CPU device (coherent memory) sums in the row kernel; a GPU in sum_rows' dispatch, even when forced."""
    from helios.device import get_device

    info = get_device().info
    cpu, gpu = dataclasses.replace(info, profile="cpu"), dataclasses.replace(info, profile="gpu")
    assert selection.choose("norm_sums", (64, 128), info=cpu) == "last_worker"
    assert selection.choose("norm_sums", (256, 128), info=gpu) == "separate"
    with selection.forcing("norm_sums", "last_worker"):
        assert selection.choose("norm_sums", (256, 128), info=gpu) == "separate"
    with selection.forcing("norm_sums", "separate"):
        assert selection.choose("norm_sums", (64, 128), info=cpu) == "separate"
    with pytest.raises(ValueError, match="norm_sums"):
        selection.force("norm_sums", "atomic")
