"""Resuming a run with settings that differ from its checkpoint's: another number of data-parallel ranks
(the global batch is kept and split over the new ranks), and changed optimizer or schedule settings (each
one warned about, with what it does to the learning rate).

The sampler draws the whole global batch on every rank, so its checkpointed state covers every rank:
resuming on N' ranks with the same global batch sees the same windows in the same order. Only the
summation order of the gradient mean changes (per-rank means averaged over N' instead of N).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainer.checkpoint import STATE_FILE, Checkpoint, latest_path
from trainer.config import Config, ScheduleConfig
from trainer.errors import CheckpointError, TrainerError
from trainer.schedule import lr_at

# Settings a run may change on resume, each with a warning: they change the trajectory from the resume step on.
WARNED_OPTIM = ("lr", "betas", "eps", "weight_decay", "grad_clip")
WARNED_TRAIN = ("grad_accum",)
_MAX_LISTED = 12  # rank counts listed in a refusal


@dataclasses.dataclass(frozen=True)
class SavedBatch:
    """The batch shape a checkpoint was trained with: ranks x per-rank batch_size = global rows per micro-batch."""

    ranks: int
    batch_size: int

    @property
    def global_batch(self) -> int:
        return self.ranks * self.batch_size

    @classmethod
    def of(cls, state: dict[str, Any]) -> SavedBatch | None:
        """From a checkpoint's state.json (None when it does not say)."""
        try:
            return cls(int(state.get("world_size", 1)), int(state["config"]["train"]["batch_size"]))
        except (KeyError, TypeError, ValueError):
            return None


def fit_to_ranks(cfg: Config, saved: SavedBatch | None, ranks: int, ckpt_name: str) -> tuple[Config, list[str]]:
    """The config a resume on `ranks` ranks trains with, and a note when it re-shards the global batch.

    Same rank count: unchanged. Another count with the config's batch_size as saved: each rank trains
    global_batch / ranks rows (refused when that is not whole). A batch_size that already gives the saved
    global batch is kept; any other batch_size is a deliberate batch change (warned by `resume_warnings`).
    """
    if saved is None or ranks == saved.ranks:
        return cfg, []
    per_rank = cfg.train.batch_size
    if per_rank * ranks != saved.global_batch:
        if per_rank != saved.batch_size:
            return cfg, []  # the user set a new batch_size: a global batch change, warned about
        if saved.global_batch % ranks:
            raise CheckpointError(_unsplittable(saved, ranks, ckpt_name))
        per_rank = saved.global_batch // ranks
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=per_rank))
    note = (f"trainer: note: resuming {ckpt_name} ({_shape(saved.ranks, saved.batch_size)}) on {_ranks(ranks)}: "
            f"the same global batch of {saved.global_batch} rows in the same order, {per_rank} per rank")
    return cfg, [note]


def _unsplittable(saved: SavedBatch, ranks: int, ckpt_name: str) -> str:
    counts = [str(n) for n in range(1, saved.global_batch + 1) if saved.global_batch % n == 0]
    if len(counts) > _MAX_LISTED:
        counts = [*counts[:_MAX_LISTED - 2], "...", counts[-1]]
    listed = counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} or {counts[-1]}"
    return (f"checkpoint {ckpt_name} was trained with a global batch of {saved.global_batch} rows "
            f"({_shape(saved.ranks, saved.batch_size)}), which {ranks} ranks cannot split evenly: resume with "
            f"--nproc {listed} to keep it (and the data order), or set --train.batch_size=B for a new global "
            f"batch of {ranks} x B rows")


def _shape(ranks: int, batch_size: int) -> str:
    return f"{_ranks(ranks)} x batch_size {batch_size}"


