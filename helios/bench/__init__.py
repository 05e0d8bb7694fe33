"""Benchmark commands: `python -m helios.bench <family>`; shared timing in `harness.py`."""
