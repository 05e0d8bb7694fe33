"""How close a kernel's result must be to its float64 reference, counted in roundings of the result's dtype: the
`Tolerance` every op spec declares per output and gradient (helios.kernels.contract.spec)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from helios.kernels.contract.dtypes import NUMPY, ROUNDING


@dataclass(frozen=True)
class Tolerance:
    """How close a kernel result must be to the float64 reference of the same inputs (rounded to their dtype
    first, so only the kernel's own rounding is measured), in roundings (dtypes.ROUNDING: half an ulp, relative).

    Every dtype computes in f32 and rounds each result once to its storage dtype, so a result in dtype d may be
    off by `rel` f32 roundings of |reference|, plus `abs` f32 roundings of the result's scale (1; with `floor`,
    max |reference|, never below floor, for results whose scale grows with the shape: sums over rows,
    gradients), plus one rounding of d (nothing more for f32), plus half of d's smallest subnormal (fp16
    underflows at 6e-8). The bound is per element. Kernels that round intermediates to d itself (matrix units
    take their operands in d: attention's P and dS) may be off by `io` roundings of d of the scale more."""

    rel: float = 0.0
    abs: float = 0.0
    floor: float | None = None
    io: float = 0.0

    def bound(self, want: np.ndarray, dtype: str = "f32") -> np.ndarray:
        """The largest allowed |got - want| per element, for a result stored in `dtype`."""
        size = np.abs(want)
        scale = 1.0 if self.floor is None else max(self.floor, float(np.nanmax(size[np.isfinite(size)], initial=0)))
        f32 = ROUNDING["f32"] * (self.rel * size + self.abs * scale)
        d = ROUNDING[dtype]
        subnormal = float(ml_dtypes.finfo(NUMPY[dtype]).smallest_subnormal)
        return f32 * (1 + d) + d * (size + self.io * scale) + subnormal / 2

    def check(self, got: np.ndarray, want: np.ndarray, dtype: str = "f32", what: str = "") -> None:
        """Raise AssertionError naming the worst element, in roundings of `dtype`, if any is out of bounds (equal
        infinities and NaN where the reference has NaN pass)."""
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
        with np.errstate(invalid="ignore"):  # infinite references (an overflowed norm) pass by equality alone
            err = np.abs(got - want)
            ok = (got == want) | (np.isnan(got) & np.isnan(want)) | (err <= self.bound(want, dtype))
        if not ok.all():
            excess = np.where(ok, 0.0, np.nan_to_num(err, nan=np.inf) / self.bound(want, dtype))
            i = tuple(int(k) for k in np.unravel_index(int(np.argmax(excess)), got.shape))
            raise AssertionError(f"{what} [{dtype}]: {int((~ok).sum())} of {ok.size} elements out of bounds; "
                                 f"worst at {i}: got {float(got[i])!r}, want {float(want[i])!r}, off by "
                                 f"{err[i] / ROUNDING[dtype] / max(abs(want[i]), 1e-30):.3g} roundings of {dtype}")


# Pointwise results: y within 160 f32 roundings (~1e-5; lavapipe's exp/log are polynomials a few ulp off, our tanh
# ~2 ulp) plus 16 absolute at the zeros of gelu/silu/log; dx (two or three approximations composed, |dy| ~ 3)
# within 320 plus 160 absolute.
POINTWISE_TOLERANCE = {"y": Tolerance(rel=160, abs=16), "dx": Tolerance(rel=320, abs=160)}
