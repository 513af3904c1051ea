"""Which transfers last touched each range of one rank's buffer, step by step.

The agents order every chunk after the earlier steps' work on its range (agent/engine.py):
a send waits for every earlier receive into its range, an incoming chunk is applied after
every earlier receive into, and send out of, its range. Only the latest of those matter:
a receive of step 5 into X is itself applied only after step 3's receive into X, so a
step-7 send of X need only wait for step 5's. `Ranges` keeps, per piece of the buffer,
the transfers of the latest step that wrote it (`put`), or the sends out of it since then
(`add`, `clear`), so every transfer depends on a handful of others, not on all before it.
"""

from __future__ import annotations

import bisect
from typing import Generic, TypeVar

T = TypeVar("T")


class Ranges(Generic[T]):
    """Disjoint pieces [lo, hi) of a buffer, each with the step and items that last wrote it."""

    def __init__(self) -> None:
        self.pieces: list[list] = []  # [lo, hi, step, items], sorted by lo
        self.ends: list[int] = []  # hi of each piece, for bisection
        # touching()'s answers since the last change: the transfers of one step that read
        # one range (a mesh owner's n−1 sends) share one list instead of n−1 copies
        self._touching: dict[tuple[int, int], list] = {}

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        """Index range of the pieces overlapping [lo, hi)."""
        first = bisect.bisect_right(self.ends, lo)
        last = first
        while last < len(self.pieces) and self.pieces[last][0] < hi:
            last += 1
        return first, last

    def _inside(self, lo: int, hi: int) -> tuple[int, int]:
        """Cut pieces at lo and hi and fill the gaps in [lo, hi) with empty pieces; the index
        range of the pieces that now tile [lo, hi)."""
        first, last = self._span(lo, hi)
        left, tiles, right, cursor = [], [], [], lo
        for a, b, step, items in self.pieces[first:last]:
            if a < lo:
                left.append([a, lo, step, list(items)])
            if b > hi:
                right.append([hi, b, step, list(items)])
            a, b = max(a, lo), min(b, hi)
            if cursor < a:
                tiles.append([cursor, a, -1, []])
            tiles.append([a, b, step, list(items)])
            cursor = b
        if cursor < hi:
            tiles.append([cursor, hi, -1, []])
        replacement = left + tiles + right
        self.pieces[first:last] = replacement
        self.ends[first:last] = [piece[1] for piece in replacement]
        return first + len(left), first + len(left) + len(tiles)

    def put(self, lo: int, hi: int, step: int, item: T) -> None:
        """`item` wrote [lo, hi) in `step`: it replaces writers of earlier steps, joins those
        of the same step."""
        if lo >= hi:
            return
        self._touching.clear()
        first, last = self._inside(lo, hi)
        for piece in self.pieces[first:last]:
            if piece[2] < step:
                piece[2], piece[3] = step, [item]
            else:
                piece[3].append(item)

    def add(self, lo: int, hi: int, item: T) -> None:
        if lo >= hi:
            return
        self._touching.clear()
        first, last = self._inside(lo, hi)
        for piece in self.pieces[first:last]:
            piece[3].append(item)

    def clear(self, lo: int, hi: int) -> None:
        first, last = self._span(lo, hi)
        if first == last:
            return
        self._touching.clear()
        first, last = self._inside(lo, hi)
        for piece in self.pieces[first:last]:
            piece[3] = []

    def touching(self, lo: int, hi: int) -> list[tuple[T, int, int]]:
        """(item, lo', hi'): each item over [lo, hi), with the span of its pieces there. The
        list is shared by calls with the same range until the next change: do not modify it."""
        known = self._touching.get((lo, hi))
        if known is not None:
            return known
        spans: dict[int, list] = {}
        first, last = self._span(lo, hi)
        for a, b, _, items in self.pieces[first:last]:
            a, b = max(a, lo), min(b, hi)
            for item in items:
                span = spans.get(id(item))
                if span is None:
                    spans[id(item)] = [item, a, b]
                else:
                    span[1], span[2] = min(span[1], a), max(span[2], b)
        found = self._touching[(lo, hi)] = [tuple(span) for span in spans.values()]
        return found
