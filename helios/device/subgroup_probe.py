"""The subgroup size kernels really execute, measured by one tiny dispatch and checked against what the device reports.

Every subgroup kernel takes its size from the SubgroupSize builtin, and the selection rules from DeviceInfo. A
driver that runs another size than it reports (lavapipe at LP_NATIVE_VECTOR_WIDTH 1024 / 2048 reports 32 / 64
and runs 16-lane subgroups) or a driver shader cache that serves a binary compiled at another size would make
them compute garbage without a sign. So once per process, before the first kernel, a probe kernel records per
invocation the SubgroupSize builtin, NumSubgroups, SubgroupId, its lane and `subgroup_add(1)`; a disagreement
is refused with a SetupError naming both sizes, the likely cause and the fix. The probe dispatches in every
process (a cached binary is only caught by running it); its result is also written, under the pipeline cache's
key, to `helios.env.cache_dir()/subgroups/<key>.json` for `python -m helios info` and for telling a stale
driver cache (this key ran honestly before) from a driver that misreports.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helios import env
from helios.device import driver
from helios.errors import SetupError
from helios.spirv import Kernel, KernelBuilder, Variant, u32

FIELDS = ("builtin_size", "num_subgroups", "subgroup_id", "lane", "lanes_added")
# Enough invocations for several subgroups of any size devices run (4 to 64), and within the 128 that every
# Vulkan device must allow in one workgroup.
PROBE_INVOCATIONS = 128


def build_probe(b: KernelBuilder, v: Variant) -> None:
    """out[i * 5 + k]: what invocation i sees of its subgroup (FIELDS[k]); lanes_added is a subgroup_add of 1
    (0 in the "basic" variant, for a device without subgroup arithmetic, where only SubgroupId counts lanes)."""
    b.local_size(v.invocations)
    out = b.buffer(0, u32, "w")
    at = b.local_index() * len(FIELDS)
    out[at] = b.subgroup_size()
    out[at + 1] = b.num_subgroups()
    out[at + 2] = b.subgroup_id()
    out[at + 3] = b.subgroup_local_id()
    out[at + 4] = b.subgroup_add(b.const(1, u32)) if v.arithmetic else b.const(0, u32)


PROBE = Kernel("subgroup_probe", build_probe, register=False, variants={
    "arithmetic": {"invocations": PROBE_INVOCATIONS, "arithmetic": True},
    "basic": {"invocations": PROBE_INVOCATIONS, "arithmetic": False}})


@dataclass(frozen=True)
class SubgroupMeasurement:
    """What the device reports and what one workgroup of the probe executed."""

    reported: int  # DeviceInfo.subgroup_size
    min_reported: int
    max_reported: int
    builtin: int  # the SubgroupSize builtin kernels read (the largest value seen)
    executed: int  # lanes that one subgroup_add combines (the largest subgroup of the workgroup)
    members: int  # the most invocations sharing one SubgroupId
    lanes: int  # 1 + the largest SubgroupLocalInvocationId
    num_subgroups: int  # the NumSubgroups builtin
    subgroup_ids: int  # distinct SubgroupId values
    invocations: int

    @property
    def consistent(self) -> bool:
        """Whether kernels that trust the builtin and DeviceInfo compute right: the builtin, the lane ids and the
        subgroup count all match the executed size, which is the reported one. Exactly that one even on a device
        that varies its size (min < max): helios's SPIR-V 1.5 pipelines, created without
        ALLOW_VARYING_SUBGROUP_SIZE, must run at subgroupSize, and the selection rules read it."""
        if self.subgroup_ids != self.num_subgroups:
            return False
        if not self.builtin == self.lanes == self.members == self.executed:
            return False
        return self.num_subgroups == -(-self.invocations // self.executed) and self.executed == self.reported


def interpret(rows: np.ndarray, info) -> SubgroupMeasurement:
    """The measurement from the probe's output, one row of FIELDS per invocation."""
    builtin, count, ids, lanes, added = (rows[:, k] for k in range(len(FIELDS)))
    # Subgroups are told apart by SubgroupId: the executed size is the most invocations sharing one id, and,
    # where the probe could add, what subgroup_add combined must be the same.
    distinct, population = np.unique(ids, return_counts=True)
    members = int(population.max())
    return SubgroupMeasurement(
        reported=info.subgroup_size, min_reported=info.min_subgroup_size, max_reported=info.max_subgroup_size,
        builtin=int(builtin.max()), executed=int(added.max()) if added.any() else members, members=members,
        lanes=int(lanes.max()) + 1, num_subgroups=int(count.max()), subgroup_ids=len(distinct),
        invocations=len(rows))


def record_path(key: str) -> Path:
    return env.cache_dir() / "subgroups" / f"{key}.json"


def _earlier(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _record(path: Path, measurement: SubgroupMeasurement) -> None:
    """Write the measurement atomically; an unwritable cache directory only loses the record."""
    if env.cache_problem() is not None:
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({**asdict(measurement), "consistent": measurement.consistent, "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError:  # e.g. the disk filled up: no half-written temp file stays behind
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def refusal(info, measurement: SubgroupMeasurement, earlier: dict | None) -> str:
    """The one-line SetupError message for a device whose kernels run another subgroup size than it reports."""
    builtin = (f" (its SubgroupSize builtin says {measurement.builtin})"
               if measurement.builtin not in (measurement.reported, measurement.executed) else "")
    head = (f"the device '{info.name}' reports subgroup size {measurement.reported}{builtin} but a probe kernel "
            f"executed {measurement.executed}-lane subgroups, so every subgroup kernel would compute wrong results")
    bits = driver.lavapipe_vector_width(info)
    if earlier and earlier.get("consistent") and (bits is None or bits <= driver.HONEST_LAVAPIPE_WIDTH):
        # This exact device, driver and width ran honestly before: what changed is a cached binary.
        head += f" (it executed {earlier.get('executed')} here before)"
    return f"{head}; {driver.subgroup_mismatch_advice(info)}"


_verified: dict[str, SubgroupMeasurement] = {}


def verify(device, key: str, measure: Callable[[Any], SubgroupMeasurement]) -> SubgroupMeasurement:
    """Measure (once per process and device key: the pipeline cache's, helios.runtime.pipelines.cache_key) with
    `measure` (the runtime's probe dispatch, helios.runtime.context.measure_subgroups) and refuse a device whose
    executed subgroup size differs from the reported one with a one-line SetupError; returns the measurement."""
    measurement = _verified.get(key)
    if measurement is None:
        measurement = measure(device)
        path = record_path(key)
        if not measurement.consistent:
            raise SetupError(refusal(device.info, measurement, _earlier(path)))
        _record(path, measurement)  # only honest runs: a later mismatch under this key then points at a cache
        _verified[key] = measurement
    return measurement


__all__ = ["FIELDS", "PROBE", "PROBE_INVOCATIONS", "SubgroupMeasurement", "interpret", "record_path", "refusal",
           "verify"]
