"""Which matmul variant runs: the matrix units for half operands, else stored auto-tuning winners, else a table.

bf16 and fp16 matmuls go to the matrix units where the device offers them for that dtype
(matmul_coopmat.supported): the native cooperative-matrix tilings on real matrix units, the `_emulated` ones
only where DeviceInfo.cooperative_matrix_emulated (the GPU profile, HELIOS_COOPMAT=emulate), never silently
in production. Otherwise, the table: on CPU devices (lavapipe) register-blocked tilings, on GPUs
shared-memory tiled ones; within each, the largest block that still gives enough workgroups to fill the
device. `python -m helios.bench tune matmul` times the candidates for given shapes and stores the winners in
`helios.env.cache_dir()/tuning-<device key>.json`; the rule uses a stored winner for the exact
(layout, M, N, K, batch) when there is one. It is helios.kernels.contract.selection's "matmul" rule: tests, benchmarks
and the tuner force a tiling with `selection.force("matmul", tiling)` (`"cm64_emulated"` too); a forced
tiling this device cannot run for the launch's dtype (a cooperative-matrix one for f32, a native one without
matrix units) gives way to the table, as a register tiling does where subgroups are too narrow or 64-bit
integers are missing, and a shared-memory tiling where its workgroup or tiles exceed the device's limits.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from helios import env
from helios.kernels.contract import selection
from helios.kernels.matmul import coopmat
from helios.kernels.matmul.reg import REG_TILINGS
from helios.spirv import ceil_div

REG = ("reg8x8", "reg16x16", "reg32x16")  # small, medium, large
TILED = ("tiled32", "tiled64", "tiled128")
ADDRESSED = ("reg12x8a",)  # read A and B through device addresses (DeviceInfo.buffer_device_address)
COOPMAT = coopmat.CHOICES  # bf16/fp16 only: cm64, cm128, each also `_emulated`
BLOCKS = {"reg8x8": (8, 64), "reg16x16": (16, 128), "reg32x16": (32, 128),  # (rows, columns) of C per workgroup
          "reg12x8a": (12, 64),
          "tiled32": (32, 32), "tiled64": (64, 64), "tiled128": (128, 128),
          **{t: (coopmat.params(t)["bm"], coopmat.params(t)["bn"]) for t in COOPMAT}}

_tuned: dict[str, dict[str, str]] = {}  # device key -> {shape key: tiling}


def device_key(info) -> str:
    """A file-name-safe key for a device, its driver version and an overriding profile: tuning results are
    valid for exactly that (the GPU profile on lavapipe tunes other tilings than the CPU's own)."""
    raw = f"{info.name}-{info.driver_name}-{info.driver_info or info.driver_version}"
    if info.profile:
        raw += f"-{info.profile}-profile"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")


def tuning_path(info) -> Path:
    return env.cache_dir() / f"tuning-{device_key(info)}.json"


def shape_key(layout: str, M: int, N: int, K: int, batch: int = 1) -> str:
    """The key a tuning winner is stored under: `nn:2048x1152x384` (with `x<batch>` when batched)."""
    key = f"{layout}:{M}x{N}x{K}"
    return key if batch == 1 else f"{key}x{batch}"


def load_tuning(info) -> dict[str, str]:
    """The stored winners for this device ({} when none); read once per process."""
    key = device_key(info)
    if key not in _tuned:
        path = tuning_path(info)
        try:
            data = json.loads(path.read_text())
            _tuned[key] = {k: v for k, v in data.get("matmul", {}).items() if v in BLOCKS}
        except (OSError, ValueError, AttributeError):
            _tuned[key] = {}
    return _tuned[key]


def save_tuning(info, winners: dict[str, str]) -> Path | None:
    """Merge winners into this device's tuning file and into the in-process table; returns the path, or None
    when the cache directory cannot be written (the winners then serve this process only)."""
    load_tuning(info).update(winners)
    if env.cache_problem() is not None:
        return None
    path = tuning_path(info)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.setdefault("device", {"name": info.name, "driver": f"{info.driver_name} {info.driver_info}",
                               "driver_version": info.driver_version})
    data.setdefault("matmul", {}).update(winners)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:  # a disk that filled up since the probe
        tmp.unlink(missing_ok=True)
        return None
    return path


# Register tilings pass loads round their workgroup (wx lanes) by subgroup broadcasts.
REG_LANES = max(p["wx"] for p in REG_TILINGS.values() if p.get("share"))


def reg_ok(info) -> bool:
    """Register-blocked tilings pass loads round an 8-invocation workgroup by subgroup broadcasts, so the
    workgroup must be one subgroup: every subgroup the driver may pick holds REG_LANES lanes. They load A and B
    as 64-bit words, so they also need shaderInt64."""
    return info.min_subgroup_size >= REG_LANES and info.int64


def tiled_ok(info, tiling: str) -> bool:
    """Whether the shared-memory tiling fits the device: its workgroup (up to 256 invocations) and its tiles
    against the limits, as the device contract reads them (Vulkan guarantees only 128 invocations)."""
    from helios.spirv import registry

    return selection.fits(info, registry.get("matmul_nn"), tiling)


def runnable(info, tiling: str, dtype: str = "f32") -> bool:
    """Whether this device can run `tiling` for `dtype` operands (register tilings need an 8-wide subgroup;
    addressed ones also device addresses; cooperative-matrix ones half operands and matrix units, real or
    emulated, that run them)."""
    if tiling in COOPMAT:
        return coopmat.runs(info, dtype, tiling)
    if tiling in TILED:
        return tiled_ok(info, tiling)
    return reg_ok(info) and (tiling in REG or info.buffer_device_address)


def device_tilings(info) -> tuple[str, ...]:
    """The tilings this device family runs (what the tuner and `bench matmul --variant all` try)."""
    if not (info.cpu_profile and reg_ok(info)):
        return tuple(t for t in TILED if tiled_ok(info, t)) or TILED
    return REG + ADDRESSED if info.buffer_device_address else REG


def table_choice(info, M: int, N: int, batch: int) -> str:
    """The table's tiling for an M x N (x batch) output on this device: on CPU drivers with device addresses
    the addressed register tiling for every shape."""
    if info.cpu_profile and reg_ok(info) and info.buffer_device_address:
        return ADDRESSED[0]
    family = REG if info.cpu_profile and reg_ok(info) else tuple(t for t in TILED if tiled_ok(info, t)) or TILED
    # Enough workgroups to keep every core (CPU) or a GPU's many multiprocessors busy.
    wanted = 8 if info.cpu_profile else 128
    for name in reversed(family):
        bm, bn = BLOCKS[name]
        if ceil_div(M, bm) * ceil_div(N, bn) * batch >= wanted:
            return name
    return family[0]


@selection.rule("matmul", choices=BLOCKS)
def choose(info, shape: tuple, dtype: str = "f32", forced: str | None = None) -> str:
    """The tiling for shape = (layout, M, N, K, batch) in dtype: the forced one, else the matrix units for half
    operands where the device has them, else a stored tuning winner, else the table's (a tiling the device
    cannot run for dtype gives way to the table)."""
    layout, M, N, K, batch = shape
    if forced in ADDRESSED:
        selection.check_addressed(info, "matmul", forced)
    if forced is None and coopmat.supported(info, dtype):
        return coopmat.table_choice(info, M, N, batch)
    choice = forced or load_tuning(info).get(shape_key(layout, M, N, K, batch))
    if choice is None or not runnable(info, choice, dtype):
        return table_choice(info, M, N, batch)
    return choice
