"""One registry mechanism for everything helios and the trainer look up by name: kernels (helios.spirv.registry),
op specs (helios.kernels.contract.spec), op functions (helios.ops), selection families
(helios.kernels.contract.selection) and trainer backends (trainer.backend).

A module declares its entries when it is imported (`Registry.add`); a registry finds the entries it does not
hold yet by running its one discovery hook, which imports the modules that declare them. A name declared
twice is an error that names both declarers, so nothing is ever silently replaced.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


def import_modules(names: Iterable[str], errors: list[tuple[str, BaseException]] | None = None) -> list[str]:
    """Import `names` so that their declarations run; return them. A module that fails to import raises,
    unless `errors` is given: then (module name, exception) is appended to it and importing goes on."""
    names = list(names)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            if errors is None:
                raise
            errors.append((name, exc))
    return names


def package_modules(package: str) -> list[str]:
    """The full names of a package's modules and subpackages, at every depth, sorted; found on disk without
    importing any of them (only `package` itself is imported, for its path)."""
    return sorted(_walk(importlib.import_module(package).__path__, f"{package}."))


def _walk(path: Iterable[str], prefix: str) -> list[str]:
    names = []
    for info in pkgutil.iter_modules(path, prefix):
        names.append(info.name)
        if info.ispkg:
            leaf = info.name.rsplit(".", 1)[1]
            names += _walk([os.path.join(info.module_finder.path, leaf)], f"{info.name}.")
    return names


class Registry(Generic[T]):
    """Named entries of one kind, each declared once by one module.

    `discover` imports the modules that declare entries (None: callers import them); `missing` is the
    exception class an unknown name raises (a ValueError unless the registry's callers expect another).
    """

    def __init__(self, kind: str, discover: Callable[[], object] | None = None,
                 missing: type[Exception] = ValueError) -> None:
        self.kind = kind
        self._discover = discover
        self._missing = missing
        self._entries: dict[str, tuple[T, str]] = {}

    def add(self, name: str, value: T, declared_by: str) -> T:
        """Declare `name`. Another value under a name already declared is a ValueError naming both declarers;
        the same value again from the same declarer (a module imported twice) changes nothing."""
        old = self._entries.get(name)
        if old is not None and (old[0] is not value or old[1] != declared_by):
            raise ValueError(f"{self.kind} {name!r} is declared twice, by {old[1]} and by {declared_by}: "
                             f"rename one of them")
        self._entries[name] = (value, declared_by)
        return value

    def remove(self, name: str) -> None:
        """Forget `name` (a test's temporary entry); an unknown name is ignored."""
        self._entries.pop(name, None)

    def discover(self) -> None:
        """Import every module that declares entries (idempotent: imported modules declare nothing again)."""
        if self._discover is not None:
            self._discover()

    def __contains__(self, name: object) -> bool:
        """Whether `name` is declared already (no discovery)."""
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry `name`, discovering the declaring modules first if it is not known yet."""
        if name not in self._entries:
            self.discover()
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "none"
            raise self._missing(f"no {self.kind} named {name!r} (known: {known})")
        return self._entries[name][0]

    def declared_by(self, name: str) -> str:
        """The module (or other declarer) that declared `name`."""
        self.get(name)
        return self._entries[name][1]

    def names(self) -> list[str]:
        """Every declared name, sorted, after discovery."""
        self.discover()
        return sorted(self._entries)

    def values(self) -> list[T]:
        """Every entry in name order, after discovery."""
        return [self._entries[name][0] for name in self.names()]

    def loaded(self) -> list[T]:
        """The entries declared so far, in name order, without discovery."""
        return [self._entries[name][0] for name in sorted(self._entries)]
