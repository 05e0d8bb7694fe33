"""The peak MFU divides by: the vendor's figure for a known device, else the best FMA measurement (stored by
`helios.bench limits` or a run), measured again when a run's MFU would pass 100%; MFU is never shown above
100%, and `trainer config`, the run's first lines and `telemetry summary` say where the peak came from."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helios.bench.limits import store_peaks
from helios.ceilings import peak

REPO = Path(__file__).resolve().parents[2]


def test_stored_fma_peak_feeds_device_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    from trainer.backends.helios import HeliosBackend

    name = "some device"
    store_peaks(name, [{"kernel": "limits_fma", "gflops": 40.0}, {"kernel": "limits_fma", "gflops": 55.0},
                       {"kernel": "limits_copy", "gbps": 3.0}])
    store_peaks(name, [{"kernel": "limits_fma", "gflops": 20.0}])  # a slower later run keeps the best
    backend = HeliosBackend.__new__(HeliosBackend)
    monkeypatch.setattr(HeliosBackend, "device_name", lambda self: name)
    found = backend.device_peak()
    assert found.flops == 55.0e9 and "best measured on this device" in found.source
    assert json.loads((tmp_path / "limits.json").read_text())[name]["copy_gbps"] == 3.0


def test_without_a_stored_peak_one_is_measured_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    from helios.device import get_device

    name = get_device().info.name
    first = peak.device_peak(name)  # measured now (about a second)
    assert first.flops > 1e9 and peak.stored_fma_gflops(name) == first.flops / 1e9
    assert "measured now" in first.source and str(tmp_path) in first.source

    def no_second_measurement(*_a, **_k):
        raise AssertionError("measured twice")

    monkeypatch.setattr(peak, "measure_fma_gflops", no_second_measurement)
    assert peak.device_peak(name).flops == first.flops


@pytest.mark.parametrize("name,tflops", [("NVIDIA H100 80GB HBM3", 66.9), ("NVIDIA H100 PCIe", 51.2),
                                         ("NVIDIA H200", 66.9), ("NVIDIA A100-SXM4-80GB", 19.5),
                                         ("NVIDIA A10", 31.2), ("NVIDIA L4", 30.3), ("NVIDIA L40S", 91.6),
                                         ("NVIDIA GeForce RTX 4090", 82.6), ("Tesla T4", 8.1)])
def test_a_known_device_gets_its_vendor_figure_without_measuring(name, tflops, tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "measure_fma_gflops", lambda *a, **k: pytest.fail("measured a known device"))
    store_peaks(name, [{"kernel": "limits_fma", "gflops": 1.0}])  # a measurement under load does not win
    found = peak.device_peak(name)
    assert found.flops == tflops * 1e12 and "vendor" in found.source and name in found.source


def test_unknown_devices_have_no_vendor_figure():
    assert peak.vendor_peak("llvmpipe (LLVM 15.0.6, 256 bits)") is None
    assert peak.vendor_peak("AMD Radeon Graphics (RADV GFX1103_R1)") is None


def test_a_burst_of_load_in_one_round_does_not_lower_the_measurement(monkeypatch):
    # A fake clock: each dispatch takes 10 ms, or 20 ms while another job holds the cores (the first 0.25 s,
    # all of the first round). The figure must be the unloaded one.
    from helios.ceilings import kernels as L

    now = [0.0]
    monkeypatch.setattr(peak.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(peak.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))

    def dispatch(*_args, **_kwargs):
        now[0] += 0.02 if now[0] < 0.25 else 0.01

    monkeypatch.setattr(L, "fma_run", dispatch)
    flops = L.fma_flops(64 * 64, 100, L.LIMITS_FMA.variant("fma8").chains)  # lavapipe's threads and loop count
    assert peak.measure_fma_gflops(rounds=5, round_s=0.2) == pytest.approx(flops / 0.01 / 1e9)


@pytest.fixture
def warm_cache(tmp_path) -> Path:
    """A cache directory of this test's own holding the session cache's compiled pipelines (a cold one would
    compile every kernel again, a minute on lavapipe), and no peak yet."""
    cache = tmp_path / "cache"
    cache.mkdir()
    own = Path(os.environ.get("HELIOS_CACHE_DIR") or Path.home() / ".cache" / "helios")
    if (own / "pipelines").is_dir():
        shutil.copytree(own / "pipelines", cache / "pipelines")
    return cache


def _cli(*args: str, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HELIOS_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_peak_stored_under_load_is_remeasured_and_mfu_never_shows_past_100(make_config, warm_cache, tmp_path):
    from helios.device import get_device

    name = get_device().info.name
    # As if the first measurement ran while another job held the cores: far below what training reaches.
    (warm_cache / "limits.json").write_text(json.dumps({name: {"fma_gflops": 1e-4}}))
    config = make_config("mfu", train={"max_iters": 6, "log_interval": 1, "eval_interval": 0, "sample_tokens": 0,
                                       "ckpt_interval": 0})
    done = _cli("trainer", "run", str(config), cache=warm_cache)
    assert done.returncode == 0, done.stderr
    shown = [float(x) for x in re.findall(r"MFU ([0-9.]+)%", done.stdout)]
    assert len(shown) == 6 and max(shown) <= 100.0, done.stdout
    assert "MFU passed 100% of the device peak (0.0 GFLOP/s)" in done.stdout
    assert "re-measured because MFU passed 100%" in done.stdout
    stored = json.loads((warm_cache / "limits.json").read_text())[name]["fma_gflops"]
    assert stored > 1.0  # the new measurement replaced the one taken under load, for later runs too
    events = [json.loads(line) for line in (tmp_path / "runs/mfu/metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("peak") == 1
    assert all(e["mfu"] <= 1.0 for e in events if e["event"] == "step")
    summary = _cli("telemetry", "summary", str(tmp_path / "runs/mfu"), cache=warm_cache)
    line = next(x for x in summary.stdout.splitlines() if x.startswith("mfu"))
    assert f"of {stored:,.1f} GFLOP/s: the FMA kernel, re-measured because MFU passed 100%" in line, line


def test_trainer_config_and_the_run_say_where_the_peak_comes_from(make_config, warm_cache):
    config = make_config("src", train={"max_iters": 2, "eval_interval": 0, "sample_tokens": 0})
    before = _cli("trainer", "config", str(config), cache=warm_cache)
    assert before.returncode == 0, before.stderr
    assert "# MFU peak          not measured yet: the first run measures the FMA kernel" in before.stdout
    run = _cli("trainer", "run", str(config), cache=warm_cache)
    assert run.returncode == 0, run.stderr
    assert "MFU peak: the FMA kernel, measured now (best of 5 rounds; stored in" in run.stdout
    after = _cli("trainer", "config", str(config), "--json", cache=warm_cache)
    shown = json.loads(after.stdout)["mfu_peak"]
    assert shown["peak_flops"] > 1e9 and "best measured on this device" in shown["source"]