def _ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def resume_warnings(cfg: Config, ckpt: Checkpoint, ranks: int) -> list[str]:
    """Lines that tell a user resuming with changed training settings what changed (it is allowed)."""
    saved = ckpt.state.get("config") or {}
    name, out = ckpt.path.name, []
    for section, keys in (("optim", WARNED_OPTIM), ("train", WARNED_TRAIN),
                          ("schedule", tuple(f.name for f in dataclasses.fields(ScheduleConfig)))):
        for key in keys:
            was, now = (saved.get(section) or {}).get(key), _plain(getattr(getattr(cfg, section), key))
            if was is not None and was != now:
                out.append(f"trainer: warning: resuming {name} with [{section}] {key} = {now} (it was trained "
                           f"with {was}){_follows_max_iters(cfg, saved, key, was)}")
    batch = SavedBatch.of(ckpt.state)
    if batch is not None and batch.global_batch != cfg.train.batch_size * ranks:
        trained = batch.batch_size if batch.ranks == ranks else _shape(batch.ranks, batch.batch_size)
        out.append(f"trainer: warning: resuming {name} with [train] batch_size = {cfg.train.batch_size} on "
                   f"{_ranks(ranks)} (it was trained with {trained}): a global batch of "
                   f"{cfg.train.batch_size * ranks} rows instead of {batch.global_batch}, so the data order changes")
    lr_line = _lr_jump(cfg, saved, ckpt.step)
    if out and lr_line:
        out.append(lr_line)
    return out


def check_fixed_keys(cfg: Config, ckpt: Checkpoint) -> None:
    """Refuse (one line) a resume that sets a key fixed for the life of a run to something new: [train] seed (it
    picks the eval batches and samples, so val losses would stop being comparable) and [train] init_from (the
    weights came from the checkpoint; a new source would be ignored)."""
    saved = (ckpt.state.get("config") or {}).get("train") or {}
    name, t = ckpt.path.name, cfg.train
    was = saved.get("seed")
    if was is not None and was != t.seed:
        raise CheckpointError(f"resuming {name} with [train] seed = {t.seed}, but it was trained with seed {was}: "
                              "the seed is fixed for a run (it picks the eval batches and samples); drop the new "
                              f"seed (or pass --train.seed={was}), or start a new [run] name")
    was = saved.get("init_from")
    if t.init_from is not None and (was is None or Path(was).expanduser().resolve()
                                    != Path(t.init_from).expanduser().resolve()):
        had = f"was started from {was}" if was is not None else "was trained from scratch (no init_from)"
        raise CheckpointError(f"resuming {name} with [train] init_from = {t.init_from}, but the run {had}: a resume "
                              "continues from its checkpoint's weights; drop init_from, or start a new [run] name "
                              "to fine-tune from it")


def _plain(value: Any) -> Any:
    """A config value as state.json holds it (tuples are lists there)."""
    return list(value) if isinstance(value, tuple) else value


def _follows_max_iters(cfg: Config, saved: dict, key: str, was: Any) -> str:
    """For lr_decay_iters that moved with max_iters (its default): how to keep the old schedule."""
    if key != "lr_decay_iters" or cfg.schedule.lr_decay_iters != cfg.train.max_iters:
        return ""
    return (f"; lr_decay_iters follows max_iters unless set, so extending a run stretches its decay: pass "
            f"--schedule.lr_decay_iters={was} to keep the schedule it was trained with")


def _lr_jump(cfg: Config, saved: dict, step: int) -> str | None:
    """'the learning rate at step S is X (the checkpoint's settings give Y)', or None when it is the same."""
    try:
        old_sched = ScheduleConfig(**{f.name: saved["schedule"][f.name] for f in dataclasses.fields(ScheduleConfig)})
        old = lr_at(step, old_sched, float(saved["optim"]["lr"]))
    except (KeyError, TypeError, ValueError):
        return None
    new = lr_at(step, cfg.schedule, cfg.optim.lr)
    if new == old:
        return None
    return (f"trainer: note: the learning rate at step {step} is {new:.6g} (the checkpoint's settings "
            f"give {old:.6g})")


def check_launch(cfg: Config, ranks: int) -> None:
    """Before `--nproc` starts any rank: refuse a resume that cannot split its global batch over `ranks`
    (one line from the launcher, not one per rank). A broken or missing checkpoint is left to the ranks,
    which say precisely what is wrong with it."""
    try:
        latest = latest_path(Path(cfg.run.dir))
        state = json.loads((latest / STATE_FILE).read_text(encoding="utf-8")) if latest is not None else None
    except (TrainerError, OSError, ValueError):
        return
    if isinstance(state, dict):
        fit_to_ranks(cfg, SavedBatch.of(state), ranks, latest.name)
