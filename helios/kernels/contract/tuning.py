"""Stored tuning winners: what a tuner measured fastest, kept per device and read back by a family's rule.

One JSON file per device key (`helios.env.cache_dir()/tuning-<device key>.json`) holds the device's
description and one section per family, `{shape key: choice}`:

    {"device": {...}, "matmul": {"nn:2048x1152x384": "reg12x8a", ...}}

The device key names the device, its driver and driver build, and an overriding profile, so a winner is
used only on exactly what measured it. A family makes its own shape keys (`key(...)` adds the dtype when it
is not f32). A rule asks `TuningStore.winner`; `python -m helios.bench tune` calls `save`. The generic
tuner (helios.bench.tuner) stores every family's winners under `selection.shape_key(shape)` keys
(`"256,384,128,True:bf16"`), which `selection.choose` reads for every family; matmul's own `nn:MxNxK`
keys stay its rule's. Files are read
once per process and path; a test that wants a fresh read calls `forget`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from pathlib import Path

from helios import env

_KEYS: dict[int, tuple[object, str]] = {}  # id(info) -> (info, its key): selection.choose asks at every launch


def device_key(info) -> str:
    """A file-name-safe key for a device, its driver version and an overriding profile: tuning results are
    valid for exactly that (the GPU profile on lavapipe tunes other tilings than the CPU's own)."""
    known = _KEYS.get(id(info))
    if known is not None and known[0] is info:
        return known[1]
    raw = f"{info.name}-{info.driver_name}-{info.driver_info or info.driver_version}"
    if info.profile:
        raw += f"-{info.profile}-profile"
    got = re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")
    _KEYS[id(info)] = (info, got)  # keeping info keeps its id from being reused
    return got


def key(shape: str, dtype: str = "f32") -> str:
    """A family's shape key for `dtype`: the shape key itself for f32 (as stored before dtypes were keyed),
    else `<shape key>:<dtype>`."""
    return shape if dtype == "f32" else f"{shape}:{dtype}"


class TuningStore:
    """The tuning winners under one cache directory (default: helios.env.cache_dir() at each call), read once
    per file and process; winners saved where the directory cannot be written serve this process only."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._read: dict[tuple[Path, str], dict[str, str]] = {}  # (file, family) -> {shape key: choice}
        self._paths: dict[tuple[Path, str], Path] = {}  # (directory, device key) -> its file

    def path(self, info) -> Path:
        """The file holding this device's winners (the Path made once per directory and device: every launch
        asks, through selection.choose)."""
        directory = env.cache_dir() if self._directory is None else self._directory
        at = (directory, device_key(info))
        path = self._paths.get(at)
        if path is None:
            path = self._paths[at] = directory / f"tuning-{at[1]}.json"
        return path

    def winners(self, info, family: str, choices: Collection | None = None) -> dict[str, str]:
        """This device's stored winners of `family` ({} when none), those in `choices` only (a winner a newer
        helios no longer offers is dropped)."""
        path = self.path(info)
        got = self._read.get((path, family))
        if got is None:
            try:
                section = json.loads(path.read_text()).get(family, {})
                got = {k: v for k, v in section.items() if choices is None or v in choices}
            except (OSError, ValueError, AttributeError):
                got = {}
            self._read[path, family] = got
        return got

    def winner(self, info, family: str, shape_key: str, choices: Collection | None = None) -> str | None:
        """The stored winner of `family` for `shape_key` on this device, or None."""
        return self.winners(info, family, choices).get(shape_key)

    def save(self, info, family: str, winners: dict[str, str]) -> Path | None:
        """Merge winners into this device's file and into the in-process table; returns the path, or None
        when the cache directory cannot be written (the winners then serve this process only)."""
        self.winners(info, family).update(winners)
        if self._directory is None and env.cache_problem() is not None:
            return None
        path = self.path(info)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data.setdefault("device", {"name": info.name, "driver": f"{info.driver_name} {info.driver_info}",
                                   "driver_version": info.driver_version})
        data.setdefault(family, {}).update(winners)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:  # a disk that filled up since the probe
            tmp.unlink(missing_ok=True)
            return None
        return path

    def forget(self, info=None) -> None:
        """Drop what was read (of `info`'s file only, when given): the next read is a fresh process's."""
        if info is None:
            self._read.clear()
            return
        path = self.path(info)
        for k in [k for k in self._read if k[0] == path]:
            del self._read[k]


# The store the rules read and the tuner writes.
STORE = TuningStore()

__all__ = ["TuningStore", "STORE", "device_key", "key"]
