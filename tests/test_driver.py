"""Driver facts: Mesa's version from the driver string, and the one-line note for a slow (pre-24) lavapipe."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helios.device import get_device
from helios.driver import gathers_pay_off, mesa_version, slow_driver_note

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
