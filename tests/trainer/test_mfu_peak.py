"""The FMA peak `helios.bench limits` stores is what the helios backend's MFU divides by."""

from __future__ import annotations

from helios.bench.limits import store_peaks


def test_stored_fma_peak_feeds_peak_flops(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    from trainer.backends.helios import HeliosBackend

    name = "some device"
    store_peaks(name, [{"kernel": "limits_fma", "gflops": 40.0}, {"kernel": "limits_fma", "gflops": 55.0},
                       {"kernel": "limits_copy", "gbps": 3.0}])
    store_peaks(name, [{"kernel": "limits_fma", "gflops": 20.0}])  # a slower later run keeps the best
    backend = HeliosBackend.__new__(HeliosBackend)
    monkeypatch.setattr(HeliosBackend, "device_name", lambda self: name)
    assert backend.peak_flops() == 55.0e9


def test_without_a_stored_peak_one_is_measured_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    from helios import peak
    from helios.device import get_device

    name = get_device().info.name
    first = peak.peak_flops(name)  # measured now (about a second)
    assert first > 1e9 and peak.stored_fma_gflops(name) == first / 1e9

    def no_second_measurement(*_a, **_k):
        raise AssertionError("measured twice")

    monkeypatch.setattr(peak, "measure_fma_gflops", no_second_measurement)
    assert peak.peak_flops(name) == first
