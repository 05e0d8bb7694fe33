"""Device-side timing with timestamp queries, for benchmarks: `with timed() as t: ...; t.ms`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from helios.errors import HeliosError
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
        try:
            result.ms = pair_ms(rt, pool, 1, rt.device.ffi.new("uint64_t[2]"))[0]
        except HeliosError:  # the driver could not read them: ms stays NaN
            pass
        finally:
            rt.give_query_pool(pool)


def pair_ms(rt, pool, pairs: int, data) -> list[float]:
    """Device ms between the two timestamps of each of the first `pairs` pairs of `pool` (entries 2j and 2j + 1),
    read into `data` (a uint64_t[2 * pairs] or larger), waiting for them; a HeliosError naming the VkResult where
    the driver cannot read them."""
    vk = rt.device.vk
    flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
    status = vk.lib.vkGetQueryPoolResults(rt.device.device, pool, 0, 2 * pairs, 16 * pairs, data, 8, flags)
    if status != vk.VK_SUCCESS:
        raise HeliosError(f"vkGetQueryPoolResults failed ({status}) reading {pairs} timestamp pair(s)")
    period = rt.info.timestamp_period_ns / 1e6
    return [(int(data[2 * j + 1]) - int(data[2 * j])) * period for j in range(pairs)]


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
