"""Shared fixtures: one Vulkan device for the whole run, and the `gpu` marker for real-GPU-only tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def device():
    """The process-wide helios device (lavapipe in CI)."""
    from helios.device import get_device

    return get_device()


@pytest.fixture(scope="session")
def spirv_val(request):
    """spirv-val verdicts for every selected test_spirv_valid case, checked in one batch (tests/spirv_val.py)."""
    from tests.spirv_val import SessionSpirvVal

    return SessionSpirvVal(request.session.items)


def pytest_collection_modifyitems(config, items):
    """Skip tests marked `gpu` unless the chosen device is a real GPU."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from helios.device import get_device

    if get_device().info.is_cpu:
        skip = pytest.mark.skip(reason="needs a real GPU; this device runs on the CPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def run_python(*args: str, env: dict | None = None, timeout: float = 120, cwd: Path | None = None):
    """Run `python *args` in a subprocess from the repo root; returns CompletedProcess with text output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=full_env, timeout=timeout,
        cwd=str(cwd or REPO),
    )
