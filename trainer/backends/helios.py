"""The helios backend: the autograd GPT on Vulkan compute, with the fused AdamW over the parameter arena.

A training step records forward, backward, the gradient norm and the AdamW update as lazy GPU work and
reads back once, at the end (loss, gradient norm and clip coefficient together). Skipping a bad step
is decided on the device: the AdamW kernel leaves everything untouched when the norm (with the loss
folded in, so a NaN loss counts) is not finite or is above the spike threshold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import numpy as np

import autograd
from autograd.nn import GPT, GPTConfig
from autograd.nn.decode import KVCache
from autograd.nn.gpt import resolve_dtype
from autograd.optim import AdamW
from helios import runtime as rt
from helios.ceilings.peak import Peak
from helios.device.policy import auto_dtype
from trainer.backend import (
    COUNTER_KEYS,
    OTHER_BACKENDS_STATE,
    Backend,
    StepResult,
    count_params,
    flops_per_token,
)
from trainer.backends.step_capture import StepRunner, capture_keys
from trainer.config import ModelConfig, OptimConfig
from trainer.errors import ModelTooLargeError

MiB = 1 << 20


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _gpt_config(cfg: ModelConfig) -> GPTConfig:
    return GPTConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(GPTConfig)})


class HeliosBackend(Backend):
    """GPT + fused AdamW on the helios Vulkan engine."""

    name = "helios"  # --backend helios (declaring it registers this class in trainer.backend)
    kernel_choices = True

    def __init__(self, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int):
        self.cfg, self.optim_cfg, self.seed = model_cfg, optim_cfg, seed
        self.max_tensor = rt.max_tensor_bytes()
        self._checked_batches: set[tuple[int, int]] = set()
        self._check_params_fit()
        info = rt.get_runtime().info
        self.dtype = resolve_dtype(model_cfg.dtype, info)  # "auto" decided for this device
        self.dtype_reason = (f"auto: {auto_dtype(info)[1]}" if model_cfg.dtype == "auto"
                             else "model.dtype in the config")
        self.model = GPT(dataclasses.replace(_gpt_config(model_cfg), dtype=self.dtype), seed=seed)
        self.model.train()
        self.opt = AdamW(self.model.arena, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                         weight_decay=optim_cfg.weight_decay, grad_clip=0.0)
        if self.dtype == "fp16":  # fp16 gradients underflow without it; bf16 has fp32's exponent range
            self.opt.enable_loss_scaling()
        # The step's device work, with its captures (docs/REPLAY.md): the micro-step and the optimizer step
        # replay while their keys hold, where `replay` allows it.
        self.steps = StepRunner(self.model, self.opt)
        self.replay = True
        self.forwards = 0  # training forward passes so far: seeds each pass's dropout masks
        self._base_counters = self._raw_counters()

    @classmethod
    def create(cls, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int) -> HeliosBackend:
        return cls(model_cfg, optim_cfg, seed)

    def set_replay(self, on: bool) -> None:
        self.replay = on

    def on_compile(self, callback) -> None:
        rt.get_runtime().set_compile_listener(callback)

    # -- device limits -------------------------------------------------------------------------
    def _check_params_fit(self) -> None:
        """The parameters (and each Adam moment) live in one buffer: refuse a model the device cannot bind."""
        n = count_params(self.cfg)
        if 4 * n > self.max_tensor:
            m = self.cfg
            raise ModelTooLargeError(
                f"the model has {n:,} parameters ({4 * n / MiB:,.0f} MiB of fp32), but the device "
                f"'{rt.get_runtime().info.name}' binds at most {self.max_tensor / MiB:,.0f} MiB in one buffer "
                f"(maxStorageBufferRange), which helios needs for all parameters together; at most "
                f"{self.max_tensor // 4:,} parameters fit: use a smaller [model] n_embd ({m.n_embd}), "
                f"n_layer ({m.n_layer}) or vocab_size ({m.vocab_size})")

    def check_batch(self, batch_size: int, block_size: int) -> None:
        """The widest activation of a micro-batch (MLP hidden, fused QKV) must fit one device buffer; the
        logits do not count: past the limit the model computes them and their loss in row chunks."""
        B, T = batch_size, block_size
        if (B, T) in self._checked_batches:
            return
        m = self.cfg
        widths = {f"the MLP hidden layer ({m.ffn_hidden} wide)": m.ffn_hidden,
                  "the fused QKV projection": (m.n_head + 2 * m.n_kv_head) * m.head_dim}
        what, width = max(widths.items(), key=lambda kv: kv[1])
        nbytes = 4 * B * T * width
        if nbytes > self.max_tensor:
            fit = self.max_tensor // (4 * T * width)
            hint = (f"use [train] batch_size <= {fit} (and grad_accum for the same tokens per step)" if fit
                    else "use a smaller [model] block_size or vocab_size/n_embd")
            raise ModelTooLargeError(
                f"a micro-batch of {B} x {T} tokens needs {nbytes / MiB:,.0f} MiB for {what}, but the device "
                f"'{rt.get_runtime().info.name}' binds at most {self.max_tensor / MiB:,.0f} MiB in one buffer "
                f"(maxStorageBufferRange); {hint}")
        self._checked_batches.add((B, T))

    # -- training ------------------------------------------------------------------------------
    def train_step(self, micro_batches, lr: float, grad_clip: float, spike_threshold: float | None,
                   inject_nan: bool = False) -> StepResult:
        n = len(micro_batches)
        for x, _ in micro_batches:
            self.check_batch(*x.shape)
        fwd_ms = bwd_ms = 0.0
        rt.get_runtime().pool.reset_peak()  # the step event's pool_peak_in_use is this step's peak
        steps = self.steps
        steps.begin()
        capture = self.replay and not inject_nan
        micro_replayed = True
        opt_key = None
        for x, y in micro_batches:
            x, y = np.ascontiguousarray(x, np.int32), np.ascontiguousarray(y, np.int32)
            micro_key, opt_key = capture_keys(x.shape, n, self.model, grad_clip, spike_threshold)
            t0 = time.perf_counter()
            how = steps.micro_step(micro_key, x, y, n, self._dropout_index(), capture)
            self.forwards += 1
            micro_replayed &= how == "replayed"
            if how == "lazy":
                fwd_ms += steps.lazy_fwd_ms
                bwd_ms += _ms(t0) - steps.lazy_fwd_ms
            else:
                fwd_ms += _ms(t0)
        steps.end_micro_steps()
        comm_ms = 0.0
        if self.world is not None and self.world.size > 1:
            t0 = time.perf_counter()
            self._reduce_gradients(steps.loss_sum)
            comm_ms = _ms(t0)
        t0 = time.perf_counter()
        # The update is skipped on the device when this check is NaN/Inf or above the spike threshold;
        # adding 0 * loss makes a NaN loss poison it too.
        self.opt.grad_clip = grad_clip
        self.opt.skip_above = spike_threshold if spike_threshold is not None else math.inf
        opt_replayed = steps.optimizer_step(opt_key, n, lr, capture, inject_nan)
        opt_ms = _ms(t0)
        t0 = time.perf_counter()
        # The step's one host read and one wait: the optimizer step gathered its scalars into one host-visible
        # buffer, and the read submits the step's queued work (one submit for a replayed step) and waits for it.
        scalars = steps.read()
        raw_norm, loss_val = float(scalars["raw_norm"][0]), float(scalars["loss"][0])
        check, clip_coef = float(scalars["check"][0]), float(scalars["clip"][0])
        scale_state = scalars["loss_scale"] if self.opt.loss_scale_state is not None else None
        wait_ms = _ms(t0)
        norm_val = raw_norm if not inject_nan else math.nan
        skipped = None
        if scale_state is not None and scale_state[3] and math.isfinite(loss_val) and not inject_nan:
            skipped = "overflow"  # fp16 gradients overflowed at this loss scale: skipped, the scale halved
        elif not (math.isfinite(check) and math.isfinite(loss_val) and math.isfinite(norm_val)):
            skipped = "nan"
        elif spike_threshold is not None and check > spike_threshold:
            skipped = "spike"
        if skipped:
            self.opt.unstep()
            clip_coef = 1.0
        elif grad_clip <= 0:
            clip_coef = 1.0
        replayed = micro_replayed and opt_replayed
        record_ms = (0.0 if micro_replayed else fwd_ms + bwd_ms) + (0.0 if opt_replayed else opt_ms)
        loss_scale = float(scale_state[0]) if scale_state is not None else None
        overflows = int(scale_state[2]) if scale_state is not None else None
        return StepResult(loss_val, norm_val, clip_coef, skipped, fwd_ms, bwd_ms, opt_ms, wait_ms, replayed, record_ms,
                          dtype=self.dtype, loss_scale=loss_scale, loss_scale_overflows=overflows, comm_ms=comm_ms)

    def invalidate_capture(self) -> None:
        """Drop the captured steps (the next step records lazily, and the one after captures again)."""
        self.steps.close()

    def _dropout_index(self) -> int:
        """This pass's dropout seed index: the pass count, and under data parallelism the rank too, so every
        rank draws its own masks for its own rows (one process: just the pass count, as always)."""
        size, rank = (self.world.size, self.world.rank) if self.world is not None else (1, 0)
        return self.forwards * size + rank

    def _reduce_gradients(self, loss_sum) -> None:
        """Average the gradient arena and the loss sum over the data-parallel ranks through host memory (one
        download, one MPI Allreduce, one upload each, in place)."""
        grads = self.model.arena.grads
        host = np.empty(grads.numel + 1, np.float32)
        host[:-1] = grads.numpy().reshape(-1)  # waits for this rank's backward
        host[-1] = loss_sum.numpy().reshape(-1)[0]
        self.world.mean_(host)
        rt.copy(rt.from_numpy(host[:-1]), grads)
        rt.copy(rt.from_numpy(host[-1:]), loss_sum)

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        self.check_batch(*x.shape)
        self.model.eval()
        try:
            with autograd.no_grad():
                return self.model(np.ascontiguousarray(x, np.int32), np.ascontiguousarray(y, np.int32)).item()
        finally:
            self.model.train()

    @contextlib.contextmanager
    def decoding(self):
        """A KV cache makes each token cost one row per layer instead of the whole window. The window slides by
        half a block (window_start), so the cache is refilled once per block_size // 2 + 1 tokens; the one-token
        steps at positions filled before replay their captures (autograd/nn/decode.py)."""
        cache = KVCache(self.model, capture=True) if KVCache.supports(self.model.cfg) else None
        vocab = self.cfg.vocab_size

        def next_logits(window: list[int], fresh: bool) -> np.ndarray:
            if cache is None:
                logits = self.model(autograd.tensor(np.asarray([window], dtype=np.int32))).data
            elif fresh:
                cache.reset()
                logits = cache.feed(window)
            else:
                logits = cache.feed(window[-1:])
            return logits.numpy().reshape(-1, vocab)[-1].astype(np.float64)

        self.model.eval()
        try:
            with autograd.no_grad():
                yield next_logits
        finally:
            if cache is not None:
                cache.close()
            self.model.train()

    # -- state ---------------------------------------------------------------------------------
    def _slices(self):
        arena = self.model.arena
        return zip(arena.names, arena.params, arena.offsets, strict=True)

    def state_dict(self) -> dict[str, np.ndarray]:
        m, v = self.opt.m.numpy(), self.opt.v.numpy()
        out: dict[str, np.ndarray] = {}
        for name, p, off in self._slices():
            size = p.numel()
            out[f"param.{name}"] = p.numpy().copy()
            out[f"adam_m.{name}"] = m[off:off + size].reshape(p.shape).copy()
            out[f"adam_v.{name}"] = v[off:off + size].reshape(p.shape).copy()
        out["adam_step"] = np.array(self.opt.step_count, dtype=np.int64)
        out["rng_forwards"] = np.array(self.forwards, dtype=np.int64)
        if self.opt.loss_scale_state is not None:
            out["loss_scale"] = self.opt.loss_scale_state.numpy().copy()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        expected = {f"{k}.{n}" for n, _, _ in self._slices() for k in ("param", "adam_m", "adam_v")}
        expected.add("adam_step")
        keys = set(state) - OTHER_BACKENDS_STATE
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        if missing or extra:
            raise ValueError(f"state keys differ: missing {missing[:3]}, unexpected {extra[:3]}")
        size = self.model.arena.size
        host = {"param": np.zeros(size, np.float32), "adam_m": np.zeros(size, np.float32),
                "adam_v": np.zeros(size, np.float32)}
        for name, p, off in self._slices():
            for prefix, dst in host.items():
                src = np.asarray(state[f"{prefix}.{name}"], dtype=np.float32)
                if tuple(src.shape) != tuple(p.shape):
                    raise ValueError(f"{prefix}.{name} has shape {list(src.shape)}, the model needs {list(p.shape)}")
                dst[off:off + p.numel()] = src.reshape(-1)
        rt.copy(rt.from_numpy(host["param"]), self.model.arena.data)
        opt_state = {"m": host["adam_m"], "v": host["adam_v"], "step": state["adam_step"]}
        if "loss_scale" in state:
            opt_state["loss_scale"] = state["loss_scale"]
        self.opt.load_state(opt_state)
        # A checkpoint from another backend has no forward count: one forward per optimizer step is the guess.
        self.forwards = int(np.asarray(state.get("rng_forwards", state["adam_step"])).reshape(()))
        self.invalidate_capture()  # a resume recaptures: nothing recorded before it is trusted after it
        rt.sync()

    # -- reporting -----------------------------------------------------------------------------
    @staticmethod
    def _raw_counters() -> dict[str, int]:
        c = rt.counters()
        return {k: int(c.get(k, 0)) for k in COUNTER_KEYS}

    def counters(self) -> dict[str, int]:
        now = self._raw_counters()
        for key in ("dispatches", "submits", "barriers", "host_waits", "device_allocs"):
            now[key] -= self._base_counters[key]
        return now

    def num_params(self) -> int:
        return self.model.arena.numel()

    def flops_per_token(self) -> float:
        return flops_per_token(self.cfg, self.num_params())

    def device_name(self) -> str:
        return rt.get_runtime().info.name

    def precision(self) -> tuple[str, str]:
        return self.dtype, self.dtype_reason

    def device_peak(self, remeasure_from: Peak | None = None) -> Peak | None:
        """The vendor's figure for a known device; else the FMA peak stored by `python -m helios.bench limits` or
        an earlier run, else measured now (about a second) and stored; measured again on request."""
        from helios.ceilings import peak

        if remeasure_from is not None:
            return peak.remeasure(self.device_name(), remeasure_from)
        return peak.device_peak(self.device_name())
