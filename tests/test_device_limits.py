"""helios.device.device_limits: the table of real devices loads, a profile JSON parses, and a clamp only ever
removes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helios.device import device_limits as dl
from helios.errors import SetupError
from tests.conftest import run_python

PROFILES = Path(__file__).parent / "profiles"
RTX4070_FILE = PROFILES / "vp_gpuinfo_nvidia_geforce_rtx_4070_551_61_0_0_windows_11.trimmed.json"
REQUIRED = ("amd-rx7800xt-radv", "intel-arc-a770", "apple-m1-moltenvk", "nvidia-rtx4070", "nvidia-gtx1060",
            "intel-uhd620", "android-baseline-2022", "vulkan-minimum", "desktop-baseline-2023")
FEATURE_FIELDS = (*dl.FEATURES, "push_descriptor", "buffer_device_address", "cooperative_matrix_emulated")
F16 = (16, 16, 16, "f16", "f16", "f32", "f32")


def only_removes(before, after, subgroups: str = "device") -> list[str]:
    """What `after` offers that `before` did not (the oracle of the property tests; [] when nothing)."""
    gained = [f for f in FEATURE_FIELDS if getattr(after, f) and not getattr(before, f)]
    for f in dl.MAX_LIMITS:
        a, b = getattr(after, f), getattr(before, f)
        if any(x > y for x, y in zip(a, b)) if isinstance(a, tuple) else a > b:
            gained.append(f)
    gained += [f for f in dl.ALIGNMENTS if getattr(after, f) < getattr(before, f)]
    gained += [f"subgroup op {op}" for op in after.subgroup_ops if op not in before.subgroup_ops]
    gained += [f"matrix shape {s}" for s in after.cooperative_matrix if s not in before.cooperative_matrix]
    sizes = ("subgroup_size", "min_subgroup_size", "max_subgroup_size")
    untouched = {f.name for f in dataclasses.fields(before)} - set(FEATURE_FIELDS) - set(dl.MAX_LIMITS) - set(
        dl.ALIGNMENTS) - {"subgroup_ops", "cooperative_matrix", "limits_from"} - (
        set(sizes) if subgroups == "entry" else set())
    gained += [f"{f} changed" for f in sorted(untouched) if getattr(after, f) != getattr(before, f)]
    return gained


@pytest.fixture(scope="module")
def generous(device):
    """The running device's info with every feature, huge limits and native matrix units: the clamp's figures
    then come from the entry alone."""
    features = {f: True for f in (*dl.FEATURES, "push_descriptor", "buffer_device_address")}
    return dataclasses.replace(
        device.info, **features, subgroup_ops=dl.SUBGROUP_OPS, cooperative_matrix=(F16,),
        cooperative_matrix_emulated=False, max_shared_memory=1 << 20, max_workgroup_size=(1 << 16,) * 3,
        max_workgroup_invocations=1 << 16, max_workgroup_count=(1 << 31,) * 3, max_storage_buffer_range=1 << 40,
        max_push_constants_size=1 << 12, max_memory_allocation_size=1 << 40, min_storage_buffer_offset_alignment=1,
        max_per_stage_storage_buffers=1 << 32, max_per_stage_resources=1 << 32, max_set_storage_buffers=1 << 32,
        max_push_descriptors=1 << 10)


def test_the_table_covers_the_devices_it_must_and_names_each_source():
    table = dl.table()
    assert set(REQUIRED) <= set(table) and len(table) >= 8
    for name in table:
        entry = dl.load(name)
        assert entry.name == name and entry.source.startswith("KhronosGroup/Vulkan-Profiles profiles/"), entry
        assert entry.source.split("#")[0].endswith(".json")
        assert entry.max_shared_memory and entry.max_workgroup_invocations and entry.max_push_constants_size
        assert entry.min_storage_buffer_offset_alignment and entry.max_storage_buffer_range
        assert entry.max_per_stage_storage_buffers and entry.max_per_stage_resources and entry.max_set_storage_buffers
        assert (entry.max_push_descriptors is not None) == entry.push_descriptor, name  # stated with the extension
    assert {e.subgroup_size for e in table.values()} >= {32, 64}


def test_vulkan_minimum_is_the_spec_required_limits():
    m = dl.load("vulkan-minimum")
    assert (m.max_shared_memory, m.max_workgroup_invocations, m.max_workgroup_size) == (16384, 128, (128, 128, 64))
    assert (m.max_push_constants_size, m.max_storage_buffer_range) == (128, 2**27)
    assert m.min_storage_buffer_offset_alignment == 256 and m.max_workgroup_count == (65535,) * 3
    assert not (m.int64 or m.int16 or m.float16 or m.storage_16bit or m.float64 or m.buffer_device_address)
    assert m.subgroup_size == 1 and m.subgroup_ops == ("basic",)
    assert (m.max_per_stage_storage_buffers, m.max_per_stage_resources, m.max_set_storage_buffers) == (4, 128, 24)
    assert m.timeline_semaphore  # required since Vulkan 1.2


def test_some_known_figures():
    t = dl.table()
    assert (t["amd-rx7800xt-radv"].subgroup_size, t["amd-rx7800xt-radv"].min_subgroup_size) == (64, 32)
    assert t["nvidia-gtx1060"].float16 is False and t["nvidia-rtx4070"].float16 is True
    assert t["nvidia-rtx4070"].cooperative_matrix and not t["apple-m1-moltenvk"].cooperative_matrix
    assert t["apple-m1-moltenvk"].vulkan_memory_model is False and t["intel-arc-a770"].float64 is False
    assert t["android-baseline-2022"].subgroup_size is None  # the profile states none: no constraint
    assert t["android-baseline-2022"].max_memory_allocation_size is None
    m1 = t["apple-m1-moltenvk"]  # Metal's 31 buffer slots per stage
    assert (m1.max_per_stage_storage_buffers, m1.max_set_storage_buffers, m1.max_push_descriptors) == (31, 155, 159)
    rtx = t["nvidia-rtx4070"]
    assert (rtx.max_per_stage_storage_buffers, rtx.max_push_descriptors) == (1 << 20, 32)
    assert t["android-baseline-2022"].max_per_stage_storage_buffers == 4


@pytest.mark.parametrize("name", dl.names())
@pytest.mark.parametrize("subgroups", dl.SUBGROUP_MODES)
def test_clamp_only_removes(device, generous, name, subgroups):
    limits = dl.load(name)
    for before in (device.info, generous):
        after = dl.clamp(before, limits, subgroups)
        assert only_removes(before, after, subgroups) == [], name
        assert after.limits_from == name
        assert dl.clamp(after, limits, subgroups) == after  # clamping twice changes nothing
        if subgroups == "device":
            assert (after.subgroup_size, after.min_subgroup_size, after.max_subgroup_size) == (
                before.subgroup_size, before.min_subgroup_size, before.max_subgroup_size)
    # Against the generous info every stated figure is the entry's own.
    after = dl.clamp(generous, limits, subgroups)
    for f in (*dl.MAX_LIMITS, *dl.ALIGNMENTS, *dl.FEATURES):
        if getattr(limits, f) is not None:
            assert getattr(after, f) == getattr(limits, f), f
    if limits.subgroup_ops is not None:
        assert after.subgroup_ops == limits.subgroup_ops
    assert after.cooperative_matrix == ((F16,) if limits.cooperative_matrix else ())


def test_the_oracle_catches_a_widening(device):
    """Negative control: only_removes must flag a clamp that adds anything."""
    info = device.info
    assert only_removes(info, dataclasses.replace(info, max_shared_memory=info.max_shared_memory + 1))
    assert only_removes(info, dataclasses.replace(info, min_storage_buffer_offset_alignment=1)) or \
        info.min_storage_buffer_offset_alignment == 1
    assert only_removes(info, dataclasses.replace(info, cooperative_matrix=(F16,))) or info.cooperative_matrix
    assert only_removes(info, dataclasses.replace(info, name="other"))


def test_matrix_units_and_device_addresses(generous):
    emulated = dataclasses.replace(generous, cooperative_matrix=(F16,), cooperative_matrix_emulated=True)
    kept = dl.clamp(emulated, dl.load("nvidia-rtx4070"))
    assert kept.cooperative_matrix == (F16,) and kept.cooperative_matrix_emulated
    dropped = dl.clamp(emulated, dl.load("apple-m1-moltenvk"))
    assert dropped.cooperative_matrix == () and not dropped.cooperative_matrix_emulated
    assert dl.clamp(generous, dl.load("nvidia-gtx1060")).cooperative_matrix == ()
    assert not dl.clamp(generous, dl.load("vulkan-minimum")).buffer_device_address  # no shaderInt64 there


def test_entry_subgroup_sizes(generous):
    amd = dl.clamp(generous, dl.load("amd-rx7800xt-radv"), subgroups="entry")
    assert (amd.subgroup_size, amd.min_subgroup_size, amd.max_subgroup_size) == (64, 32, 64)
    nv = dl.clamp(generous, dl.load("nvidia-rtx4070"), subgroups="entry")
    assert (nv.subgroup_size, nv.min_subgroup_size, nv.max_subgroup_size) == (32, 32, 32)
    android = dl.clamp(generous, dl.load("android-baseline-2022"), subgroups="entry")
    assert android.subgroup_size == generous.subgroup_size  # not stated there: the device's own
    with pytest.raises(ValueError, match="subgroups"):
        dl.clamp(generous, dl.load("nvidia-rtx4070"), subgroups="widest")


def test_a_real_profile_file_parses_to_the_table_entry():
    """The trimmed gpuinfo export of the RTX 4070 (the real file's structs, unchanged) gives the table's figures."""
    parsed = dl.load(str(RTX4070_FILE))
    assert parsed.name == str(RTX4070_FILE) and parsed.source == str(RTX4070_FILE)
    entry = dl.load("nvidia-rtx4070")
    same = {f.name for f in dataclasses.fields(dl.DeviceLimits)} - {"name", "source", "note"}
    assert {f: getattr(parsed, f) for f in same} == {f: getattr(entry, f) for f in same}
    assert parsed.max_shared_memory == 49152 and parsed.subgroup_size == 32 and parsed.cooperative_matrix


def _profile_doc(**limits) -> dict:
    block = {"features": {"VkPhysicalDeviceFeatures": {"shaderInt64": True},
                          "VkPhysicalDeviceVulkan12Features": {"timelineSemaphore": True}},
             "properties": {"VkPhysicalDeviceProperties": {"limits": {"maxComputeSharedMemorySize": 32768,
                                                                      **limits}}}}
    extra = {"properties": {"VkPhysicalDeviceSubgroupProperties": {
        "subgroupSize": 16, "supportedOperations": ["VK_SUBGROUP_FEATURE_BASIC_BIT", "VK_SUBGROUP_FEATURE_VOTE_BIT"]}}}
    return {"capabilities": {"base": block, "subgroups": extra},
            "profiles": {"VP_TEST_small": {"api-version": "1.3.0", "capabilities": ["base"]},
                         "VP_TEST_more": {"api-version": "1.3.0", "capabilities": ["base", "subgroups"]}}}


def test_profile_files_with_several_profiles_and_blocks(tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(_profile_doc()))
    with pytest.raises(SetupError, match="several profiles.*VP_TEST_small, VP_TEST_more"):
        dl.load(str(path))
    small = dl.load(f"{path}#VP_TEST_small")
    assert small.int64 and small.timeline_semaphore and small.float16 is False  # not listed: not offered
    assert small.max_shared_memory == 32768 and small.max_workgroup_invocations is None  # not stated: None
    assert small.subgroup_size is None and small.subgroup_ops is None
    more = dl.load(f"{path}#VP_TEST_more")
    assert more.subgroup_size == 16 and more.subgroup_ops == ("basic", "vote")
    with pytest.raises(SetupError, match="no profile 'VP_NONE'"):
        dl.load(f"{path}#VP_NONE")


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ("[]", "no 'capabilities' object"),
    (json.dumps({"capabilities": {}, "profiles": {}}), "no 'profiles' object"),
    (json.dumps({**_profile_doc(maxComputeWorkGroupInvocations="lots"), "profiles": {"P": {"capabilities": ["base"]}}}),
     "maxComputeWorkGroupInvocations should be"),
    (json.dumps({**_profile_doc(), "profiles": {"P": {"capabilities": [["base", "subgroups"]]}}}), "alternative"),
    (json.dumps({**_profile_doc(), "profiles": {"P": {"capabilities": ["gone"]}}}), "block 'gone'"),
])
def test_a_malformed_file_is_a_setup_error_naming_the_problem(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SetupError, match=problem) as caught:
        dl.load(str(path))
    assert "known names: amd-rx7800xt-radv" in str(caught.value)


def test_an_unknown_name_or_missing_file_lists_the_known_names(tmp_path):
    for bad in ("nvidia-rtx9999", str(tmp_path / "missing.json")):
        with pytest.raises(SetupError) as caught:
            dl.load(bad)
        assert bad in str(caught.value) and all(n in str(caught.value) for n in dl.names())


def test_env_reader(monkeypatch):
    from helios import env

    monkeypatch.delenv("HELIOS_DEVICE_LIMITS", raising=False)
    assert env.device_limits() is None
    monkeypatch.setenv("HELIOS_DEVICE_LIMITS", " vulkan-minimum ")
    assert env.device_limits() == "vulkan-minimum"


def test_env_switch_clamps_the_device_in_a_subprocess(device):
    proc = run_python("-m", "helios", "info", "--json", env={"HELIOS_DEVICE_LIMITS": "vulkan-minimum"})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["limits_from"] == "vulkan-minimum"
    assert (info["max_shared_memory"], info["max_workgroup_invocations"], info["max_push_constants_size"]) == (
        16384, 128, 128)
    assert info["min_storage_buffer_offset_alignment"] == 256 and info["max_storage_buffer_range"] <= 2**27
    assert not info["int64"] and not info["float16"] and info["subgroup_ops"] == ["basic"]
    assert info["subgroup_size"] == device.info.subgroup_size  # the running device's: what kernels execute


def test_env_switch_refuses_clearly():
    bad = run_python("-m", "helios", "info", env={"HELIOS_DEVICE_LIMITS": "no-such-gpu"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "known names" in bad.stderr, bad.stderr
    android = run_python("-m", "helios", "info", env={"HELIOS_DEVICE_LIMITS": "android-baseline-2022"})
    assert android.returncode == 2 and "timeline semaphores" in android.stderr and "android" in android.stderr


def test_info_limits_flag():
    proc = run_python("-m", "helios", "info", "--limits", "nvidia-gtx1060")
    assert proc.returncode == 0, proc.stderr
    assert "clamped to nvidia-gtx1060" in proc.stdout and "float16=no" in proc.stdout
    from_file = run_python("-m", "helios", "info", "--json", "--limits", str(RTX4070_FILE))
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)["limits_from"] == str(RTX4070_FILE)
    bad = run_python("-m", "helios", "info", "--limits", "nope.json")
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
    listing = run_python("-m", "helios", "info", "--list-limits")
    assert listing.returncode == 0 and all(name in listing.stdout for name in dl.names())


def _pow2(n: int | None) -> str:
    """2^27, 2^32-1, 2^30-4 where a byte count sits at (or just below) a power of two."""
    if n is None:
        return "-"
    for off in (0, 1, 4):
        k = (n + off).bit_length() - 1
        if n + off == 1 << k and k > 10:
            return f"2^{k}" + (f"-{off}" if off else "")
    return str(n)


def doc_row(name: str, e) -> str:
    """The first cells of the entry's row in docs/GPU.md, "Real devices' limits" (later columns are free)."""
    yes = {True: "yes", False: "no", None: "-"}
    sizes = "-" if e.subgroup_size is None else str(e.subgroup_size)
    if e.min_subgroup_size is not None and (e.min_subgroup_size, e.max_subgroup_size) != (e.subgroup_size,) * 2:
        sizes += f" ({e.min_subgroup_size}-{e.max_subgroup_size})"
    shared = "-" if e.max_shared_memory is None else f"{e.max_shared_memory // 1024} KiB"
    cells = [f"`{name}`", f"`{e.source.split(' ', 1)[1]}`", sizes, yes[e.int64], yes[e.storage_16bit],
             yes[e.float16], shared, str(e.max_workgroup_invocations or "-"), str(e.max_push_constants_size or "-"),
             str(e.min_storage_buffer_offset_alignment or "-"), _pow2(e.max_storage_buffer_range),
             " / ".join(_pow2(n) for n in (e.max_per_stage_storage_buffers, e.max_set_storage_buffers,
                                           e.max_push_descriptors))]
    return "| " + " | ".join(cells) + " |"


def test_the_docs_table_matches_the_data():
    text = (Path(__file__).parent.parent / "docs" / "GPU.md").read_text()
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    for name, entry in dl.table().items():
        expected = doc_row(name, entry)
        assert f"| `{name}`" in rows, f"docs/GPU.md has no row for {name}"
        assert rows[f"| `{name}`"].startswith(expected[:-1]), f"docs/GPU.md's row for {name} should be {expected}"
