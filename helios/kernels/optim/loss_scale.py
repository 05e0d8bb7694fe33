"""Dynamic loss scaling for fp16 training, decided on the device (no host read).

fp16 keeps 5 exponent bits: gradients below ~6e-8 flush to zero. The backward therefore starts from
d(loss) = scale instead of 1, every gradient comes out `scale` times larger, and the optimizer divides it
back out. The scale adapts the way torch.cuda.amp.GradScaler's does: halved when the scaled gradients
overflowed (the step is then skipped: the norm is not finite), doubled after `growth_interval` clean steps.

State: a float32 device tensor of 4 values, [scale, clean steps in a row, overflows so far, 1 if the last
step overflowed]. `loss_scale_update` is one invocation that runs between the gradient norm and AdamW:

    true_norm = norm / scale                   (NaN/Inf when the scaled gradients overflowed)
    clip_coef = min(1, max_norm / (true_norm + 1e-6)) / scale    AdamW's g * clip_coef is the unscaled, clipped g
    finite:   clean += 1; clean == growth_interval -> scale = min(2 * scale, max_scale), clean = 0
    overflow: scale = max(scale / 2, min_scale), clean = 0, overflows += 1

AdamW reads true_norm for its skip test, so an overflowed step changes nothing but the scale.
"""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.optim.adamw import CLIP_EPS
from helios.spirv import Kernel, KernelBuilder, Variant, f32, one_workgroup, u32

INITIAL_SCALE = 2.0 ** 15  # fp16's largest power of two is 2^15: a scale that one fp16 value can also hold
GROWTH_INTERVAL = 1000     # clean steps before the scale doubles (torch's GradScaler default is 2000)
MAX_SCALE = 2.0 ** 24
MIN_SCALE = 1.0


def initial_state(scale: float = INITIAL_SCALE) -> np.ndarray:
    return np.array([scale, 0.0, 0.0, 0.0], np.float32)


def reference_update(norm, state: np.ndarray, max_norm: float, growth_interval: int = GROWTH_INTERVAL,
                     max_scale: float = MAX_SCALE, min_scale: float = MIN_SCALE):
    """(true_norm (1,), clip_coef (1,), new state (4,)) for a norm given as a float or (1,) array, computed in the
    state's float dtype (float32 as the kernel; float64 in the op-spec tests)."""
    s = np.array(state, np.result_type(np.asarray(state).dtype, np.float32))  # a copy, float32 or wider
    dt = s.dtype.type
    value, scale = dt(np.ravel(norm)[0]), s[0]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        true = value / scale
        coef = dt(min(dt(1.0), dt(max_norm) / (true + dt(CLIP_EPS)))) / scale
    if math.isfinite(float(value)):
        s[1] += 1
        if s[1] >= growth_interval:
            s[0], s[1] = min(scale * 2, max_scale), 0
        s[3] = 0
    else:
        s[0], s[1], s[2], s[3] = max(scale * dt(0.5), min_scale), 0, s[2] + 1, 1
    return np.array([true]), np.array([coef]), s


def _build(b: KernelBuilder, v: Variant) -> None:
    b.local_size(1)
    norm_buf, state = b.buffer(0, f32, "r"), b.buffer(1, f32, "rw")
    true_out, coef_out = b.buffer(2, f32, "w"), b.buffer(3, f32, "w")
    max_norm, interval = b.push("max_norm", f32), b.push("growth_interval", u32)
    max_scale, min_scale = b.push("max_scale", f32), b.push("min_scale", f32)
    norm, scale, clean = norm_buf[0], state[0], state[1]
    true = norm / scale
    true_out[0] = true
    coef_out[0] = b.min(max_norm / (true + CLIP_EPS), 1.0) / scale
    # NaN/Inf tested on the exponent bits, which no driver fast-math can fold away (as AdamW does).
    overflow = (b.bitcast(norm, u32) & 0x7F800000) == 0x7F800000
    with b.if_(overflow):
        state[0] = b.max(scale * 0.5, min_scale)
        state[1] = 0.0
        state[2] = state[2] + 1.0
        state[3] = 1.0
    with b.else_():
        grown = clean + 1.0 >= b.cast(interval, f32)
        state[0] = b.select(grown, b.min(scale * 2.0, max_scale), scale)
        state[1] = b.select(grown, b.const(0.0), clean + 1.0)
        state[3] = 0.0


