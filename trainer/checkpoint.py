"""Checkpoints: `RUN_DIR/ckpt-<step>/{model.safetensors,state.json}` plus an atomically updated `latest` pointer.

A checkpoint is built in a temp directory, every file fsynced, renamed into place, and only then is
`latest` replaced (temp file + os.replace). Any failure on the way (a full disk included) leaves the
previous checkpoint and `latest` exactly as they were.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer import env
from trainer.errors import CheckpointError

FORMAT = 1
LATEST = "latest"
BEST = "ckpt-best"  # the checkpoint of the best val loss (train.keep_best), never pruned
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.json"
_CKPT_RE = re.compile(r"^ckpt-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its directory, tensors (state_dict layout) and state.json contents."""

    path: Path
    step: int
    tensors: dict[str, np.ndarray]
    state: dict[str, Any]


def _write_file(path: Path, data: bytes) -> None:
    """Write bytes and fsync them (the one place checkpoint bytes hit the disk; tests inject ENOSPC here)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _pause(seconds: float) -> None:
    """The HELIOS_CKPT_DELAY_S test hook: a window between checkpoint phases."""
    if seconds:
        time.sleep(seconds)


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete-looking ckpt-<step> directory, oldest first."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _CKPT_RE.match(p.name)) and p.is_dir()]
    return sorted(found)


def _latest_name(run_dir: Path) -> str | None:
    """What `latest` holds (stripped), or None when it is missing or unreadable."""
    try:
        return (run_dir / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        return None


TEMP_PREFIXES = (".ckpt-", f".{LATEST}.tmp", ".write-probe-", ".resolved.json.")


def remove_stale_temps(run_dir: Path) -> list[str]:
    """Delete the temp files/dirs a killed trainer left (only call it holding the run lock); returns their names."""
    removed = []
    for path in run_dir.iterdir() if run_dir.is_dir() else []:
        if path.name.startswith(TEMP_PREFIXES):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def latest_path(run_dir: Path) -> Path | None:
    """The checkpoint `latest` points at, or None when the run has none yet."""
    pointer = run_dir / LATEST
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read {pointer}: {exc.strerror or exc}") from None
    if not _CKPT_RE.match(name):
        raise CheckpointError(f"{pointer} is corrupt (holds {name[:40]!r}, expected ckpt-<step>)")
    path = run_dir / name
    if not path.is_dir():
        raise CheckpointError(f"{pointer} points at {name}, which does not exist")
    return path


def load_latest(run_dir: Path) -> Checkpoint | None:
    """The verified checkpoint `latest` names (None: no checkpoint yet); a broken one is a CheckpointError that
    says how to fall back to an earlier checkpoint."""
    name = _latest_name(run_dir)
    try:
        latest = latest_path(run_dir)
        return load_checkpoint(latest) if latest is not None else None
    except CheckpointError as exc:
        others = [p.name for _, p in list_checkpoints(run_dir) if p.name != name]
        fallback = (f"to resume from an earlier checkpoint write its name ({', '.join(reversed(others))}) into "
                    f"{run_dir / LATEST}, or start afresh with a new --run.name" if others else
                    "start afresh with a new --run.name (or delete the run directory)")
        raise CheckpointError(f"{exc}; {fallback}") from None


def held_checkpoint(run_dir: Path) -> str | None:
    """The name of the checkpoint a run directory would resume from (`latest`, else its newest), or None."""
    name = _latest_name(run_dir)
    if name is not None:
        return name[:40]
    found = list_checkpoints(run_dir)
    return found[-1][1].name if found else None


def load_resumable(run_dir: Path, verb: str = "resuming from") -> tuple[Checkpoint | None, str | None]:
    """(checkpoint to continue from, a note for the user or None). `latest` names it when it exists; without
    `latest` (deleted, or lost with a copy), the newest ckpt-N that verifies, and the note says so. Checkpoints
    but none that verifies is a CheckpointError: starting afresh would bury them."""
    if os.path.lexists(run_dir / LATEST):
        return load_latest(run_dir), None
    found = list_checkpoints(run_dir)
    failed: list[str] = []
    for _, path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            failed.append(f"{path.name}: {exc}")
            continue
        skipped = f" (skipped {'; '.join(failed)})" if failed else ""
        return ckpt, (f"{run_dir} has no `{LATEST}` pointer: {verb} {path.name}, the newest checkpoint that "
                      f"verifies{skipped}")
    if failed:
        raise CheckpointError(f"{run_dir} has no `{LATEST}` pointer and none of its checkpoints verifies "
                              f"({'; '.join(failed)}); move them out of the way or use a new --run.name")
    return None, None


def available_checkpoints(run_dir: Path) -> list[str]:
    """The checkpoint names in a run directory: ckpt-<step> oldest first, then the best one if kept."""
    names = [p.name for _, p in list_checkpoints(run_dir)]
    return names + [BEST] if (run_dir / BEST / STATE_FILE).is_file() else names


def load_chosen(run_dir: Path, choice: str | None, verb: str = "using") -> tuple[Checkpoint | None, str | None]:
    """(checkpoint, note) for `--ckpt CHOICE`: a name within the run directory (ckpt-3000, ckpt-best) or a path
    to a checkpoint directory; None picks what `load_resumable` does. `latest` is never moved."""
    if choice is None:
        return load_resumable(run_dir, verb)
    inside = run_dir / choice
    path = inside if choice and inside.is_dir() and inside != run_dir else Path(choice).expanduser()
    if not choice or not (path / STATE_FILE).is_file():
        names = available_checkpoints(run_dir)
        raise CheckpointError(f"no checkpoint {choice!r} in {run_dir}: the checkpoints there are "
                              f"{', '.join(names) if names else 'none yet'} (or give a checkpoint directory's path)")
    return load_checkpoint(path), None


def _describe(run_dir: Path) -> str:
    """'latest still points at ckpt-N' (or 'there is no earlier checkpoint') for error messages."""
    try:
        prev = latest_path(run_dir)
    except CheckpointError:
        prev = None
    return f"latest still points at {prev.name}" if prev else "there is no earlier checkpoint"


def save_checkpoint(run_dir: Path, step: int, tensors: dict[str, np.ndarray], state: dict[str, Any],
                    keep: int, ours: Callable[[int], bool] | None = None) -> Path:
    """Write ckpt-<step> atomically, point `latest` at it, keep the `keep` newest; returns its path.
    `ours(step)` says which checkpoints this run wrote (None: all): pruning never touches the others."""

    delay = env.ckpt_delay_s()
    final = run_dir / f"ckpt-{step}"
    tmp = run_dir / f".ckpt-{step}.tmp{os.getpid()}"
    stale = run_dir / f".ckpt-{step}.old{os.getpid()}"
    try:
        if final.is_dir() and _latest_name(run_dir) == final.name:
            return final  # this step is already saved and is the latest: the state is identical
        shutil.rmtree(tmp, ignore_errors=True)
        _write_into(tmp, step, tensors, state, delay)
        if final.is_dir():
            # A ckpt-<step> that `latest` does not name: an earlier save killed between its rename and the
            # pointer update, or a run rolled back by editing `latest`. It may hold another trajectory: replace it.
            os.rename(final, stale)
        os.rename(tmp, final)
        _fsync_dir(run_dir)
        shutil.rmtree(stale, ignore_errors=True)
        _pause(delay)
        _point_latest(run_dir, final.name)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        reason = "the disk is full" if full else (exc.strerror or str(exc))
        fix = "free some space and" if full else "fix that and"
        raise CheckpointError(f"could not write checkpoint ckpt-{step} in {run_dir}: {reason}; "
                              f"{_describe(run_dir)} ({fix} run again to resume from there)") from None
    _pause(delay)
    _prune(run_dir, keep, final, ours)
    return final


def _write_into(tmp: Path, step: int, tensors: dict[str, np.ndarray], state: dict[str, Any],
                delay: float = 0.0) -> None:
    """Create `tmp` and write a checkpoint's two files into it (the weights, then the state naming their digest),
    synced: what save() and save_best() rename into place."""
    from safetensors.numpy import save

    tmp.mkdir()
    # asarray(order="C"), not ascontiguousarray: the latter turns the 0-d adam_step into shape [1].
    blob = save({k: np.asarray(v, order="C") for k, v in tensors.items()}, metadata={"format": "helios"})
    state = dict(state, format=FORMAT, step=step, time=time.time(),
                 model_file={"name": MODEL_FILE, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
    _write_file(tmp / MODEL_FILE, blob)
    _pause(delay)
    _write_file(tmp / STATE_FILE, json.dumps(state, indent=1).encode("utf-8"))
    _fsync_dir(tmp)


def save_best(run_dir: Path, step: int, tensors: dict[str, np.ndarray], state: dict[str, Any]) -> Path:
    """Write `ckpt-best` (built in a temp directory, then renamed over the previous one); `latest` and the
    ckpt-<step> rotation are untouched. Returns its path."""

    final = run_dir / BEST
    tmp, stale = run_dir / f".{BEST}.tmp{os.getpid()}", run_dir / f".{BEST}.old{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        _write_into(tmp, step, tensors, state)
        if final.is_dir():
            os.rename(final, stale)
        os.rename(tmp, final)
        _fsync_dir(run_dir)
        shutil.rmtree(stale, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise CheckpointError(f"could not write {BEST} (step {step}) in {run_dir}: "
                              f"{'the disk is full' if full else exc.strerror or exc}; {_describe(run_dir)}") from None
    return final


def _point_latest(run_dir: Path, name: str) -> None:
    """Replace the `latest` pointer atomically."""
    tmp = run_dir / f".{LATEST}.tmp{os.getpid()}"
    try:
        _write_file(tmp, (name + "\n").encode("utf-8"))
        os.replace(tmp, run_dir / LATEST)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(run_dir)


def _prune(run_dir: Path, keep: int, current: Path, ours: Callable[[int], bool] | None) -> None:
    """Delete all but the `keep` newest of this run's checkpoints (never the current one, never another run's);
    failures only leave extra files."""
    ckpts = [p for step, p in list_checkpoints(run_dir) if ours is None or ours(step) or p == current]
    for path in ckpts[:-keep] if keep > 0 else []:
        if path != current:
            # Renamed first, so a kill mid-delete leaves a temp name (removed at the next start), never a
            # half-deleted ckpt-<step>.
            doomed = run_dir / f".{path.name}.old{os.getpid()}"
            try:
                os.rename(path, doomed)
            except OSError:
                continue
            shutil.rmtree(doomed, ignore_errors=True)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify a checkpoint directory (sizes and SHA-256 of the tensor file, then its contents)."""
    from safetensors.numpy import load

    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"unknown format {state.get('format') if isinstance(state, dict) else state!r}")
        step, expect = int(state["step"]), state["model_file"]
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no {STATE_FILE} (incomplete or not a checkpoint)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path}/{STATE_FILE} is corrupt: {exc}") from None
    try:
        blob = (path / MODEL_FILE).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path / MODEL_FILE}: {exc.strerror or exc}") from None
    if len(blob) != expect.get("bytes"):
        raise CheckpointError(f"checkpoint {path / MODEL_FILE} is truncated or corrupt: {len(blob)} bytes, "
                              f"expected {expect.get('bytes')}")
    if hashlib.sha256(blob).hexdigest() != expect.get("sha256"):
        raise CheckpointError(f"checkpoint {path / MODEL_FILE} is corrupt: its SHA-256 does not match state.json")
    try:
        tensors = load(blob)
    except Exception as exc:  # safetensors raises its own error type for every kind of bad file
        raise CheckpointError(f"checkpoint {path / MODEL_FILE} is corrupt: {exc}") from None
    return Checkpoint(path, step, tensors, state)
