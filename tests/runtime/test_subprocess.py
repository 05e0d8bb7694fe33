"""Runtime behaviour that needs a fresh process: the persisted pipeline cache and a validation-layer run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python

PIPELINE_SCRIPT = """
import json, numpy as np
from helios import runtime as rt
from tests.runtime.kernels import ADD, AXPB
x, y, z = rt.from_numpy(np.ones(4, np.float32)), rt.empty(4), rt.empty(4)
rt.launch(AXPB, [x, y], {"n": 4, "a": 2.0, "c": 1.0}, 1)
rt.launch(ADD, [x, y, z], {"n": 4}, 1)
assert z.numpy().tolist() == [4.0] * 4
print(json.dumps(rt.get_runtime().pipelines.stats()))
"""


def _stats(tmp_path) -> dict:
    done = run_python("-c", PIPELINE_SCRIPT, env={"HELIOS_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pipeline_cache_is_persisted_and_reused(tmp_path):
    first = _stats(tmp_path)
    assert first["pipeline_cache_loaded_bytes"] == 0 and first["pipelines_created"] == 2
    path = tmp_path / "pipelines"
    files = list(path.iterdir())
    written = files[0].stat().st_size
    assert len(files) == 1 and written > 0 and str(files[0]) == first["pipeline_cache_path"]
    second = _stats(tmp_path)
    assert second["pipeline_cache_path"] == first["pipeline_cache_path"]
    # the driver accepted the first run's file (SwiftShader then writes a longer one: its cache grows per run)
    assert second["pipeline_cache_loaded_bytes"] == written
    # A corrupt file must not stop a start: the driver rejects or ignores it and the run goes on.
    files[0].write_bytes(b"not a pipeline cache" * 3)
    third = _stats(tmp_path)
    assert third["pipelines_created"] == 2  # and the script checked the results


VALIDATION_SCRIPT = """
import numpy as np
from helios import runtime as rt
from helios.device import get_device
from helios.kernels.contract.device_paths import dtype_unmet  # float16 tensors where the device stores them
from tests.runtime.kernels import ADD, ADD_INPLACE, AXPB, SCALE, groups

def exercise():
    x = rt.from_numpy(np.arange(300, dtype=np.float32))
    y, z = rt.empty(300), rt.zeros(300)
    rt.launch(AXPB, [x, y], {"n": 300, "a": 2.0, "c": 1.0}, groups(300))
    rt.launch(ADD, [x, y, z], {"n": 300}, groups(300))
    for _ in range(5):
        rt.launch(ADD_INPLACE, [z], {"n": 300, "c": 1.0}, groups(300))
    arena = rt.zeros(1024)
    for k in range(4):
        rt.launch(SCALE, [x.view(0, 256), arena.view(256 * k, 256)], {"n": 256}, 4, spec={"S": float(k)})
    rt.copy(z, y)
    rt.fill(x, 0.5)
    half = rt.full(7, 1.0, np.float16) if dtype_unmet(get_device().info, "fp16") is None else None
    with rt.timed() as t:
        rt.launch(ADD_INPLACE, [y], {"n": 300, "c": 1.0}, groups(300))
    ref = np.arange(300, dtype=np.float32)
    assert np.array_equal(y.numpy(), 3 * ref + 1 + 5 + 1), y.numpy()[:4]
    assert np.array_equal(arena.numpy()[256:512], ref[:256])
    assert (half is None or np.array_equal(half.numpy(), np.ones(7, np.float16))) and t.ms >= 0
    # Odd sizes with uploads, kernels and reads interleaved (the staging race seen on an H100).
    for n in (16929, 16931, 4097):
        a = np.arange(n, dtype=np.float32)
        ta, tb, out = rt.from_numpy(a), rt.from_numpy(a[::-1].copy()), rt.empty(n)
        rt.launch(ADD, [ta, tb, out], {"n": n}, groups(n))
        assert np.array_equal(out.numpy(), a + a[::-1])
        rt.launch(AXPB, [out, ta], {"n": n, "a": 1.0, "c": 1.0}, groups(n))
        assert np.array_equal(tb.numpy(), a[::-1]) and np.array_equal(ta.numpy(), a + a[::-1] + 1)
    rt.sync()

exercise()
for options in ({"push_descriptors": False}, {"zero_copy": False}):
    r = rt.Runtime(persist_pipelines=False, **options)
    previous = rt.set_runtime(r)
    exercise()
    rt.set_runtime(previous)
    r.close()
get_device().check_validation()
print("validation clean")
"""


def _has_validation_layer() -> bool:
    from helios.device import load_vulkan

    vk = load_vulkan()
    return any(p.layerName == "VK_LAYER_KHRONOS_validation" for p in vk.vkEnumerateInstanceLayerProperties())


@pytest.mark.skipif(not _has_validation_layer(), reason="vulkan-validationlayers is not installed")
def test_runtime_is_clean_under_the_validation_layer(tmp_path):
    # Synchronization validation too: it checks every hazard the recorder decided needed no barrier.
    env = {"HELIOS_VALIDATE": "1", "HELIOS_CACHE_DIR": str(tmp_path),
           "VK_LAYER_ENABLES": "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"}
    done = run_python("-c", VALIDATION_SCRIPT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation clean" in done.stdout
