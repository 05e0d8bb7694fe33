"""Shared fixtures: one Vulkan device for the whole run, the `gpu` marker for real-GPU-only tests,
`--profile=cpu|gpu`, the pytest form of HELIOS_PROFILE (docs/GPU.md, "The GPU profile"), under
HELIOS_VALIDATE=1 a check after each test that the validation layer stayed silent, and what a test needs of
the device: `@pytest.mark.needs("int64", dtype="bf16")` (or `needs(...)` in its body, `needs_kernel(kernel,
variant)` for a kernel module the device contract must accept, `dtype_params(...)` for a parametrized dtype)
skips it, naming the missing Vulkan feature, on a device that lacks it (CONVENTIONS.md rule 17); `aligned(n)`
places a view where the device's offset alignment allows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--profile", choices=("cpu", "gpu"), default=None,
                     help="behave as this device class (HELIOS_PROFILE): gpu runs the GPU's kernels and staging "
                          "memory on lavapipe; default: the device's own")


def pytest_configure(config):
    """Set HELIOS_PROFILE before any test creates the device; subprocesses inherit it through os.environ."""
    config.addinivalue_line("markers", "needs(*features, dtype=None): needs DeviceInfo features (FEATURES in "
                                       "tests/conftest.py) and tensors in dtype; skipped, naming them, elsewhere")
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


# The DeviceInfo features a test may need, each with the Vulkan feature a skip names.
FEATURES = {
    "int64": "shaderInt64 (64-bit integers)",
    "int16": "shaderInt16 (16-bit integers)",
    "float16": "shaderFloat16 (16-bit floats)",
    "storage_16bit": "storageBuffer16BitAccess (16-bit storage)",
    "float_atomic_add_buffer": "shaderBufferFloat32AtomicAdd (float atomic add on buffers)",
    "buffer_device_address": "bufferDeviceAddress (device addresses)",
}


def _dtype_name(dtype) -> str | None:
    """A kernel dtype name ("f32", "bf16", "fp16") for a name or a numpy dtype; None for integer dtypes."""
    if isinstance(dtype, str) and dtype in ("f32", "bf16", "fp16"):
        return dtype
    from helios.kernels.contract.dtypes import FLOAT_DTYPES

    try:
        return FLOAT_DTYPES.get(np.dtype(dtype))
    except TypeError:  # not a dtype at all
        return None


def lacking(*features: str, dtype=None) -> str | None:
    """Why this device cannot run a test that needs `features` (FEATURES' DeviceInfo fields) and tensors in
    `dtype` (helios.kernels.contract.device_paths.dtype_unmet): a skip reason naming what it lacks; None when it has
    all."""
    from helios.device import get_device
    from helios.kernels.contract.device_paths import dtype_unmet

    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown device features {sorted(unknown)} (known: {', '.join(FEATURES)})")
    info = get_device().info
    missing = [FEATURES[f] for f in features if not getattr(info, f)]
    name = _dtype_name(dtype) if dtype is not None else None
    if name is not None and (why := dtype_unmet(info, name)):
        missing.append(why)
    return f"needs {' and '.join(missing)}, which {info.name} lacks" if missing else None


def needs(*features: str, dtype=None) -> None:
    """Skip the running test where the device lacks one of `features` or cannot hold tensors in `dtype`."""
    if reason := lacking(*features, dtype=dtype):
        pytest.skip(reason)


def needs_kernel(kernel, variant: str, spec: dict | None = None) -> None:
    """Skip the running test where the device contract refuses `kernel`'s `variant` (helios.runtime.contract),
    naming what it needs."""
    if reason := kernel_unmet(kernel, variant, spec):
        pytest.skip(reason)


def kernel_unmet(kernel, variant: str, spec: dict | None = None) -> str | None:
    """Why the device contract refuses `kernel`'s `variant` on this device, or None where it runs."""
    from helios.device import get_device
    from helios.runtime.contract import unmet_needs

    info = get_device().info
    unmet = unmet_needs(kernel.module(variant), info, spec)
    return f"kernel {kernel.name}:{variant} needs {'; '.join(unmet)} on {info.name}" if unmet else None


def aligned(n: int, itemsize: int = 4) -> int:
    """n elements of `itemsize` bytes rounded up to whole minStorageBufferOffsetAlignments of this device: where
    a test not about alignment takes a view (16 bytes on lavapipe, 256 on SwiftShader)."""
    from helios.device import get_device

    step = max(1, get_device().info.min_storage_buffer_offset_alignment // itemsize)
    return -(-n // step) * step


def dtype_params(*dtypes) -> list:
    """`dtypes` for pytest.mark.parametrize (or fixture params), each half dtype marked as needing its storage."""
    return [pytest.param(d, marks=pytest.mark.needs(dtype=d)) if _dtype_name(d) not in (None, "f32") else d
            for d in dtypes]


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


@pytest.fixture(scope="session", autouse=True)
def _no_tuning_results_left():
    """No test leaves tuning winners in the shared cache directory: every later test (and process) would train
    with them. A test that tunes uses its own HELIOS cache directory, or `--dry-run`."""
    from helios import env

    before = set(env.cache_dir().glob("tuning-*.json"))
    yield
    left = sorted(set(env.cache_dir().glob("tuning-*.json")) - before)
    assert not left, f"a test stored tuning results in the shared cache directory: {[str(p) for p in left]}"


@pytest.fixture(scope="session")
def spirv_val(request):
    """spirv-val verdicts for every selected test_spirv_valid case, checked in one batch (tests/spirv_val.py)."""
    from tests.spirv_val import SessionSpirvVal

    return SessionSpirvVal(request.session.items)


def pytest_collection_modifyitems(config, items):
    """Mark `forced` the tests that force a selection choice (the kernel tests' `force` fixture): they run the
    kernels they name whatever the profile, so `make test-gpu-profile` leaves them out (-m "not forced").
    Skip tests marked `gpu` unless the chosen device is a real GPU, and tests marked `needs` where the device
    lacks what they name."""
    for item in items:
        if "force" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.forced)
        for mark in item.iter_markers("needs"):
            if reason := lacking(*mark.args, **mark.kwargs):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
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
