"""`helios` re-exports the runtime's everyday names lazily: `import helios` loads neither the runtime nor Vulkan."""

from __future__ import annotations

import numpy as np
import pytest

import helios
from helios import runtime as rt
from tests.conftest import run_python

NAMES = ("Tensor", "empty", "zeros", "full", "from_numpy", "launch", "sync", "counters", "reset_counters", "timed",
         "fill", "copy", "configure")


def test_import_helios_loads_no_runtime_and_no_vulkan():
    code = ("import sys, helios; loaded = [m for m in sys.modules if m.startswith(('helios.', 'vulkan', 'numpy'))]; "
            "print(loaded); assert not loaded")
    done = run_python("-c", code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_exports_are_the_runtime_objects(runtime):
    for name in NAMES:
        assert getattr(helios, name) is getattr(rt, name), name
        assert name in helios.__all__ and name in dir(helios)
    t = helios.from_numpy(np.arange(4, dtype=np.float32))
    helios.fill(t, 2.0)
    np.testing.assert_array_equal(t.numpy(), np.full(4, 2.0, np.float32))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        helios.not_a_name  # noqa: B018
