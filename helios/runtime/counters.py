"""Runtime event counters (`helios.runtime.counters()` adds the pool and pipeline state to these)."""

from __future__ import annotations


class Counters:
    """Event counters of the runtime; plain attributes so the hot path increments them cheaply."""

    __slots__ = ("dispatches", "submits", "barriers", "host_waits", "fills", "copies", "uploads", "downloads")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
