"""Step capture for the helios backend: the micro-step (forward + backward) and the optimizer step, each
recorded once into a command buffer and replayed after, so a replayed step records nothing on the host.

A micro-step reads everything that changes per step from fixed device buffers (`StepFeed`): the token ids
and targets, the embedding backward's scatter plan of those ids, and the dropout RNG counter. They are
written before each replay. The optimizer step reads the gradient arena, the loss sum and AdamW's step
buffer (lr and step count). What is baked into a capture (shapes, grad_accum, the clip and spike settings,
activation checkpointing, dropout) is its key (`capture_keys`): a step whose key differs runs lazily, and the
next step with that key captures again. See docs/REPLAY.md.
"""

from __future__ import annotations

import numpy as np

import autograd
from autograd.host_inputs import HostInputs
from helios import ops
from helios import runtime as rt
from helios.kernels.indexing.embedding import FixedScatterPlan
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


def capture_micro_step(key, run_micro_step, x, y, forward_index: int, vocab: int) -> MicroStepCapture:
    """Capture `run_micro_step(ids, targets, forward_index, counter, host)` on a new feed holding (x, y); the
    captured step runs once now, as the lazy step it replaces would."""
    feed = StepFeed(x.shape[0], x.shape[1], vocab)
    feed.write(x, y, forward_index)
    with Capture() as cap:
        run_micro_step(feed.ids, feed.targets, forward_index, feed.counter, feed.host)
    return MicroStepCapture(key, feed, cap)


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
