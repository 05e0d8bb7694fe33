"""The JSON-lines event log: one `{"event": ..., "t": ..., ...}` object per line, flushed per line.

Events the trainer writes: config, resume, step, eval, sample, ckpt, skip, end. Readers skip malformed
or truncated lines with a warning (a run being written, or killed mid-line, is normal).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

METRICS_FILE = "metrics.jsonl"


def _jsonable(value: Any) -> Any:
    """NaN/Inf have no JSON form: they become null (a `skip` event says why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    return value


def _ends_with_newline(path: Path) -> bool:
    """True for an empty file or one whose last byte is a newline."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"


class MetricsWriteError(OSError):
    """An event could not be appended (a full disk, an I/O error); the log still ends with its last whole line."""


class MetricsWriter:
    """Appends events to RUN_DIR/metrics.jsonl, one whole line each, written straight to the file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file: IO[bytes] | None = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
        if not _ends_with_newline(self.path):
            # A writer killed mid-line left a partial record: end it, so our first event starts a line of its own
            # (readers then skip just the partial one instead of losing both).
            self._append(b"\n")

    def _append(self, line: bytes) -> None:
        """Write a line whole or not at all: one write call (more only after a short write); when the file
        refuses the rest (ENOSPC, EFBIG, EIO) it is cut back to where the line began, and MetricsWriteError says why."""
        assert self._file is not None
        fd = self._file.fileno()
        start = os.fstat(fd).st_size
        done = 0
        try:
            while done < len(line):
                done += self._file.write(line[done:]) or 0
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
                kept = "it still ends with its last whole event"
            except OSError:
                kept = "its last line may be cut short (readers skip it)"
            raise MetricsWriteError(exc.errno, f"cannot append to {self.path}: {exc.strerror or exc}; {kept}") \
                from None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event (t defaults to now, Unix seconds); returns the record as written."""
        record = {"event": event, "t": fields.pop("t", time.time())}
        record.update(fields)
        record = _jsonable(record)
        if self._file is not None:
            self._append((json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))
        return record

    def close(self) -> None:
        """Close the file (further emits are dropped)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def metrics_path(run_or_file: str | Path) -> Path:
    """RUN_DIR/metrics.jsonl for a run directory; a file path is returned as is."""
    p = Path(run_or_file)
    return p / METRICS_FILE if p.is_dir() else p


class NotTelemetryError(ValueError):
    """A file that is not a helios metrics log (its first line is not a JSON event)."""


EVENT_PREFIX = b'{"event"'  # how every line the writer emits begins (json.dumps keeps key order)


def check_telemetry(path: str | Path) -> None:
    """Raise NotTelemetryError unless the file's first non-blank line is a helios event.

    The writer emits whole lines that begin with `{"event"`. A first line cut short (a trainer killed while
    writing it, or one still being written) is tolerated when it begins that way; any other first line means
    the file is something else. An empty file passes (a run that has not logged yet).
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    for raw in head.split(b"\n"):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            if raw.startswith(EVENT_PREFIX):
                continue  # a torn event: judge by the next line
            raise NotTelemetryError(f"{path} is not a helios metrics log (its first line is not JSON)") from None
        if not isinstance(record, dict) or "event" not in record or "t" not in record:
            raise NotTelemetryError(f"{path} is not a helios metrics log (its first line is not a JSON event)")
        return


def parse_lines(lines: Iterator[str] | list[str], source: str = "metrics",
                warn: bool = True) -> Iterator[dict[str, Any]]:
    """Events from text lines; a malformed line, or one without event/t, is skipped (with a warning if warn)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if warn:
                warnings.warn(f"{source}:{lineno}: skipping malformed line", stacklevel=2)
            continue
        if not isinstance(record, dict) or "event" not in record or "t" not in record:
            if warn:
                warnings.warn(f"{source}:{lineno}: skipping a line that is not an event", stacklevel=2)
            continue
        yield record


def read_events(run_or_file: str | Path) -> list[dict[str, Any]]:
    """Every readable event of a run, in file order; [] when there is no log yet."""
    path = metrics_path(run_or_file)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return list(parse_lines(text.splitlines(), str(path)))


REPLAYED = ("step", "skip", "eval", "sample")  # per-step events a resumed run logs again


def surviving(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the trajectory that survived: a run stopped or killed after its checkpoint at step N logs
    steps N+1.. again when resumed (its `config` event says start_step N), and the later copies win."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e["event"] == "config" and isinstance(e.get("start_step"), int):
            start = e["start_step"]
            out = [x for x in out if x["event"] not in REPLAYED or not isinstance(x.get("step"), int)
                   or x["step"] <= start]
        out.append(e)
    return out


class EventTail:
    """Incremental reader for a growing log: each poll() returns the complete new lines' events."""

    def __init__(self, run_or_file: str | Path):
        self.path = metrics_path(run_or_file)
        self._offset = 0
        self._lineno = 0

    def poll(self) -> list[dict[str, Any]]:
        """Events appended since the last poll; a partial last line waits for its newline."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        if end == 0:
            return []
        self._offset += end
        lines = chunk[:end].decode("utf-8", errors="replace").splitlines()
        events = list(parse_lines(lines, f"{self.path}@{self._lineno}"))
        self._lineno += len(lines)
        return events


LOCK_FILE = ".lock"  # trainer.runlock's: rank 0 of a live trainer holds it and has written its pid there


def trainer_pid(run_dir: str | Path) -> int | None:
    """The pid of the trainer that last held RUN_DIR/.lock (None when there is no lock file or no pid in it)."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def trainer_alive(run_dir: str | Path) -> bool | None:
    """Whether the run's trainer process still exists: None when unknown (no lock file: a run copied from
    elsewhere, or one from before the lock), False when its pid is gone (it crashed or was killed)."""
    import os

    pid = trainer_pid(run_dir)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process with that pid: alive
        return True
    return True


def run_status(events: list[dict[str, Any]], alive: bool | None) -> str:
    """"done"/"stopped"/"diverged" from the last `end` event after the last step; else "running" while the
    trainer lives (or when that is unknown) and "crashed" once it is gone."""
    ends = [e for e in events if e.get("event") == "end"]
    steps = [e for e in events if e.get("event") == "step"]
    if ends and (not steps or ends[-1].get("t", 0) >= steps[-1].get("t", 0)):
        return str(ends[-1].get("status", "ended"))
    return "crashed" if alive is False else "running"
