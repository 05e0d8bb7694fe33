"""The device layer: what it reports, and how it fails when the machine cannot run helios."""

from __future__ import annotations

import json

from tests.conftest import run_python


def test_device_exists_with_timeline_semaphores(device):
    info = device.info
    assert info.name
    assert info.timeline_semaphore
    assert info.api_version.startswith("1.")
    major, minor = (int(x) for x in info.api_version.split(".")[:2])
    assert (major, minor) >= (1, 2)


def test_limits_are_sane(device):
    info = device.info
    s = info.subgroup_size
    assert s >= 1 and s & (s - 1) == 0, "subgroup size must be a power of two"
    assert info.min_subgroup_size <= s <= info.max_subgroup_size
    assert info.max_shared_memory >= 16384  # the Vulkan minimum for compute shared memory
    assert all(c >= 65535 for c in info.max_workgroup_count)
    assert info.max_workgroup_invocations >= 128
    assert info.max_storage_buffer_range >= 2**27  # Vulkan's guaranteed maxStorageBufferRange
    assert info.memory_types and info.memory_heaps
    assert any(t.host_visible for t in info.memory_types), "need a host-visible memory type for uploads"
    assert info.timestamp_period_ns > 0
    # Vulkan's guaranteed descriptor limits (maxPushDescriptors only where VK_KHR_push_descriptor is)
    assert info.max_per_stage_storage_buffers >= 4 and info.max_per_stage_resources >= 128
    assert info.max_set_storage_buffers >= 24
    assert info.max_push_descriptors >= 32 if info.push_descriptor else info.max_push_descriptors == 0


def test_info_json_has_the_documented_fields():
    proc = run_python("-m", "helios", "info", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    for key in ("name", "device_type", "api_version", "timeline_semaphore", "subgroup_size",
                "max_shared_memory", "max_workgroup_count", "max_storage_buffer_range"):
        assert key in report, key
    assert report["timeline_semaphore"] is True


def test_info_text_report():
    proc = run_python("-m", "helios", "info")
    assert proc.returncode == 0, proc.stderr
    assert "subgroups" in proc.stdout and "timeline_semaphore=yes" in proc.stdout


def test_no_driver_is_a_clear_exit_2():
    proc = run_python("-m", "helios", "info", env={"VK_DRIVER_FILES": "/nonexistent.json"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "mesa-vulkan-drivers" in proc.stderr


def test_missing_loader_is_a_clear_exit_2(tmp_path):
    # A stand-in `vulkan` package that fails to import the way the binding does without libvulkan.so.1.
    fake = tmp_path / "vulkan"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('Cannot find Vulkan SDK version.')\n")
    proc = run_python("-m", "helios", "info", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "libvulkan1" in proc.stderr


def test_device_override_by_bad_name_is_clear():
    proc = run_python("-m", "helios", "info", env={"HELIOS_DEVICE": "no-such-gpu-xyz"})
    assert proc.returncode == 2
    assert "matches no device" in proc.stderr and "Traceback" not in proc.stderr


def test_device_override_by_index_and_name(device):
    proc = run_python("-m", "helios", "info", "--json", env={"HELIOS_DEVICE": "0"})
    assert proc.returncode == 0, proc.stderr
    name = json.loads(proc.stdout)["name"]
    proc = run_python("-m", "helios", "info", "--json", env={"HELIOS_DEVICE": name.split()[0]})
    assert proc.returncode == 0 and json.loads(proc.stdout)["name"] == name


def test_device_override_out_of_range():
    proc = run_python("-m", "helios", "info", env={"HELIOS_DEVICE": "99"})
    assert proc.returncode == 2 and "only" in proc.stderr


def test_validation_layer_device_is_clean():
    code = (
        "from helios.device import get_device\n"
        "d = get_device()\n"
        "d.check_validation()\n"
        "print('clean')\n"
    )
    proc = run_python("-c", code, env={"HELIOS_VALIDATE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "clean" in proc.stdout


def test_device_without_timeline_semaphores_is_refused(monkeypatch):
    import dataclasses

    import pytest

    from helios.device import Device
    from helios.errors import SetupError

    real_query = Device._query

    def query_without_timelines(self, phys, index):
        info, features = real_query(self, phys, index)
        return dataclasses.replace(info, timeline_semaphore=False), features

    monkeypatch.setattr(Device, "_query", query_without_timelines)
    with pytest.raises(SetupError) as err:
        Device()
    assert "timeline semaphores" in str(err.value) and "HELIOS_DEVICE" in str(err.value)
    assert err.value.exit_code == 2
