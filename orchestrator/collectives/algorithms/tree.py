"""Binomial tree: reduce the whole range to rank 0, then broadcast it back; 2⌈log2 N⌉ steps.

Reduce step t (t = 0 … ⌈log2 N⌉−1): every rank r whose lowest set bit is 2^t (the ranks
still holding an unsent partial sum) sends the whole range to r − 2^t, which adds it in.
Broadcast retraces the tree top-down with copies: at step t (t = ⌈log2 N⌉−1 … 0) every
rank r that is a multiple of 2^(t+1) sends to r + 2^t, if that rank exists. Any N.

Bytes: every rank except 0 sends S up once and receives S down once; rank r receives
from (and later sends to) its children r + 2^t for 2^t below its lowest set bit, so the
root receives and sends ⌈log2 N⌉·S. In total 2(N−1)·S cross the network; the time is
2⌈log2 N⌉(α + Sβ) + ⌈log2 N⌉·Sγ, the root's links being the bottleneck.
"""

from __future__ import annotations

from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer


def transfers(ctx: Context, length: int) -> int:
    return 2 * max(0, ctx.workers - 1)


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    n = ctx.workers
    schedule = Schedule("tree", n, size)
    levels = (n - 1).bit_length()  # ⌈log2 N⌉, 0 for N = 1
    for t in range(levels):
        # senders have bit t set and lower bits clear, receivers bit t clear: never both
        schedule.add_step(
            Transfer(r, r - (1 << t), offset, length, "reduce") for r in range(1 << t, n, 1 << (t + 1))
        )
    for t in reversed(range(levels)):
        schedule.add_step(
            Transfer(r, r + (1 << t), offset, length, "copy") for r in range(0, n - (1 << t), 1 << (t + 1))
        )
    return schedule
