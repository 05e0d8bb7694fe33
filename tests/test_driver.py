"""Driver facts: Mesa's version from the driver string, and the one-line note for a slow (pre-24) lavapipe."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helios.device import get_device
from helios.device.driver import gathers_pay_off, mesa_version, slow_driver_note

REPO = Path(__file__).resolve().parent.parent


def test_mesa_version_parses_debian_and_plain_strings():
    assert mesa_version("Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)") == (25, 0, 7)
    assert mesa_version("Mesa 22.3.6 (LLVM 15.0.6)") == (22, 3, 6)
    assert mesa_version("Mesa 24.1 (LLVM 17)") == (24, 1, 0)
    assert mesa_version("570.86.16") is None and mesa_version("") is None


def test_the_note_names_old_lavapipe_only():
    info = get_device().info
    lavapipe = dataclasses.replace(info, name="llvmpipe (LLVM 15.0.6, 256 bits)", driver_name="llvmpipe")
    old = slow_driver_note(dataclasses.replace(lavapipe, driver_info="Mesa 22.3.6 (LLVM 15.0.6)"))
    assert old is not None and "Mesa 22.3.6" in old and "bookworm-backports" in old and "\n" not in old
    assert slow_driver_note(dataclasses.replace(lavapipe, driver_info="Mesa 25.0.7 (LLVM 15.0.6)")) is None
    gpu = dataclasses.replace(info, name="NVIDIA H100 80GB HBM3", driver_name="NVIDIA", driver_info="580.159.04")
    assert slow_driver_note(gpu) is None
    radv = dataclasses.replace(info, name="AMD Radeon RX 7900 (RADV NAVI31)", driver_name="radv",
                               driver_info="Mesa 22.3.6")
    assert slow_driver_note(radv) is None  # only lavapipe's load path was the slow one


def test_device_addresses_only_where_they_measured_faster():
    """lavapipe from Mesa 25 reads through device addresses (gathers); 22.3 and other drivers keep descriptors."""
    info = get_device().info
    lavapipe = dataclasses.replace(info, name="llvmpipe (LLVM 15.0.6, 256 bits)", driver_name="llvmpipe")
    assert gathers_pay_off(dataclasses.replace(lavapipe, driver_info="Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)"))
    assert gathers_pay_off(dataclasses.replace(lavapipe, driver_info="Mesa 26.1.0"))
    assert not gathers_pay_off(dataclasses.replace(lavapipe, driver_info="Mesa 22.3.6 (LLVM 15.0.6)"))
    gpu = dataclasses.replace(info, name="NVIDIA H100 80GB HBM3", driver_name="NVIDIA", driver_info="580.159.04")
    assert not gathers_pay_off(gpu)
    assert info.buffer_device_address == gathers_pay_off(info)  # what the device enabled follows the rule


def test_helios_info_prints_the_note_on_mesa_22():
    icd = REPO / ".mesa22" / "lvp_icd.json"
    if not icd.exists():
        pytest.skip("Mesa 22.3 is not unpacked here (tools/mesa22.sh)")
    env = {**os.environ, "VK_DRIVER_FILES": str(icd)}
    done = subprocess.run([sys.executable, "-m", "helios", "info"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Mesa 22.3" in done.stdout
    assert done.stderr.count("\n") == 1 and "bookworm-backports" in done.stderr


def test_lavapipe_vector_width_comes_from_the_device_name():
    from helios.device.driver import lavapipe_vector_width

    info = get_device().info
    assert lavapipe_vector_width(dataclasses.replace(info, name="llvmpipe (LLVM 15.0.6, 128 bits)",
                                                     driver_name="llvmpipe")) == 128
    gpu = dataclasses.replace(info, name="NVIDIA H100 80GB HBM3", driver_name="NVIDIA", driver_info="580.159.04")
    assert lavapipe_vector_width(gpu) is None


@pytest.fixture
def mesa_env(monkeypatch, tmp_path):
    """A clean slate for Mesa's cache variables, with the XDG cache home in tmp_path."""
    for name in ("MESA_SHADER_CACHE_DIR", "MESA_GLSL_CACHE_DIR", "MESA_SHADER_CACHE_DISABLE",
                 "MESA_GLSL_CACHE_DISABLE", "LP_NATIVE_VECTOR_WIDTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return monkeypatch


def test_each_vector_width_gets_its_own_mesa_shader_cache(mesa_env, tmp_path):
    from helios.device.driver import isolate_mesa_shader_cache

    assert isolate_mesa_shader_cache() is None and "MESA_SHADER_CACHE_DIR" not in os.environ  # default width
    mesa_env.setenv("LP_NATIVE_VECTOR_WIDTH", "128")
    folder = isolate_mesa_shader_cache()
    assert folder == str(tmp_path / "mesa_shader_cache_helios" / "lp-width-128") == os.environ["MESA_SHADER_CACHE_DIR"]
    mesa_env.setenv("LP_NATIVE_VECTOR_WIDTH", "512")  # a child process at another width inherits the variable
    assert isolate_mesa_shader_cache() == str(tmp_path / "mesa_shader_cache_helios" / "lp-width-512")
    mesa_env.delenv("LP_NATIVE_VECTOR_WIDTH")  # ... or at the default width: Mesa's own folder again
    assert isolate_mesa_shader_cache() is None and "MESA_SHADER_CACHE_DIR" not in os.environ


@pytest.mark.parametrize("setting", [("MESA_SHADER_CACHE_DIR", "/somewhere/mine"),
                                     ("MESA_SHADER_CACHE_DISABLE", "true"), ("MESA_GLSL_CACHE_DIR", "/old/name")])
def test_a_mesa_cache_the_user_chose_is_left_alone(mesa_env, setting):
    from helios.device.driver import isolate_mesa_shader_cache

    mesa_env.setenv("LP_NATIVE_VECTOR_WIDTH", "128")
    mesa_env.setenv(*setting)
    before = os.environ.get("MESA_SHADER_CACHE_DIR")
    assert isolate_mesa_shader_cache() is None and os.environ.get("MESA_SHADER_CACHE_DIR") == before


def test_mismatch_advice_names_the_cause_and_fix(mesa_env):
    from helios.device.driver import subgroup_mismatch_advice

    info = get_device().info
    lavapipe = dataclasses.replace(info, driver_name="llvmpipe", driver_info="Mesa 25.0.7 (LLVM 15.0.6)")
    mesa_env.setenv("LP_NATIVE_VECTOR_WIDTH", "2048")
    wide = subgroup_mismatch_advice(dataclasses.replace(lavapipe, name="llvmpipe (LLVM 15.0.6, 2048 bits)"))
    assert "LP_NATIVE_VECTOR_WIDTH=2048" in wide and "128, 256 or 512" in wide
    honest = subgroup_mismatch_advice(dataclasses.replace(lavapipe, name="llvmpipe (LLVM 15.0.6, 256 bits)"))
    assert "MESA_SHADER_CACHE_DISABLE=true" in honest and "mesa_shader_cache" in honest
    gpu = dataclasses.replace(info, name="NVIDIA H100 80GB HBM3", driver_name="NVIDIA", driver_info="580.159.04")
    assert "driver" in subgroup_mismatch_advice(gpu) and "LP_NATIVE" not in subgroup_mismatch_advice(gpu)
    assert all("\n" not in text for text in (wide, honest, subgroup_mismatch_advice(gpu)))
