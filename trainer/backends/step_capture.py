"""The helios backend's training step on the device: the micro-step (forward + backward) and the optimizer step,
each recorded lazily, or once into a command buffer and replayed after, so a replayed step records nothing on the
host. `StepRunner` owns both and their captures; the backend (trainer/backends/helios.py) calls it and reads the
step's scalars back, and nothing here calls the backend.

A micro-step reads everything that changes per step from fixed device buffers (`StepFeed`): the token ids
and targets, the embedding backward's scatter plan of those ids, and the dropout RNG counter. They are
written before each replay. The optimizer step reads the gradient arena, the loss sum and AdamW's step
buffer (lr and step count). What is baked into a capture (shapes, grad_accum, the clip and spike settings,
activation checkpointing, dropout) is its key (`capture_keys`): a step whose key differs runs lazily, and the
next step with that key captures again. See docs/REPLAY.md.
"""

from __future__ import annotations

import math
import time

import numpy as np

import autograd
from autograd.host_inputs import HostInputs
from helios import ops
from helios import runtime as rt
from helios.plans import FixedScatterPlan
from helios.runtime.capture import Capture, write_fixed


def capture_keys(batch_shape: tuple[int, ...], n_micro: int, model, grad_clip: float,
                 spike_threshold: float | None) -> tuple[tuple, tuple]:
    """What a capture bakes in, as (micro-step key, optimizer-step key): a captured part replays only while its
    key holds. A micro-step bakes in the batch shape, grad_accum (its loss is scaled by 1/n), activation
    checkpointing and the dropout rate; the optimizer step bakes in grad_accum, the clip and the spike threshold."""
    micro = (tuple(batch_shape), n_micro, model.checkpoint_activations, model.cfg.dropout)
    return micro, (n_micro, grad_clip, spike_threshold)


class StepFeed:
    """The fixed device inputs of a captured micro-step, rewritten before each replay."""

    def __init__(self, batch: int, block: int, vocab: int):
        self.shape = (batch, block)
        # empty: written by `write` before any use
        self.ids = autograd.Tensor(rt.empty(self.shape, np.int32))
        self.targets = autograd.Tensor(rt.empty(self.shape, np.int32))
        self.plan = FixedScatterPlan(batch * block, vocab)
        self.counter = rt.empty((1,), np.uint32)  # forward_index << 16, added to every dropout offset
        # What the model plans from on the host while the step is captured (the chunked cross-entropy's chunk
        # weights), with the ids' scatter plan in the fixed tensors above.
        self.host = HostInputs(ids=np.zeros(self.shape, np.int32), targets=np.zeros(self.shape, np.int32),
                               scatter_plan=self.plan)

    def write(self, x: np.ndarray, y: np.ndarray, forward_index: int, writer=write_fixed) -> None:
        """Put one micro-batch's values in place (`writer(tensor, array)`: a capture's write_input, which
        waits until the last replay is done with the buffer)."""
        x, y = np.asarray(x, np.int32).reshape(self.shape), np.asarray(y, np.int32).reshape(self.shape)
        self.host.ids[...], self.host.targets[...] = x, y
        writer(self.ids.data, x)
        writer(self.targets.data, y)
        for tensor, array in zip(self.plan.tensors, self.plan.arrays(x), strict=True):
            writer(tensor, array)
        writer(self.counter, np.array([(forward_index << 16) & 0xFFFFFFFF], np.uint32))


class MicroStepCapture:
    """One micro-step (forward, backward, loss accumulation) captured for a fixed key and replayed."""

    def __init__(self, key, feed: StepFeed, capture: Capture):
        self.key, self.feed, self.capture = key, feed, capture

    def replay(self, x, y, forward_index: int) -> None:
        self.feed.write(x, y, forward_index, self.capture.write_input)
        self.capture.replay()

    def close(self) -> None:
        self.capture.close()


class OptimizerCapture:
    """The optimizer step (mean loss, gradient norm, clip, NaN/spike check, AdamW) captured for a fixed key."""

    def __init__(self, opt, loss_sum, n_micro: int, lr: float, record_scalars):
        """`record_scalars(mean_loss)` records the step's scalars for the host read (captured with the step)."""
        self.opt = opt
        self.step_buffer = opt.step_buffer = rt.from_numpy(opt.step_values(lr))
        try:
            with Capture() as cap:
                self.mean_loss = ops.scale(loss_sum, 1.0 / n_micro) if n_micro > 1 else loss_sum
                opt.step(lr=lr, skip_extra=ops.scale(self.mean_loss, 0.0))  # a NaN loss poisons the check
                record_scalars(self.mean_loss)
        finally:
            opt.step_buffer = None  # lazy steps upload their own
        self.capture = cap
        self.outputs = (opt.last_raw_norm, opt.last_check, opt.last_clip)

    def replay(self, lr: float) -> None:
        self.capture.write_input(self.step_buffer, self.opt.step_values(lr))
        self.opt.replayed()
        self.capture.replay()
        # A lazy step in between (an injected NaN) left its own result tensors: point back at the captured ones.
        self.opt.last_raw_norm, self.opt.last_check, self.opt.last_clip = self.outputs

    def close(self) -> None:
        self.capture.close()