LOSS_SCALE_UPDATE = Kernel("loss_scale_update", _build, variants={"scalar": {}}, grid=one_workgroup,  # shape ()
                           flops=lambda: 8, bytes=lambda: 40)
CHOICES = tuple(LOSS_SCALE_UPDATE.variants)  # one invocation: the only form


@selection.rule("loss_scale", choices=CHOICES)
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (): the one-invocation kernel, whatever the device."""
    return "scalar"


def loss_scale_update(norm, state, max_norm: float, growth_interval: int = GROWTH_INTERVAL,
                      max_scale: float = MAX_SCALE, min_scale: float = MIN_SCALE):
    """(true_norm (1,), clip_coef (1,), state) from the norm of the scaled gradients; updates `state` in place
    (see the module docstring). One dispatch, one invocation."""
    import helios.runtime as rt

    if state.dtype != np.float32 or state.numel != 4:
        raise TypeError(f"loss_scale_update: state must be 4 float32 values, got {state.dtype} {state.shape}")
    if growth_interval < 1:
        raise ValueError(f"loss_scale_update: growth_interval must be >= 1, got {growth_interval}")
    true, coef = rt.empty((1,)), rt.empty((1,))
    variant = selection.choose("loss_scale", ())
    rt.launch(LOSS_SCALE_UPDATE, [norm, state, true, coef], grid=LOSS_SCALE_UPDATE.grid_for((), variant),
              variant=variant,
              push={"max_norm": float(max_norm), "growth_interval": int(growth_interval),
                    "max_scale": float(max_scale), "min_scale": float(min_scale)})
    return true, coef, state


__all__ = ["loss_scale_update", "initial_state", "reference_update", "INITIAL_SCALE", "GROWTH_INTERVAL"]


# -- op spec: tests, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) ------------------------------
# Forward-only, writing `state` in place. Each test case is one step: its scalars (max_norm, growth_interval,
# max_scale, min_scale), the true norm (the kernel sees it times the scale; Inf: the scaled gradients overflowed)
# and the state before it, [scale, clean steps, overflows, last overflowed].
_STEPS = (
    ((1.0, 3, 4096.0, 256.0), 3.0, (1024.0, 0.0, 0.0, 0.0)),     # clipped; one clean step more, no growth
    ((10.0, 4, 4096.0, 256.0), 3.0, (1024.0, 3.0, 1.0, 1.0)),    # not clipped; the interval's last clean step: x2
    ((1.0, 5, 2048.0, 256.0), 0.5, (2048.0, 4.0, 0.0, 0.0)),     # growth capped at max_scale
    ((1.0, 6, 4096.0, 256.0), math.inf, (1024.0, 2.0, 3.0, 0.0)),  # overflow: halved, counted, clean steps reset
    ((1.0, 7, 4096.0, 512.0), math.inf, (512.0, 0.0, 1.0, 1.0)),   # overflow at min_scale: the floor holds
    ((math.inf, 1000, MAX_SCALE, MIN_SCALE), 0.0, tuple(initial_state())),  # the defaults' start, a zero norm
)
_SCALARS = ("max_norm", "growth_interval", "max_scale", "min_scale")
_STEP_OF = {scalars: (true, state) for scalars, true, state in _STEPS}


def _step_inputs(rng: np.random.Generator, shape, **scalars) -> tuple[np.ndarray, np.ndarray]:
    """The case's norm of the scaled gradients (its true norm times the state's scale) and its state."""
    true, state = _STEP_OF[tuple(scalars[k] for k in _SCALARS)]
    return np.array([true * state[0]], np.float32), np.array(state, np.float32)


# The norm divides by a power of two (exact), the clip coefficient costs two roundings; the state is exact.
register(OpSpec(
    "loss_scale_update", "fp16 dynamic loss scaling in one invocation: the true norm and clip coefficient from the "
    "scaled gradients' norm; the state [scale, clean steps, overflows, last overflowed] updated in place.",
    __name__, (LOSS_SCALE_UPDATE,), loss_scale_update, None, reference_update, None, _step_inputs,
    args=("norm", "state"), outputs=("true_norm", "clip_coef", "state"), saves=(), family="loss_scale",
    shapes=((1,),) * len(_STEPS), sizes=lambda shape: (), autograd=False, inplace={"state": "state"},
    tolerance={"true_norm": Tolerance(), "clip_coef": Tolerance(rel=2), "state": Tolerance()},
    scalars={k: tuple(scalars[i] for scalars, _, _ in _STEPS) for i, k in enumerate(_SCALARS)}))
