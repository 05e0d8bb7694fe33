"""The training loop: batches, schedule, the backend's step, NaN/spike policy, eval, samples, checkpoints, telemetry.

Library code: it never prints. Every event goes to the metrics log and to an optional listener (the
CLI's progress display). Signals are turned into requests on `Controls` by the CLI; the loop honours
them between steps, so a checkpoint always holds a whole step.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer import env
from trainer.autotune import auto_tune
from trainer.backend import CUMULATIVE_COUNTERS, Backend
from trainer.checkpoint import Checkpoint, save_best, save_checkpoint
from trainer.config import Config, model_signature
from trainer.distributed import PeerStalled, World, shard
from trainer.errors import CheckpointError, ConfigError, TrainingDivergedError
from trainer.resume import check_fixed_keys
from trainer.run_artifacts import data_fingerprint
from trainer.schedule import lr_at
from trainer.tokens import BatchSampler, PreparedData

SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 50
DEFAULT_PROMPT = "\n"


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mb() -> float | None:
    """This process's resident set size now, in MiB (from /proc/self/statm; None where there is no /proc)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Controls:
    """Requests from outside the loop (signal handlers): save a checkpoint, or save and stop."""

    save_requested: bool = False
    stop_requested: str | None = None  # the reason, e.g. "SIGTERM"


def sample_text(backend: Backend, tokenizer: Any, prompt: str, n: int, temperature: float, top_k: int | None,
                rng: np.random.Generator, stop: Callable[[], bool] | None = None) -> str:
    """Generate n tokens after prompt and decode them (ids the tokenizer does not know are dropped); `stop` is
    asked after each token, and a true answer ends the sample there."""
    ids = tokenizer.encode(prompt or DEFAULT_PROMPT, add_special_tokens=False).ids or [0]
    on_token = None if stop is None else (lambda _id: not stop())
    out = backend.generate(np.asarray(ids, dtype=np.int32), n, temperature, top_k, rng, on_token=on_token)
    known = [int(i) for i in out if int(i) < tokenizer.get_vocab_size()]
    return tokenizer.decode(known)


