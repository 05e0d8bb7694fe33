"""AdamW over a flat parameter arena, gradient-norm clipping on the device, and learning-rate schedules."""

from __future__ import annotations

import math

import numpy as np

from autograd.grad_mode import no_grad
from autograd.parameter import ParameterArena


class AdamW:
    """Fused multi-tensor AdamW: the gradient norm, the clip coefficient and the update are device work.

    `step()` records at most three dispatches (two for the norm and clip coefficient, one for the update)
    and reads nothing back. With `skip_nonfinite`, a NaN/Inf gradient norm (or one above `skip_above`)
    makes the update kernel change nothing; the caller learns it from `last_check` when it next reads.
    When the arena has a half working copy (`arena.set_working_dtype`, or `working_dtype="bf16"`/"fp16"
    here), its fp32 params are the master weights and the update kernel rewrites the copy in the same
    dispatch (mixed precision, issue 17).
    """

    def __init__(self, arena: ParameterArena, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1, grad_clip: float = 0.0,
                 skip_nonfinite: bool = True, skip_above: float = math.inf, working_dtype: str | None = None):
        from helios import runtime as rt

        if not isinstance(arena, ParameterArena):
            raise TypeError("AdamW takes the model's ParameterArena (model.arena after model.pack_parameters())")
        self.arena = arena
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.grad_clip, self.skip_nonfinite, self.skip_above = grad_clip, skip_nonfinite, skip_above
        self.m = rt.zeros(arena.size)
        self.v = rt.zeros(arena.size)
        self.step_count = 0
        # A fixed 4-float device tensor of the per-step scalars (set for a captured step), else one per step.
        self.step_buffer = None
        # (1,) device tensors of the last step: the gradient norm, the value the skip test read, the clip coefficient
        self.last_raw_norm = self.last_check = self.last_clip = None
        if working_dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"AdamW working_dtype must be None, 'bf16' or 'fp16', not {working_dtype!r}")
        if working_dtype is not None:
            arena.set_working_dtype(working_dtype)
        self.loss_scale_state = None  # fp16: [scale, clean steps, overflows, last overflowed] on the device
        self.growth_interval = 0

    def enable_loss_scaling(self, initial_scale: float | None = None, growth_interval: int | None = None) -> None:
        """Dynamic loss scaling (helios.kernels.optim.loss_scale): seed backward with `loss_scale` instead of 1;
        each step unscales the gradients, skips on overflow and adapts the scale, all on the device."""
        from helios import runtime as rt
        from helios.kernels.optim.loss_scale import GROWTH_INTERVAL, INITIAL_SCALE, initial_state

        self.growth_interval = growth_interval or GROWTH_INTERVAL
        self.loss_scale_state = rt.from_numpy(initial_state(initial_scale or INITIAL_SCALE))

    @property
    def loss_scale(self):
        """The current loss scale as a (1,) float32 device tensor (the backward's seed), or None."""
        state = self.loss_scale_state
        return state.view(0, (1,)) if state is not None else None

    @property
    def working(self):
        """The arena's half working copy that each step rewrites, or None (fp32)."""
        return self.arena.working

    def refresh_working_copy(self) -> None:
        """Rewrite the half working copy from the fp32 masters (after they were set from the host)."""
        self.arena.refresh_working()

    def step(self, lr: float | None = None, skip_extra=None) -> None:
        """One update. `skip_extra` (a (1,) device tensor) is added to the norm the skip test reads, so
        a caller can make a NaN elsewhere (e.g. in the loss, scaled by 0) skip the step too."""
        from helios import ops

        lr = self.lr if lr is None else lr
        self.step_count += 1
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        with no_grad():
            norm, coef = ops.grad_norm(self.arena.grads, max_norm)
            if self.loss_scale_state is not None:  # the gradients are scaled: unscale norm and clip, adapt
                norm, coef, _ = ops.loss_scale_update(norm, self.loss_scale_state, max_norm, self.growth_interval)
            check = ops.add(norm, skip_extra) if skip_extra is not None else norm
            ops.adamw_step(
                self.arena.data, self.arena.grads, self.m, self.v, self.arena.decay_mask,
                lr=lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps, weight_decay=self.weight_decay,
                step=self.step_count, clip_coef=coef,
                norm=check if self.skip_nonfinite else None, skip_above=self.skip_above,
                step_buffer=self.step_buffer, working_copy=self.working,
            )
        self._bump_versions()
        self.last_raw_norm, self.last_check, self.last_clip = norm, check, coef

    def step_values(self, lr: float) -> np.ndarray:
        """The step buffer's values for the next step at `lr` (write them before a captured step runs)."""
        from helios.kernels.optim.adamw import step_scalars

        return step_scalars(lr=lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=self.weight_decay,
                            step=self.step_count + 1)

    def replayed(self) -> None:
        """Account for a step the device ran from a captured command buffer (no recording on the host)."""
        self.step_count += 1
        self._bump_versions()

    def _bump_versions(self) -> None:
        for p in self.arena.params:
            p._version.value += 1

    def unstep(self) -> None:
        """Undo the step counter after a step the device skipped (bias correction must not advance)."""
        self.step_count -= 1

    def zero_grad(self) -> None:
        self.arena.zero_grad()

    def state(self) -> dict[str, np.ndarray]:
        out = {"m": self.m.numpy().copy(), "v": self.v.numpy().copy(), "step": np.int64(self.step_count)}
        if self.loss_scale_state is not None:
            out["loss_scale"] = self.loss_scale_state.numpy().copy()
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        from helios import runtime as rt

        for key in ("m", "v"):
            value = np.ascontiguousarray(state[key], dtype=np.float32)
            if value.shape != (self.arena.size,):
                raise ValueError(f"optimizer state {key!r} has shape {value.shape}; the arena has ({self.arena.size},)")
            rt.copy(rt.from_numpy(value), getattr(self, key))
        self.step_count = int(state["step"])
        if self.loss_scale_state is not None and "loss_scale" in state:
            rt.copy(rt.from_numpy(np.asarray(state["loss_scale"], np.float32).reshape(4)), self.loss_scale_state)
        self.refresh_working_copy()


def lr_at(step: int, *, lr: float, warmup_iters: int, decay: str, lr_decay_iters: int, min_lr: float) -> float:
    """Linear warmup to `lr`, then cosine or linear decay to `min_lr` at `lr_decay_iters`, then flat."""
    if warmup_iters > 0 and step < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if decay == "constant" or step >= lr_decay_iters:
        return lr if decay == "constant" else min_lr
    span = max(1, lr_decay_iters - warmup_iters)
    progress = (step - warmup_iters) / span
    if decay == "linear":
        return lr + (min_lr - lr) * progress
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
