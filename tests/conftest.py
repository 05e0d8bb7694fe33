"""Shared fixtures: one Vulkan device for the whole run, the `gpu` marker for real-GPU-only tests,
`--profile=cpu|gpu`, the pytest form of HELIOS_PROFILE (docs/GPU.md, "The GPU profile"), and under
HELIOS_VALIDATE=1 a check after each test that the validation layer stayed silent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--profile", choices=("cpu", "gpu"), default=None,
                     help="behave as this device class (HELIOS_PROFILE): gpu runs the GPU's kernels and staging "
                          "memory on lavapipe; default: the device's own")


def pytest_configure(config):
    """Set HELIOS_PROFILE before any test creates the device; subprocesses inherit it through os.environ."""
    chosen = config.getoption("--profile")
    if chosen is not None:
        os.environ["HELIOS_PROFILE"] = chosen
    from helios import env
    from helios.errors import SetupError

    try:  # a bad HELIOS_PROFILE or HELIOS_COOPMAT is one line here, not an error in every test
        env.profile(), env.coopmat_mode()
    except SetupError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config):
    from helios import env

    own = "the device's own"
    return f"helios profile: {env.profile() or own}, cooperative matrices: {env.coopmat_mode()}"


@pytest.fixture(scope="session")
def device():
    """The process-wide helios device (lavapipe in CI)."""
    from helios.device import get_device

    return get_device()


@pytest.fixture(autouse=True)
def _validation_layer_clean():
    """Under HELIOS_VALIDATE=1, a test whose Vulkan calls drew validation-layer messages fails with them."""
    yield
    from helios import env

    if env.validate():
        from helios import runtime as rt
        from helios.device import get_device

        rt.sync()  # submit what the test left recorded: submission is validated too
        get_device().check_validation()


@pytest.fixture(scope="session")
def spirv_val(request):
    """spirv-val verdicts for every selected test_spirv_valid case, checked in one batch (tests/spirv_val.py)."""
    from tests.spirv_val import SessionSpirvVal

    return SessionSpirvVal(request.session.items)


def pytest_collection_modifyitems(config, items):
    """Mark `forced` the tests that force a selection choice (the kernel tests' `force` fixture): they run the
    kernels they name whatever the profile, so `make test-gpu-profile` leaves them out (-m "not forced").
    Skip tests marked `gpu` unless the chosen device is a real GPU."""
    for item in items:
        if "force" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.forced)
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
