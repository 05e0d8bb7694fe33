"""Which matmul variant runs: the matrix units for half operands, else stored auto-tuning winners, else a table.

bf16 and fp16 matmuls go to the matrix units where the device offers them for that dtype
(matmul_coopmat.supported): the native cooperative-matrix tilings on real matrix units, the `_emulated` ones
only where DeviceInfo.cooperative_matrix_emulated (the GPU profile, HELIOS_COOPMAT=emulate), never silently
in production. Otherwise, the table: on CPU devices (lavapipe) register-blocked tilings, on GPUs
shared-memory tiled ones; within each, the largest block that still gives enough workgroups to fill the
device. `python -m helios.bench tune matmul` times the candidates for given shapes and stores the winners in
`helios.env.cache_dir()/tuning-<device key>.json` (helios.kernels.contract.tuning's store); the rule uses
a stored winner for the exact (layout, M, N, K, batch) when there is one. It is
helios.kernels.contract.selection's "matmul" rule: tests, benchmarks and the tuner force a tiling with
`selection.force("matmul", tiling)` (`"cm64_emulated"` too); a forced tiling this device cannot run for the
launch's dtype (a cooperative-matrix one for f32, a native one without matrix units) gives way to the table, as
a register tiling does where subgroups are too narrow or 64-bit integers are missing, and a shared-memory tiling
where its workgroup or tiles exceed the device's limits.
"""

from __future__ import annotations

from pathlib import Path

from helios.kernels.contract import selection
from helios.kernels.contract.tuning import STORE, TuningStore
from helios.kernels.matmul import coopmat
from helios.kernels.matmul.reg import REG_BLOCKS, REG_TILINGS
from helios.kernels.matmul.tiled import TILED_BLOCKS
from helios.spirv import ceil_div

REG = tuple(t for t, p in REG_TILINGS.items() if not p.get("addressed"))  # reg8x8, reg16x16, reg32x16
TILED = tuple(TILED_BLOCKS)  # tiled32, tiled64, tiled128
ADDRESSED = tuple(t for t, p in REG_TILINGS.items() if p.get("addressed"))  # read A and B through device addresses
# The addressed tiling the table gives outputs of 16 rows or more: 1.3-1.5x reg12x8a on lavapipe 25 (same sums bit for
# bit: every register tiling adds the k's of an element in the same order).
ADDRESSED_BIG = "reg32x8ak"
COOPMAT = coopmat.CHOICES  # bf16/fp16 only: cm64, cm128, each also `_emulated`
# (rows, columns) of C per workgroup, as each tiling declares it (reg.reg_block, tiled.tiled_block; a
# cooperative-matrix tiling's blocks are bm x bn like a tiled one's).
BLOCKS = {**REG_BLOCKS, **TILED_BLOCKS, **{t: (coopmat.params(t)["bm"], coopmat.params(t)["bn"]) for t in COOPMAT}}


def tuning_path(info) -> Path:
    """The file this device's tuning winners are stored in (helios.kernels.contract.tuning)."""
    return STORE.path(info)


def shape_key(layout: str, M: int, N: int, K: int, batch: int = 1) -> str:
    """The key a tuning winner is stored under: `nn:2048x1152x384` (with `x<batch>` when batched)."""
    key = f"{layout}:{M}x{N}x{K}"
    return key if batch == 1 else f"{key}x{batch}"


def load_tuning(info, store: TuningStore = STORE) -> dict[str, str]:
    """The stored matmul winners for this device ({} when none); read once per process."""
    return store.winners(info, "matmul", BLOCKS)


def save_tuning(info, winners: dict[str, str], store: TuningStore = STORE) -> Path | None:
    """Merge matmul winners into this device's tuning file and into the in-process table; returns the path,
    or None when the cache directory cannot be written (the winners then serve this process only)."""
    return store.save(info, "matmul", winners)


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
    the k-inner addressed tiling, or the smaller addressed block for outputs under 16 rows (a 32-row block would
    mostly compute rows that are never stored)."""
    if info.cpu_profile and reg_ok(info) and info.buffer_device_address:
        return ADDRESSED_BIG if M >= 16 else ADDRESSED[0]
    family = REG if info.cpu_profile and reg_ok(info) else tuple(t for t in TILED if tiled_ok(info, t)) or TILED
    # Enough workgroups to keep every core (CPU) or a GPU's many multiprocessors busy.
    wanted = 8 if info.cpu_profile else 128
    for name in reversed(family):
        bm, bn = BLOCKS[name]
        if ceil_div(M, bm) * ceil_div(N, bn) * batch >= wanted:
            return name
    return family[0]


# Tests force every tiling. CI runs again at subgroup sizes 4 and 16 the register tilings that pass loads round
# their workgroup by subgroup broadcasts (the smallest: as many loads as lanes, and lavapipe's own: 12 rows dealt
# round 8 lanes, and 32 with the k-inner sums; at 4 lanes the rule gives tiled ones instead), in f32. The emulated
# matrix units' lanes are test_matmul_coopmat.py's marked cases (every layout and dtype, both tilings).
# The dtypes the op-spec tests run each tiling in. A half dtype changes only the loads and stores, which every
# register tiling shares (matmul_reg) and every shared-memory one shares (matmul_tiled): half runs the smallest of
# each, lavapipe's own (reg12x8a, and reg32x8ak, which also stores C through its address) and the matrix units'
# (emulated here; native on a GPU); f32 runs every register and tiled tiling, never a cm one.
_HALF_TILINGS = ("reg8x8", "reg12x8a", "reg32x8ak", "tiled32", *COOPMAT)
TESTED_DTYPES = {t: (("bf16", "fp16") if t in COOPMAT else ("f32", "bf16", "fp16") if t in _HALF_TILINGS else ("f32",))
                 for t in BLOCKS}


@selection.rule("matmul", choices=BLOCKS, forced_dtypes=TESTED_DTYPES,
                subgroup=tuple(selection.Subgroup(t) for t in ("reg8x8", "reg12x8a", "reg32x8ak")))
def choose(info, shape: tuple, dtype: str = "f32", forced: str | None = None) -> str:
    """The tiling for shape = (layout, M, N, K, batch) in dtype: the forced one, else the matrix units for half
    operands where the device has them, else a stored tuning winner, else the table's (a tiling the device
    cannot run for dtype gives way to the table)."""
    layout, M, N, K, batch = shape
    if forced in ADDRESSED:
        selection.check_addressed(info, "matmul", forced)
    if forced is None and coopmat.supported(info, dtype):
        return coopmat.table_choice(info, M, N, batch)
    choice = forced or STORE.winner(info, "matmul", shape_key(layout, M, N, K, batch), BLOCKS)
    if choice is None or not runnable(info, choice, dtype):
        return table_choice(info, M, N, batch)
    return choice
