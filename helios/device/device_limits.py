"""Real devices' features and limits, and a clamp that makes DeviceInfo no more capable than one of them.

`HELIOS_DEVICE_LIMITS=<name or profile.json>` (or `python -m helios info --limits ...`) runs helios on the device
it has, but as if it offered only what a named device or baseline offers: every selection rule and every module
check then sees that device's shared memory, invocations, push-constant bytes, features and subgroup operations.
The table (device_limits.json beside this file) holds figures read from the Khronos Vulkan-Profiles repository's
profile files (each entry names its file); `load()` also reads any profile JSON in that standard format.

A figure a profile does not state is None: no constraint from that entry. A feature a profile does not list is
False (a device export lists every feature it has; a baseline guarantees only what it lists).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helios import env
from helios.errors import SetupError

if TYPE_CHECKING:
    from helios.device import DeviceInfo

TABLE_PATH = Path(__file__).with_name("device_limits.json")

# DeviceInfo feature -> the Vulkan feature member that grants it (members are unique across the KHR/EXT/core
# structs that carry them, e.g. shaderFloat16 in VkPhysicalDeviceVulkan12Features or ...Float16Int8FeaturesKHR).
FEATURES = {
    "timeline_semaphore": "timelineSemaphore",
    "float16": "shaderFloat16",
    "int16": "shaderInt16",
    "int64": "shaderInt64",
    "float64": "shaderFloat64",
    "storage_16bit": "storageBuffer16BitAccess",
    "storage_8bit": "storageBuffer8BitAccess",
    "vulkan_memory_model": "vulkanMemoryModel",
    "scalar_block_layout": "scalarBlockLayout",
    "synchronization2": "synchronization2",
    "maintenance4": "maintenance4",
    "subgroup_size_control": "subgroupSizeControl",
    "float_atomic_add_buffer": "shaderBufferFloat32AtomicAdd",
    "float_atomic_add_shared": "shaderSharedFloat32AtomicAdd",
}
# Limits where more is more capable: the clamp takes the smaller (elementwise for the 3-vectors).
MAX_LIMITS = {
    "max_shared_memory": "maxComputeSharedMemorySize",
    "max_workgroup_size": "maxComputeWorkGroupSize",
    "max_workgroup_invocations": "maxComputeWorkGroupInvocations",
    "max_workgroup_count": "maxComputeWorkGroupCount",
    "max_storage_buffer_range": "maxStorageBufferRange",
    "max_push_constants_size": "maxPushConstantsSize",
    "max_memory_allocation_size": "maxMemoryAllocationSize",
    "max_per_stage_storage_buffers": "maxPerStageDescriptorStorageBuffers",
    "max_per_stage_resources": "maxPerStageResources",
    "max_set_storage_buffers": "maxDescriptorSetStorageBuffers",
    "max_push_descriptors": "maxPushDescriptors",
}
# Limits where less is more capable: the clamp takes the larger.
ALIGNMENTS = {"min_storage_buffer_offset_alignment": "minStorageBufferOffsetAlignment"}
SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad")
SUBGROUP_MODES = ("device", "entry")
_VENDOR_SUFFIXES = ("NV", "NVX", "AMD", "INTEL", "ARM", "QCOM", "HUAWEI", "VALVE", "MESA", "SEC", "MSFT", "IMG")


@dataclass(frozen=True)
class DeviceLimits:
    """What one real device or baseline offers, as far as DeviceInfo is concerned (None: not stated)."""

    name: str
    source: str  # the Vulkan-Profiles file (and profile) the figures come from, or the path given to load()
    note: str = ""
    api_version: str | None = None
    timeline_semaphore: bool | None = None
    float16: bool | None = None
    int16: bool | None = None
    int64: bool | None = None
    float64: bool | None = None
    storage_16bit: bool | None = None
    storage_8bit: bool | None = None
    vulkan_memory_model: bool | None = None
    scalar_block_layout: bool | None = None
    synchronization2: bool | None = None
    maintenance4: bool | None = None
    subgroup_size_control: bool | None = None
    float_atomic_add_buffer: bool | None = None
    float_atomic_add_shared: bool | None = None
    push_descriptor: bool | None = None
    buffer_device_address: bool | None = None  # bufferDeviceAddress and shaderInt64, as helios uses it
    cooperative_matrix: bool | None = None  # VK_KHR_cooperative_matrix (profiles do not list its shapes)
    subgroup_size: int | None = None
    min_subgroup_size: int | None = None
    max_subgroup_size: int | None = None
    subgroup_ops: tuple[str, ...] | None = None
    max_shared_memory: int | None = None
    max_workgroup_size: tuple[int, int, int] | None = None
    max_workgroup_invocations: int | None = None
    max_workgroup_count: tuple[int, int, int] | None = None
    max_storage_buffer_range: int | None = None
    max_push_constants_size: int | None = None
    max_memory_allocation_size: int | None = None
    max_per_stage_storage_buffers: int | None = None
    max_per_stage_resources: int | None = None
    max_set_storage_buffers: int | None = None
    max_push_descriptors: int | None = None  # stated only where VK_KHR_push_descriptor is
    min_storage_buffer_offset_alignment: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


_FIELDS = {f.name for f in dataclasses.fields(DeviceLimits)}
_TUPLES = ("subgroup_ops", "max_workgroup_size", "max_workgroup_count")


def _from_dict(name: str, data: dict[str, Any], where: str) -> DeviceLimits:
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise SetupError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_FIELDS))}")
    values = {k: tuple(v) if k in _TUPLES and v is not None else v for k, v in data.items()}
    return DeviceLimits(**{"name": name, **values})


def table() -> dict[str, DeviceLimits]:
    """Every built-in entry, by name, in the order of device_limits.json."""
    raw = json.loads(TABLE_PATH.read_text())
    return {name: _from_dict(name, entry, f"{TABLE_PATH.name} entry {name!r}") for name, entry in raw.items()}


def names() -> list[str]:
    return list(table())


# -- the Khronos profile format -----------------------------------------------------------------------
def _merge(into: dict, block: dict) -> None:
    """Later blocks add requirements to earlier ones: nested dicts merge, other values are replaced."""
    for key, value in block.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _flatten(structs: dict, where: str) -> dict[str, Any]:
    """Every member of every core/KHR/EXT struct in one dict (VkPhysicalDeviceProperties' limits included)."""
    flat: dict[str, Any] = {}
    for struct, members in structs.items():
        if struct.endswith(_VENDOR_SUFFIXES):
            continue  # e.g. VkPhysicalDeviceCooperativeMatrixFeaturesNV shares member names with the KHR struct
        if not isinstance(members, dict):
            raise SetupError(f"{where}: {struct} should be an object of members, not {type(members).__name__}")
        for key, value in members.items():
            if key in ("limits", "properties", "features") and isinstance(value, dict):
                flat.update(_flatten({key: value}, where))
            elif isinstance(flat.get(key), bool) and isinstance(value, bool):
                flat[key] = flat[key] or value
            else:
                flat[key] = value
    return flat


def _select_profile(doc: dict, wanted: str | None, where: str) -> tuple[str, dict]:
    profiles = doc.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise SetupError(f"{where}: no 'profiles' object; expected a Khronos Vulkan profile JSON file")
    if wanted is None:
        if len(profiles) > 1:
            raise SetupError(f"{where} holds several profiles; name one as FILE.json#PROFILE: "
                             + ", ".join(profiles))
        wanted = next(iter(profiles))
    if wanted not in profiles:
        raise SetupError(f"{where}: no profile {wanted!r}; it holds " + ", ".join(profiles))
    return wanted, profiles[wanted]


def parse_profile(doc: Any, where: str, wanted: str | None = None) -> dict[str, Any]:
    """The DeviceLimits figures one profile of a Khronos profile document states (absent ones left out)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("capabilities"), dict):
        raise SetupError(f"{where}: no 'capabilities' object; expected a Khronos Vulkan profile JSON file")
    pname, profile = _select_profile(doc, wanted, where)
    merged: dict[str, Any] = {}
    for block in profile.get("capabilities", []):
        if not isinstance(block, str):
            raise SetupError(f"{where}: profile {pname} lists alternative capability blocks {block}; helios reads "
                             "only profiles whose capabilities are plain block names")
        if block not in doc["capabilities"]:
            raise SetupError(f"{where}: profile {pname} names a capability block {block!r} the file lacks")
        _merge(merged, doc["capabilities"][block])
    features = _flatten(merged.get("features", {}), where)
    props = _flatten(merged.get("properties", {}), where)
    extensions = set(merged.get("extensions", {}))
    out: dict[str, Any] = {"api_version": profile.get("api-version")}
    for field_name, member in FEATURES.items():
        out[field_name] = bool(features.get(member, False))
    out["push_descriptor"] = "VK_KHR_push_descriptor" in extensions or bool(features.get("pushDescriptor"))
    out["buffer_device_address"] = bool(features.get("bufferDeviceAddress")) and out["int64"]
    out["cooperative_matrix"] = bool(features.get("cooperativeMatrix")) and (
        not extensions or "VK_KHR_cooperative_matrix" in extensions)
    for field_name, member in {**MAX_LIMITS, **ALIGNMENTS}.items():
        value = props.get(member)
        if value is not None:
            if not (isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value))):
                raise SetupError(f"{where}: {member} should be a number (or 3 numbers), not {value!r}")
            out[field_name] = tuple(value) if isinstance(value, list) else value
    for field_name, member in (("subgroup_size", "subgroupSize"), ("min_subgroup_size", "minSubgroupSize"),
                               ("max_subgroup_size", "maxSubgroupSize")):
        if isinstance(props.get(member), int) and props[member] > 0:
            out[field_name] = props[member]
    if out.get("min_subgroup_size", 0) > out.get("max_subgroup_size", 1 << 31):
        # A baseline bounds the two (min at most X, max at least Y); that is no device's range: left out.
        del out["min_subgroup_size"], out["max_subgroup_size"]
    ops = props.get("supportedOperations", props.get("subgroupSupportedOperations"))
    if ops is not None:
        bits = {f"VK_SUBGROUP_FEATURE_{op.upper()}_BIT": op for op in SUBGROUP_OPS}
        if not isinstance(ops, list) or not set(ops) & set(bits):
            raise SetupError(f"{where}: subgroup supportedOperations {ops!r} names no known operation")
        out["subgroup_ops"] = tuple(op for bit, op in bits.items() if bit in ops)
    return {k: v for k, v in out.items() if v is not None}


def load(name_or_path: str) -> DeviceLimits:
    """A built-in entry by name, or a Khronos profile JSON file (`FILE.json`, or `FILE.json#PROFILE` when the
    file holds several profiles)."""
    entries = table()
    if name_or_path in entries:
        return entries[name_or_path]
    path_text, _, wanted = name_or_path.partition("#")
    known = f"known names: {', '.join(entries)}"
    path = Path(path_text)
    if not path_text.endswith(".json") and not path.exists():
        raise SetupError(f"device limits {name_or_path!r}: not a known name nor a profile .json file; {known}")
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise SetupError(f"device limits file {path_text}: cannot read it ({exc.strerror or exc}); {known}") from None
    except json.JSONDecodeError as exc:
        raise SetupError(f"device limits file {path_text}: not valid JSON ({exc}); {known}") from None
    try:
        figures = parse_profile(doc, f"device limits file {path_text}", wanted or None)
    except SetupError as exc:
        raise SetupError(f"{exc}; {known}") from None
    return DeviceLimits(name=name_or_path, source=str(path), **figures)


# -- the clamp -----------------------------------------------------------------------------------------
def clamp(info: DeviceInfo, limits: DeviceLimits, subgroups: str = "device") -> DeviceInfo:
    """info as if the device offered no more than `limits`: features ANDed, max limits lowered, alignment raised,
    subgroup operations intersected. subgroups="device" keeps the running device's subgroup sizes (what kernels
    really execute); "entry" takes the entry's, for selection-only checks of devices lavapipe cannot imitate."""
    if subgroups not in SUBGROUP_MODES:
        raise ValueError(f"subgroups={subgroups!r}: expected one of {', '.join(SUBGROUP_MODES)}")
    changes: dict[str, Any] = {"limits_from": limits.name}
    for field_name in (*FEATURES, "push_descriptor", "buffer_device_address"):
        if getattr(limits, field_name) is False:
            changes[field_name] = False
    if limits.int64 is False:  # helios's device addresses are 64-bit integers in the shader
        changes["buffer_device_address"] = False
    for field_name in MAX_LIMITS:
        mine, theirs = getattr(info, field_name), getattr(limits, field_name)
        if theirs is not None:
            changes[field_name] = (tuple(min(a, b) for a, b in zip(mine, theirs)) if isinstance(mine, tuple)
                                   else min(mine, theirs))
    for field_name in ALIGNMENTS:
        if getattr(limits, field_name) is not None:
            changes[field_name] = max(getattr(info, field_name), getattr(limits, field_name))
    if limits.subgroup_ops is not None:
        changes["subgroup_ops"] = tuple(op for op in info.subgroup_ops if op in limits.subgroup_ops)
    if limits.cooperative_matrix is False:  # no matrix units there: neither real nor emulated shapes
        changes.update(cooperative_matrix=(), cooperative_matrix_emulated=False)
    if subgroups == "entry" and limits.subgroup_size is not None:
        size = limits.subgroup_size
        changes.update(subgroup_size=size, min_subgroup_size=limits.min_subgroup_size or size,
                       max_subgroup_size=limits.max_subgroup_size or size)
    return dataclasses.replace(info, **changes)


def refusal(info: DeviceInfo) -> str | None:
    """Why helios cannot run on the device info is clamped to (None: it can). Timeline semaphores are the one
    feature helios cannot do without; the rest are refused module by module (helios.runtime.contract)."""
    if info.limits_from and not info.timeline_semaphore:
        return (f"clamped to {info.limits_from}, which has no timeline semaphores (Vulkan 1.2): helios needs them to "
                "track GPU work, so it refuses to run there")
    return None


def apply(info: DeviceInfo) -> DeviceInfo:
    """info clamped to HELIOS_DEVICE_LIMITS (unchanged when unset); SetupError where helios would refuse there."""
    choice = env.device_limits()
    if choice is None:
        return info
    clamped = clamp(info, load(choice))
    reason = refusal(clamped)
    if reason is not None:
        raise SetupError(f"HELIOS_DEVICE_LIMITS={choice}: {reason}")
    return clamped


__all__ = ["ALIGNMENTS", "FEATURES", "MAX_LIMITS", "DeviceLimits", "apply", "clamp", "load", "names", "parse_profile",
           "refusal", "table"]
