"""The trainer's backends are found from their declarations (`name = "..."` on a Backend subclass in
trainer/backends/), without importing them: no hand-kept list, and torch is not loaded by the lookup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.backend import BACKENDS, backend_class
from trainer.errors import BackendUnavailableError


def test_every_declared_backend_is_found_and_resolves_to_its_class():
    assert list(BACKENDS) == ["helios", "torch"]  # file order: helios is the default and comes first
    for name in BACKENDS:
        assert backend_class(name).name == name


def test_the_lookup_imports_no_backend():
    code = "import sys, trainer.backend as b; print(sorted(b.BACKENDS)); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['helios',", "'torch']", "False"]


def test_an_unknown_backend_names_the_valid_ones():
    with pytest.raises(BackendUnavailableError, match="valid backends: helios, torch"):
        backend_class("jax")
