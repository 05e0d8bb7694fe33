"""Fixtures for the runtime tests: a clean, synced runtime with zeroed counters for each test."""

from __future__ import annotations

import pytest

from helios import runtime as rt


@pytest.fixture
def runtime():
    """The process runtime, synced, with counters reset and the default flush threshold."""
    r = rt.get_runtime()
    rt.sync()
    rt.configure(flush_threshold=1024, eager_flush=64)
    rt.reset_counters()
    yield r
    rt.configure(flush_threshold=1024, eager_flush=64)
    rt.sync()


@pytest.fixture
def private_runtime():
    """Build a throw-away Runtime with the given options, make it current, and restore the old one after."""
    made = []

    def make(**options):
        r = rt.Runtime(persist_pipelines=False, **options)
        made.append((r, rt.set_runtime(r)))
        return r

    yield make
    for r, previous in reversed(made):
        rt.set_runtime(previous)
        r.close()
