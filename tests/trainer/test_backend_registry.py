"""The trainer's backends register themselves: a Backend subclass that declares `name = "..."` is registered
when its module is imported, and finding them (importing trainer.backends) does not load torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.backend import backend_class, backend_names
from trainer.errors import BackendUnavailableError


def test_every_declared_backend_is_found_and_resolves_to_its_class():
    assert backend_names() == ["helios", "torch"]
    for name in backend_names():
        assert backend_class(name).name == name


def test_finding_the_backends_imports_no_torch():
    code = ("import sys, trainer.backend as b; print(b.backend_names()); print(b.backend_class('torch').__name__); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['helios',", "'torch']", "TorchBackend", "False"]


def test_an_unknown_backend_names_the_valid_ones():
    with pytest.raises(BackendUnavailableError, match=r"no backend named 'jax' \(known: helios, torch\)"):
        backend_class("jax")
