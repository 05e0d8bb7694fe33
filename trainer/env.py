"""Every environment variable the trainer reads, in one place: its debug and test hooks (HELIOS_INJECT_NAN_STEPS,
HELIOS_STEP_DELAY_S, HELIOS_CKPT_DELAY_S, HELIOS_WORK_DELAY_S), HELIOS_TORCH_THREADS, and the launcher's plumbing
(an MPI launcher's world size, HELIOS_HEARTBEAT_DIR from the --nproc launcher). helios's own are in helios/env.py."""

from __future__ import annotations

import os

from trainer.errors import ConfigError


def inject_nan_steps() -> frozenset[int]:
    """HELIOS_INJECT_NAN_STEPS=3,7: the 1-based steps whose train_step is told to see a NaN (a test hook)."""
    raw = os.environ.get("HELIOS_INJECT_NAN_STEPS", "").strip()
    if not raw:
        return frozenset()
    try:
        return frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(
            f"HELIOS_INJECT_NAN_STEPS={raw!r} is not allowed: expected comma-separated step numbers, e.g. 3,7"
        ) from None


def _seconds(name: str, example: str) -> float:
    """A test hook's non-negative seconds from environment variable `name` (0 when unset)."""
    raw = os.environ.get(name, "").strip()
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not allowed: expected seconds, e.g. {example}") from None


def step_delay_s() -> float:
    """HELIOS_STEP_DELAY_S: sleep this long after each step (a test hook that makes signal timing easy)."""
    return _seconds("HELIOS_STEP_DELAY_S", "0.2")


def ckpt_delay_s() -> float:
    """HELIOS_CKPT_DELAY_S: sleep this long between the phases of a checkpoint write (temp files written, renamed
    into place, `latest` updated) -- a test hook that opens windows for killing a trainer mid-checkpoint."""
    return _seconds("HELIOS_CKPT_DELAY_S", "0.2")


def work_delay_s() -> float:
    """HELIOS_WORK_DELAY_S: sleep this long before each eval batch and each sampled token of the evals and samples
    during training (a test hook that makes them long enough to signal in the middle of one)."""
    return _seconds("HELIOS_WORK_DELAY_S", "0.05")


def torch_threads() -> int:
    """HELIOS_TORCH_THREADS: CPU threads for the torch backend (default: every core this process may use)."""
    raw = os.environ.get("HELIOS_TORCH_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return len(os.sched_getaffinity(0))


def prefer_passive_omp() -> None:
    """Default OMP_WAIT_POLICY=PASSIVE (before torch loads OpenMP): spinning worker threads collapse throughput
    10x+ when the cores are shared with other processes, and cost little when idle."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Set by MPICH's hydra (PMI_*), Open MPI (OMPI_*) and Slurm's PMI2/PMIx.
MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
# Set by the --nproc launcher for its ranks: the directory of their heartbeat files (launcher plumbing, not a switch).
HEARTBEAT_DIR_VAR = "HELIOS_HEARTBEAT_DIR"


def mpi_world_size() -> int:
    """The number of ranks an MPI launcher started this process among, from its variables (1 outside one)."""
    for var in MPI_SIZE_VARS:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 1


def heartbeat_dir() -> str | None:
    """HELIOS_HEARTBEAT_DIR: where the --nproc launcher's watchdog reads this rank's heartbeat (None: unwatched)."""
    return os.environ.get(HEARTBEAT_DIR_VAR) or None


def check_all() -> None:
    """Validate every switch up front, so a typo fails before a run directory is touched."""
    inject_nan_steps()
    step_delay_s()
    ckpt_delay_s()
    work_delay_s()
