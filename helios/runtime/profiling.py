"""Per-dispatch device timing: `with profiling() as p: ...; p.dispatches` gives (kernel, variant, ms) per launch.

While the block is open, every launch records a timestamp pair around its dispatch (into one reused query pool;
no sync per dispatch): the first is written once all earlier commands have completed, the second once the
dispatch has, so a dispatch's ms include its barrier, if one was needed. The results are read at the next drain
(the pool filling up, or the block's exit, which waits for the device). On a device that overlaps dispatches the
pairs serialise them (each start waits for all earlier work), so the sum is an upper bound there; lavapipe runs
dispatches one after another anyway. The cost when not profiling: one None test per launch (Runtime.launch).
Profiling refuses a capture scope: the timestamps would be frozen into every replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from helios.errors import HeliosError
from helios.runtime import context
from helios.runtime.timing import pair_ms

PAIRS = 2048  # timestamp pairs per query pool; a drain (a sync) when it fills


@dataclass
class Profile:
    """What a `profiling()` block saw: one (kernel, variant, ms) per dispatch, in launch order; and beside it, per
    dispatch, which launch it was (the pipeline, so its specialization, and the grid): two launches of one kernel
    and variant with other sizes differ there (the tuner's kernel clock lines steps up by it)."""

    dispatches: list[tuple[str, str, float]] = field(default_factory=list)
    launches: list[tuple[int, int, int, int]] = field(default_factory=list)


class Profiler:
    """The runtime's per-launch hook while profiling (Runtime.profiler): times each dispatch with a timestamp
    pair."""

    def __init__(self, runtime, profile: Profile):
        self.runtime, self.profile = runtime, profile
        dev = runtime.device
        self.vk, self.dev = dev.vk, dev
        self.pool = runtime.create_query_pool(2 * PAIRS)
        self.names: list[tuple[str, str]] = []  # (kernel, variant) of each pair recorded since the last drain
        self.launches: list[tuple[int, int, int, int]] = []  # (pipeline id, grid) of each of them
        self.data = dev.ffi.new(f"uint64_t[{2 * PAIRS}]")
        runtime.recorder.reset_queries(self.pool, 0, 2 * PAIRS)

    def dispatch(self, pipe, buffers, push, gx: int, gy: int, gz: int) -> None:
        """Record one dispatch between two timestamps (called by Runtime.launch in place of recorder.dispatch)."""
        rec = self.runtime.recorder
        if rec.observer is not None:
            raise HeliosError("profiling inside a capture scope: the timestamps would be frozen into every "
                              "replay; profile lazily recorded steps (e.g. HeliosBackend.set_replay(False))")
        if len(self.names) == PAIRS:
            self.drain()
        i = 2 * len(self.names)
        kernel, _, variant = pipe.name.partition(":")  # the pipeline's name: "kernel:variant"
        self.names.append((kernel, variant))
        self.launches.append((id(pipe), gx, gy, gz))
        rec.write_timestamp(self.pool, i)
        rec.dispatch(pipe, buffers, push, gx, gy, gz)
        rec.write_timestamp(self.pool, i + 1)

    def drain(self) -> None:
        """Wait for the device, read the recorded pairs into the profile, and reset the pool."""
        rec = self.runtime.recorder
        rec.wait_all()
        if self.names:
            ms = pair_ms(self.runtime, self.pool, len(self.names), self.data)
            self.profile.dispatches.extend((k, v, t) for (k, v), t in zip(self.names, ms, strict=True))
            self.profile.launches.extend(self.launches)
            self.names.clear()
            self.launches.clear()
            rec.reset_queries(self.pool, 0, 2 * PAIRS)

    def close(self) -> None:
        self.drain()
        self.runtime.recorder.wait_all()  # the pool's reset must have run before it is destroyed
        self.vk.vkDestroyQueryPool(self.dev.device, self.pool, None)


@contextmanager
def profiling() -> Iterator[Profile]:
    """Time every dispatch launched inside the block (see the module docstring); on exit, sync and fill the
    profile. Blocks do not nest."""
    rt = context._runtime or context.get_runtime()
    if rt.profiler is not None:
        raise HeliosError("profiling() blocks do not nest")
    profile = Profile()
    rt.profiler = Profiler(rt, profile)
    try:
        yield profile
    finally:
        prof, rt.profiler = rt.profiler, None
        prof.close()


__all__ = ["Profile", "profiling"]
