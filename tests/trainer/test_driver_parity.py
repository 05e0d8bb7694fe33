"""The same training on two independent Vulkan drivers: lavapipe (Mesa's compiler) and SwiftShader (Google's), in
the default and the GPU profile, agree step by step to 1e-4 relative (tools/driver_parity.py; the 50-step run of
configs/shakespeare.toml on the real data is in docs/GPU.md). SwiftShader has no 64-bit or 16-bit types and a
256-byte offset alignment, so this trains through the variants a strict device gets (vec4 loads, rowwise_vec4
attention, aligned arenas) and checks them against lavapipe's own."""

from __future__ import annotations

import pytest

from tests.trainer.conftest import parity_config
from tools import driver_parity

pytestmark = pytest.mark.swiftshader


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_losses_agree_across_drivers(profile, make_config):
    missing = [name for name, icd in driver_parity.driver_files().items() if icd is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} is not installed (make test installs both drivers)")
    steps = 30
    config = make_config(f"drivers-{profile}", **parity_config(steps=steps, eval_interval=steps, log_interval=1))
    runs = driver_parity.compare(profile, config, steps, [])
    lavapipe, swiftshader = runs["lavapipe"], runs["swiftshader"]
    assert len(lavapipe) == len(swiftshader) == steps
    assert lavapipe[-1] < lavapipe[0] - 0.5, "the parity model should learn in these steps"
    worst = max(abs(a - b) / abs(a) for a, b in zip(lavapipe, swiftshader, strict=True))
    assert worst <= 1e-4, f"largest relative difference of a step's loss: {worst:.2e}"