class StepRunner:
    """Records a training step's device work: each micro-step and the optimizer step replayed from its capture
    while its key holds, captured when the step before ran the same key, else recorded lazily; and the step's
    scalars (loss, norms, clip, loss-scale state) gathered for one host read."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.scalars = rt.Readback({"loss": 1, "raw_norm": 1, "check": 1, "clip": 1, "loss_scale": 4})
        self.loss_sum = rt.zeros(1)  # sum of the micro-steps' losses: a fixed buffer both captures use
        self.lazy_fwd_ms = 0.0  # the forward's share of the last lazily recorded micro-step
        self._micro: MicroStepCapture | None = None
        self._opt: OptimizerCapture | None = None
        self._opt_key = None
        self._step_keys: set = set()  # micro-step keys run this step
        self._last_step_keys: set = set()  # and the last one

    def begin(self) -> None:
        """Start a step: zero the gradients and the loss sum."""
        self.model.zero_grad()
        rt.fill(self.loss_sum, 0.0)
        self._step_keys = set()

    def micro_step(self, key: tuple, x: np.ndarray, y: np.ndarray, n: int, forward_index: int,
                   capture: bool) -> str:
        """One micro-step: "replayed" from the capture of its key, "captured" (recorded into a new capture
        and run), or "lazy" (recorded as usual; always so without `capture`). A key is captured when the step
        before ran it too, so a one-off shape (a partial batch) costs no capture and leaves the usual one in place."""
        self._step_keys.add(key)
        # Ignored targets (negative ids) would change what a chunked cross-entropy bakes in: record those lazily.
        if capture and not (y < 0).any():
            cap = self._micro
            if cap is not None and cap.key == key:
                cap.replay(x, y, forward_index)
                return "replayed"
            if key in self._last_step_keys:
                if cap is not None:
                    cap.close()
                self._micro = self._capture_micro_step(key, x, y, n, forward_index)
                return "captured"
        self._record_micro_step(x, y, n, forward_index)
        return "lazy"

    def end_micro_steps(self) -> None:
        """The step's micro-steps are recorded: their keys are the ones the next step may capture."""
        self._last_step_keys = self._step_keys

    def optimizer_step(self, key: tuple, n: int, lr: float, capture: bool, inject_nan: bool = False) -> bool:
        """The optimizer step (mean loss, gradient norm, clip, NaN/spike check, AdamW) and the scalars' gather:
        with `capture`, replayed from its capture while `key` holds, else captured (and run); without, recorded
        lazily, its check poisoned with a NaN when `inject_nan`. Returns whether it replayed."""
        if not capture:
            mean_loss = ops.scale(self.loss_sum, 1.0 / n) if n > 1 else self.loss_sum
            poison = ops.scale(mean_loss, math.nan if inject_nan else 0.0)
            self.opt.step(lr=lr, skip_extra=poison)
            self._record_scalars(mean_loss)
            return False
        cap = self._opt
        if cap is not None and self._opt_key == key:
            cap.replay(lr)
            return True
        self.close(micro=False)
        self._opt = OptimizerCapture(self.opt, self.loss_sum, n, lr, self._record_scalars)
        self._opt_key = key
        return False

    def read(self) -> dict[str, np.ndarray]:
        """The step's scalars: the step's one host read, which submits its queued work and waits for it."""
        return self.scalars.read()

    def close(self, micro: bool = True) -> None:
        """Drop the optimizer step's capture, and with `micro` the micro-step's (the next step records lazily)."""
        if self._opt is not None:
            self._opt.close()
        self._opt = self._opt_key = None
        if micro:
            if self._micro is not None:
                self._micro.close()
            self._micro, self._last_step_keys = None, set()

    def _record_micro_step(self, ids, targets, n: int, forward_index: int, counter=None, host=None) -> None:
        """Forward, backward (gradients accumulate into the arena) and loss_sum += loss: what a capture holds.
        ids/targets: host arrays (a lazy step) or a captured step's fixed tensors with their `host` inputs."""
        t0 = time.perf_counter()
        loss = self.model(ids, targets, forward_index=forward_index, rng_counter=counter, feed=host)
        self.lazy_fwd_ms = (time.perf_counter() - t0) * 1000.0
        seed = self.opt.loss_scale  # fp16: d(loss) = the device's loss scale, else 1
        (loss if n == 1 else loss * (1.0 / n)).backward(autograd.Tensor(seed) if seed is not None else None)
        ops.add_inplace(self.loss_sum, loss.data)

    def _capture_micro_step(self, key, x, y, n: int, forward_index: int) -> MicroStepCapture:
        """Capture a micro-step on a new feed holding (x, y); the captured step runs once now, as the lazy step
        it replaces would."""
        feed = StepFeed(x.shape[0], x.shape[1], self.model.cfg.vocab_size)
        feed.write(x, y, forward_index)
        with Capture() as cap:
            self._record_micro_step(feed.ids, feed.targets, n, forward_index, feed.counter, feed.host)
        return MicroStepCapture(key, feed, cap)

    def _record_scalars(self, mean_loss) -> None:
        """Gather the step's scalars (loss, norms, clip, loss-scale state) for the step's one host read."""
        opt = self.opt
        state = {"loss_scale": opt.loss_scale_state} if opt.loss_scale_state is not None else {}
        self.scalars.record(loss=mean_loss, raw_norm=opt.last_raw_norm, check=opt.last_check, clip=opt.last_clip,
                            **state)
