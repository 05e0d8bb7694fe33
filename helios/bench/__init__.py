"""Benchmark commands: `python -m helios.bench <name>` (registry in `__main__.py`); shared timing in `harness.py`."""
