"""Ring allreduce: reduce-scatter then allgather around a ring, 2(N−1) steps.

Step s of reduce-scatter: rank r sends chunk (r − s) mod N to r + 1, which adds it in; after
N−1 steps rank r holds the sum of chunk (r + 1) mod N. Allgather passes the finished chunks
on around the ring the same way. Each rank sends 2(N−1)/N · S bytes.
"""

from __future__ import annotations

from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


def ring_order(ctx: Context) -> list[int]:
    """Ranks in ring order: as given by the `order` option, else 0..N−1."""
    return list(ctx.option("order", range(ctx.workers)))


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    order = ring_order(ctx)
    n = len(order)
    schedule = Schedule("ring", ctx.workers, size)
    if n < 2:
        return schedule
    pieces = chunks(offset, length, n)
    for phase, op in (("reduce-scatter", "reduce"), ("allgather", "copy")):
        for s in range(n - 1):
            step = []
            for position, rank in enumerate(order):
                # reduce-scatter sends chunk (p − s); allgather sends the finished (p + 1 − s)
                piece = (position - s + (0 if phase == "reduce-scatter" else 1)) % n
                start, count = pieces[piece]
                step.append(Transfer(rank, order[(position + 1) % n], start, count, op))
            schedule.add_step(step)
    return schedule
