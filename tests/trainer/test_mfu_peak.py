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
