"""The recorder's byte-range sets: sorted, disjoint, merged; overlap queries agree with a brute-force set."""

from __future__ import annotations

import random

from helios.runtime.ranges import add_range, overlaps


def test_range_sets_match_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        ranges: tuple[list[int], list[int]] = ([], [])
        covered: set[int] = set()
        for _ in range(rng.randint(1, 12)):
            lo = rng.randint(0, 60)
            hi = lo + rng.randint(1, 10)
            if ranges[0]:
                add_range(ranges, lo, hi)
            else:
                ranges = ([lo], [hi])
            covered |= set(range(lo, hi))
            starts, ends = ranges
            assert all(a < b for a, b in zip(starts, ends, strict=True))
            assert all(ends[i] < starts[i + 1] for i in range(len(starts) - 1))  # touching ranges merge
            assert {x for a, b in zip(starts, ends, strict=True) for x in range(a, b)} == covered
        for _ in range(20):
            lo = rng.randint(0, 70)
            hi = lo + rng.randint(1, 10)
            assert overlaps(ranges, lo, hi) == bool(covered & set(range(lo, hi)))