def check_checkpoint_matches(cfg: Config, data: PreparedData, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint trained with another tokenizer or model config (cheap: before any backend exists)."""
    saved = ckpt.state
    if saved.get("tokenizer_sha256") != data.tokenizer_hash:
        raise CheckpointError(
            f"checkpoint {ckpt.path.name} was trained with a different tokenizer "
            f"(sha256 {str(saved.get('tokenizer_sha256'))[:12]}, "
            f"the data now gives {data.tokenizer_hash[:12]}); "
            "use a new [run] name or restore the original data"
        )
    check_fixed_keys(cfg, ckpt)  # a new seed or init_from: refused, not silently ignored
    want = model_signature(cfg.model)
    have = (saved.get("config") or {}).get("model") or {}
    diff = [f"{k} {have.get(k)!r} -> {v!r}" for k, v in want.items() if have.get(k) != v]
    if diff:
        raise CheckpointError(f"checkpoint {ckpt.path.name} is from a different model config "
                              f"({'; '.join(diff)}); use a new [run] name or the original [model] settings")


EVAL_ITERS_FLOOR = 100  # eval_iters allowed whatever the split's size (a small split's batches repeat)
GRAD_ACCUM_FLOOR = 64  # the same for grad_accum


def check_data_fit(cfg: Config, train_tokens: int | None, val_tokens: int, global_batch: int,
                   split: str = "val") -> None:
    """Refuse (ConfigError, one line) an eval_iters or grad_accum far past what the splits hold: more batches
    than cover a split only repeat its windows, and each one costs host memory and time. `split` names the
    split evaluated (val_tokens long); a train_tokens of None skips the grad_accum check."""
    t, block = cfg.train, cfg.model.block_size
    val_cover = max(EVAL_ITERS_FLOOR, math.ceil(max(val_tokens - block, 1) / global_batch))
    if t.eval_iters > val_cover:
        raise ConfigError(f"[train] eval_iters = {t.eval_iters} is not allowed: the {split} split's "
                          f"{max(val_tokens - block, 0):,} windows of {block} tokens are covered by {val_cover:,} "
                          f"batches of {global_batch}; use at most that (`trainer eval --eval-iters all` scores "
                          "every window once)")
    train_cover = max(GRAD_ACCUM_FLOOR, math.ceil(max((train_tokens or 0) - block, 1) / global_batch))
    if train_tokens is not None and t.grad_accum > train_cover:
        raise ConfigError(f"[train] grad_accum = {t.grad_accum} is not allowed: {t.grad_accum:,} micro-batches of "
                          f"{global_batch} rows per step is more than the train split's "
                          f"{max(train_tokens - block, 0):,} windows of {block} tokens; use at most {train_cover:,}")


def eval_batches(cfg: Config, tokens: np.ndarray,
                 batch_size: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The fixed evaluation batches, drawn one at a time: the same every time (seeded by train.seed), so evals
    are comparable. `batch_size` defaults to train.batch_size (data-parallel runs pass the global batch)."""
    t = cfg.train
    sampler = BatchSampler(tokens, cfg.model.block_size, batch_size or t.batch_size,
                           np.random.default_rng([t.seed, 0xE7A1]))
    return (sampler.next() for _ in range(t.eval_iters))


def evaluate(cfg: Config, backend: Backend, tokens: np.ndarray, batch_size: int | None = None,
             stop: Callable[[], bool] | None = None) -> float:
    """Mean loss over the fixed evaluation batches of a split; `stop` is asked between batches, and a true
    answer ends the eval early (the mean of the batches done, nan if none)."""
    losses = []
    for x, y in eval_batches(cfg, tokens, batch_size):
        if stop is not None and stop():
            break
        losses.append(backend.eval_loss(x, y))
    return float(np.mean(losses)) if losses else float("nan")


def evaluate_whole(cfg: Config, backend: Backend, tokens: np.ndarray,
                   batch_size: int | None = None) -> tuple[float, int]:
    """(mean loss per token, tokens scored) over the whole split: consecutive non-overlapping block_size windows,
    batch_size at a time (the tail shorter than one window is left out)."""
    block, rows = cfg.model.block_size, batch_size or cfg.train.batch_size
    starts = np.arange((len(tokens) - 1) // block) * block
    offsets = np.arange(block + 1)
    total = 0.0
    for i in range(0, len(starts), rows):
        window = np.asarray(tokens[starts[i:i + rows, None] + offsets], dtype=np.int32)
        total += backend.eval_loss(window[:, :-1], window[:, 1:]) * len(window)
    return (total / len(starts) if len(starts) else float("nan")), len(starts) * block


class Trainer:
    """Runs `train.max_iters` steps of a backend over prepared data, logging to a MetricsWriter."""

    def __init__(self, cfg: Config, backend: Backend, backend_kind: str, data: PreparedData, run_dir: Path,
                 listener: Callable[[dict], None] | None = None, controls: Controls | None = None,
                 world: World | None = None):
        self.cfg, self.backend, self.backend_kind, self.data = cfg, backend, backend_kind, data
        backend.set_replay(cfg.train.replay)
        self.run_dir, self.listener = run_dir, listener
        self.writer: Any = None  # the MetricsWriter, set by run()
        self.controls = controls or Controls()
        self.world = world or World()
        backend.set_world(self.world)
        t = cfg.train
        backend.set_activation_checkpointing(t.checkpoint_activations)
        # Every rank draws the same global batch (world x batch_size windows) and trains on its own slice.
        self.global_batch = t.batch_size * self.world.size
        self.sampler = BatchSampler(data.train, cfg.model.block_size, self.global_batch,
                                    np.random.default_rng(t.seed))
        self.step = 0
        self.resumed_from: str | None = None
        # Pruning deletes only this run's checkpoints: those up to where it resumed, and those it wrote since.
        self.start_step = 0
        self.saved_steps: set[int] = set()
        self._tokenizer: Any = None
        # The lowest val loss so far, its step, and the evals since it (ckpt-best and early stopping).
        self.best_val, self.best_step, self.evals_since_best = math.inf, None, 0
        self.peak: Any = None  # the backend's helios.ceilings.peak.Peak, set by run()
        self._peak_remeasured = False
        self._work_delay = env.work_delay_s()

    # --- events and checkpoints ---------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> dict:
        """Log an event and hand it to the listener."""
        record = self.writer.emit(event, **fields) if self.writer is not None else {"event": event, **fields}
        if self.listener is not None:
            self.listener(record)
        return record

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint: weights, Adam state, step and data RNG; refuses a mismatched one.
        Any rank count may resume it: the sampler state covers the global batch (trainer/resume.py keeps it)."""
        saved = ckpt.state
        check_checkpoint_matches(self.cfg, self.data, ckpt)
        try:
            self.backend.load_state_dict(ckpt.tensors)
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {ckpt.path.name} does not fit this model: {exc}") from None
        self.sampler.set_state(saved["data_rng"])
        self.step = self.start_step = ckpt.step
        self.resumed_from = ckpt.path.name
        best = saved.get("best_val_loss")
        self.best_val = float(best) if isinstance(best, (int, float)) else math.inf
        self.best_step, self.evals_since_best = saved.get("best_step"), int(saved.get("evals_since_best") or 0)

    def save(self, reason: str) -> Path:
        """Write a checkpoint of the current step and log a `ckpt` event (rank 0 only: every rank holds the
        same parameters, optimizer state and sampler state)."""
        if not self.world.is_main:
            return self.run_dir
        t0 = time.perf_counter()
        state = self._checkpoint_state()
        self.saved_steps.add(self.step)
        path = save_checkpoint(self.run_dir, self.step, self.backend.state_dict(), state, self.cfg.train.keep_ckpts,
                               ours=lambda step: step <= self.start_step or step in self.saved_steps)
        self.emit("ckpt", step=self.step, path=path.name, reason=reason, ms=(time.perf_counter() - t0) * 1000)
        return path

    def _checkpoint_state(self) -> dict[str, Any]:
        """state.json's contents besides the step and tensor file: config, data, RNG, and the best-val bookkeeping
        (so a resumed run keeps its best val loss and its early-stopping patience)."""
        return {"config": self.cfg.to_dict(), "backend": self.backend_kind,
                "tokenizer_sha256": self.data.tokenizer_hash, "tokenizer_path": str(self.data.tokenizer_path),
                "data_rng": self.sampler.state(), "world_size": self.world.size, "data": data_fingerprint(self.data),
                "tokenizer_json": self.data.tokenizer_path.read_text(encoding="utf-8"),
                "best_val_loss": self.best_val if math.isfinite(self.best_val) else None,
                "best_step": self.best_step, "evals_since_best": self.evals_since_best}

    def track_best(self, loss: float | None) -> bool:
        """After an eval: note a new best (and write ckpt-best under train.keep_best); True when early stopping
        is due (train.early_stop_patience evals without a lower val loss). Every rank calls it: rank 0 decides.
        A loss of None (an eval cut short by a stop request) counts for neither."""
        t = self.cfg.train
        if self.world.is_main and loss is not None:
            if math.isfinite(loss) and loss < self.best_val:
                self.best_val, self.best_step, self.evals_since_best = loss, self.step, 0
                if t.keep_best:
                    self.save_best()
            else:
                self.evals_since_best += 1
        due = self.world.is_main and bool(t.early_stop_patience) and self.evals_since_best >= t.early_stop_patience
        return self.world.any_([due])[0]

    def save_best(self) -> Path:
        """Write ckpt-best (the current step, which has the lowest val loss so far) and log a `ckpt` event."""
        t0 = time.perf_counter()
        state = dict(self._checkpoint_state(), val_loss=self.best_val)
        path = save_best(self.run_dir, self.step, self.backend.state_dict(), state)
        self.emit("ckpt", step=self.step, path=path.name, reason="best", val_loss=self.best_val,
                  ms=(time.perf_counter() - t0) * 1000)
        return path

    @property
    def tokenizer(self) -> Any:
        """The run's tokenizer, loaded on first use."""
        if self._tokenizer is None:
            self._tokenizer = self.data.tokenizer()
        return self._tokenizer

    def stop_asked(self) -> bool:
        """Whether a stop was requested: asked between the batches of an eval and the tokens of a sample, so a
        Ctrl-C does not wait for a long one (after HELIOS_WORK_DELAY_S, a test hook)."""
        if self._work_delay:
            time.sleep(self._work_delay)
        self.world.beat(waiting=True)  # a long eval or sample is progress for the launcher's watchdog
        return self.controls.stop_requested is not None

    def do_eval(self) -> float | None:
        """Evaluate on the validation split and log an `eval` event; None (nothing logged) when a stop request
        cut it short."""
        if not self.world.is_main:
            return float("nan")
        t0 = time.perf_counter()
        loss = evaluate(self.cfg, self.backend, self.data.val, self.global_batch, stop=self.stop_asked)
        if self.controls.stop_requested is not None:
            return None
        self.emit("eval", step=self.step, val_loss=loss, ms=(time.perf_counter() - t0) * 1000)
        return loss

    def do_sample(self) -> str | None:
        """Generate a short sample (seeded by the step, so resumed runs sample the same) and log it; None
        (nothing logged) when a stop request cut it short."""
        if not self.world.is_main:
            return ""
        rng = np.random.default_rng([self.cfg.train.seed, self.step])
        text = sample_text(self.backend, self.tokenizer, DEFAULT_PROMPT, self.cfg.train.sample_tokens,
                           SAMPLE_TEMPERATURE, SAMPLE_TOP_K, rng, stop=self.stop_asked)
        if self.controls.stop_requested is not None:
            return None
        self.emit("sample", step=self.step, prompt=DEFAULT_PROMPT, text=text)
        return text

    def mfu(self, flops_per_s: float) -> float | None:
        """Model FLOPs utilisation of all ranks (each with a device of this peak), at most 1: past 100% the peak
        must be too low (measured while the machine was busy), so it is measured again once, logged as a `peak`
        event, and the figure capped."""
        if self.peak is None:
            return None
        if flops_per_s > self.peak.flops * self.world.size and not self._peak_remeasured and self.world.is_main:
            self._peak_remeasured = True
            was, self.peak = self.peak, self.backend.device_peak(remeasure_from=self.peak) or self.peak
            self.emit("peak", step=self.step, peak_flops=self.peak.flops, peak_source=self.peak.source,
                      was=was.flops)
        return min(1.0, flops_per_s / (self.peak.flops * self.world.size))

    # --- the loop ---------------------------------------------------------------------------------------

    def run(self, writer: Any) -> str:
        """Train to max_iters logging to writer (a MetricsWriter); returns "done", "stopped" (a stop request),
        "early_stopped" (train.early_stop_patience evals without a better val loss) or "stalled" (the launcher's
        watchdog named a stalled peer: rank 0 has checkpointed the last whole step).

        Raises TrainingDivergedError under nan_policy = "stop" after checkpointing the last good state.
        """
        self._step_rng: dict | None = None  # the sampler's state before the step in flight drew its batches
        try:
            return self._train(writer)
        except PeerStalled as exc:
            if self._step_rng is not None:  # the step in flight is dropped: its parameters were not updated
                self.sampler.set_state(self._step_rng)
            if self.step not in self.saved_steps:
                self.save(f"rank {exc.rank} stalled")
            self.emit("end", step=self.step, status="stalled", reason=f"rank {exc.rank} made no progress")
            return "stalled"

    def _train(self, writer: Any) -> str:
        self.writer = writer
        cfg, t, b = self.cfg, self.cfg.train, self.backend
        peak = self.peak = b.device_peak()
        dtype, dtype_reason = b.precision()
        self.emit("config", config=cfg.to_dict(), backend=self.backend_kind, device=b.device_name(),
                  num_params=b.num_params(), flops_per_token=b.flops_per_token(),
                  peak_flops=peak.flops if peak else None, peak_source=peak.source if peak else None,
                  start_step=self.step, max_iters=t.max_iters, resumed_from=self.resumed_from,
                  tokenizer_sha256=self.data.tokenizer_hash, train_tokens=len(self.data.train),
                  val_tokens=len(self.data.val), dtype=dtype, dtype_reason=dtype_reason)
        if self.step >= t.max_iters:
            self.emit("end", step=self.step, status="done")
            return "done"
        tuned = auto_tune(b, cfg, t.max_iters - self.step, self.world.size)
        if tuned is not None:
            self.emit("tune", step=self.step, **tuned)
        inject, delay = env.inject_nan_steps(), env.step_delay_s()
        tokens_per_step = self.global_batch * t.grad_accum * cfg.model.block_size
        fpt = b.flops_per_token()
        prev = b.counters()
        last_eval = last_sample = last_ckpt = -1
        while self.step < t.max_iters:
            lr = lr_at(self.step, cfg.schedule, cfg.optim.lr)
            self._step_rng = self.sampler.state() if self.world.size > 1 else None
            micro = [shard(self.sampler.next(), self.world) for _ in range(t.grad_accum)]
            t0 = time.perf_counter()
            res = b.train_step(micro, lr, cfg.optim.grad_clip, t.spike_threshold, inject_nan=self.step + 1 in inject)
            step_s = time.perf_counter() - t0
            self.step += 1
            self._step_rng = None
            self.world.beat()
            now = b.counters()
            counters = {k: now[k] - prev.get(k, 0) if k in CUMULATIVE_COUNTERS else now[k] for k in now}
            prev = now
            tok_s = tokens_per_step / step_s if step_s > 0 else 0.0
            self.emit("step", step=self.step, loss=res.loss, lr=lr, grad_norm=res.grad_norm, clip_coef=res.clip_coef,
                      skipped=res.skipped, tok_per_s=tok_s, step_ms=step_s * 1000, fwd_ms=res.fwd_ms,
                      bwd_ms=res.bwd_ms, opt_ms=res.opt_ms, wait_ms=res.wait_ms, replayed=res.replayed,
                      record_ms=res.record_ms, dtype=res.dtype, loss_scale=res.loss_scale,
                      loss_scale_overflows=res.loss_scale_overflows, **counters,
                      mfu=self.mfu(fpt * tok_s), rss_mb=rss_mb(),
                      **({"world_size": self.world.size, "allreduce_ms": self.world.reduce_ms, "comm_ms": res.comm_ms}
                         if self.world.size > 1 else {}))
            if res.skipped:
                self.emit("skip", step=self.step, reason=res.skipped, loss=res.loss, grad_norm=res.grad_norm,
                          policy=t.nan_policy if res.skipped == "nan" else "skip")
                if res.skipped == "nan" and t.nan_policy == "stop":
                    path = self.save("nan")
                    self.emit("end", step=self.step, status="diverged")
                    raise TrainingDivergedError(
                        f"loss or gradient norm became NaN/Inf at step {self.step} (nan_policy = \"stop\"); the "
                        f"parameters were left untouched and saved in {path}"
                    )
            early_stop = False
            if t.eval_interval and self.step % t.eval_interval == 0:
                early_stop = self.track_best(self.do_eval())
                last_eval = self.step
            if (t.sample_interval and t.sample_tokens and self.step % t.sample_interval == 0
                    and not self.controls.stop_requested):
                self.do_sample()
                last_sample = self.step
            if t.ckpt_interval and self.step % t.ckpt_interval == 0:
                self.save("interval")
                last_ckpt = self.step
            if early_stop:
                if last_ckpt != self.step:
                    self.save("early_stop")
                self.emit("end", step=self.step, status="done", reason="early_stop", best_val_loss=self.best_val,
                          best_step=self.best_step)
                return "early_stopped"
            if self.world.size > 1:  # every rank acts on a request any rank received, at the same step
                stop, save = self.world.any_([self.controls.stop_requested is not None, self.controls.save_requested])
                if stop and not self.controls.stop_requested:
                    self.controls.stop_requested = "a peer rank's signal"
                self.controls.save_requested = save
            if self.controls.stop_requested:
                if last_ckpt != self.step:
                    self.save(self.controls.stop_requested)
                self.emit("end", step=self.step, status="stopped", reason=self.controls.stop_requested)
                return "stopped"
            if self.controls.save_requested:
                self.controls.save_requested = False
                if last_ckpt != self.step:
                    self.save("signal")
                    last_ckpt = self.step
            if delay:
                time.sleep(delay)
        if last_eval != self.step:
            self.track_best(self.do_eval())
        if t.sample_tokens and last_sample != self.step and not self.controls.stop_requested:
            self.do_sample()
        if self.controls.stop_requested:  # during the last eval or sample: the steps are done, the stop honoured
            if last_ckpt != self.step:
                self.save(self.controls.stop_requested)
            self.emit("end", step=self.step, status="stopped", reason=self.controls.stop_requested)
            return "stopped"
        if last_ckpt != self.step:
            self.save("end")
        self.emit("end", step=self.step, status="done")
        return "done"
