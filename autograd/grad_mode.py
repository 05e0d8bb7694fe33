"""Whether autograd records: `no_grad()` turns recording off inside a `with` block."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


@contextmanager
def set_grad_enabled(enabled: bool):
    previous = is_grad_enabled()
    _state.enabled = enabled
    try:
        yield
    finally:
        _state.enabled = previous


def no_grad():
    """Context in which ops record nothing on the tape (evaluation, optimizer updates)."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)
