"""Sets of byte ranges for hazard tracking: sorted, disjoint lists of starts and ends, merged on insert.

Keeping them merged keeps queries O(log n) even when one arena's many views are written one after another
(their ranges touch and merge into one).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


def overlaps(ranges: tuple[list[int], list[int]], lo: int, hi: int) -> bool:
    """Whether [lo, hi) overlaps one of the sorted, disjoint ranges (starts, ends)."""
    starts, ends = ranges
    if lo >= ends[-1] or hi <= starts[0]:
        return False  # past either end: the common case for views of an arena used in order
    i = bisect_right(starts, lo)
    if i and ends[i - 1] > lo:
        return True
    return i < len(starts) and starts[i] < hi


def add_range(ranges: tuple[list[int], list[int]], lo: int, hi: int) -> None:
    """Insert [lo, hi), merging it with the ranges it overlaps or touches (keeps checks O(log n))."""
    starts, ends = ranges
    last = ends[-1]
    if lo >= last:  # at or past the end: extend the last range or append one
        if lo == last:
            ends[-1] = hi
        else:
            starts.append(lo)
            ends.append(hi)
        return
    i = bisect_left(ends, lo)  # first range ending at or after lo
    if i < len(starts) and starts[i] <= lo and hi <= ends[i]:
        return  # already covered (the same input read by many dispatches)
    j = bisect_right(starts, hi)  # ranges i..j-1 start at or before hi: they merge with [lo, hi)
    if i == j:
        starts.insert(i, lo)
        ends.insert(i, hi)
    else:
        lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
        starts[i:j] = [lo]
        ends[i:j] = [hi]
