"""Device-side timing with timestamp queries, for benchmarks: `with timed() as t: ...; t.ms`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from helios.runtime import context


@dataclass
class Timing:
    """Device milliseconds between the start and the end of a `timed()` block (set when the block exits)."""

    ms: float = float("nan")


@contextmanager
def timed() -> Iterator[Timing]:
    """Bracket the commands recorded inside the block with timestamps; on exit, sync and set `ms`.

    The start timestamp is written once everything recorded before the block has finished, so earlier
    work is not counted. Exiting the block waits for the device.
    """
    rt = context._runtime or context.get_runtime()
    rec = rt.recorder
    pool = rt.take_query_pool()
    result = Timing()
    rec.reset_queries(pool, 0, 2)
    rec.write_timestamp(pool, 0)
    try:
        yield result
    finally:
        rec.write_timestamp(pool, 1)
        rec.wait_all()
        vk, ffi = rt.device.vk, rt.device.ffi
        data = ffi.new("uint64_t[2]")
        flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
        status = vk.lib.vkGetQueryPoolResults(rt.device.device, pool, 0, 2, 16, data, 8, flags)
        rt.give_query_pool(pool)
        if status == vk.VK_SUCCESS:
            result.ms = (int(data[1]) - int(data[0])) * rt.info.timestamp_period_ns / 1e6


def time_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> list[float]:
    """Device ms of each of `repeats` calls of `fn` (which records launches), after `warmup` untimed calls.

    This is the helper `helios.bench.harness` looks up; each call is timed alone, between syncs.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        with timed() as t:
            fn()
        samples.append(t.ms)
    return samples
