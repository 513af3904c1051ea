"""Ring allreduce: reduce-scatter then allgather around a ring, 2(N−1) steps.

Step s of reduce-scatter: rank r sends chunk (r − s) mod N to r + 1, which adds it in; after
N−1 steps rank r holds the sum of chunk (r + 1) mod N. Allgather passes the finished chunks
on around the ring the same way. Each rank sends 2(N−1)/N · S bytes.
"""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from orchestrator.collectives.context import Context
from orchestrator.collectives.options import MAX_RANKS, AlgorithmOptions
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


class Options(AlgorithmOptions):
    order: Optional[list[Annotated[int, Field(strict=True, ge=0, lt=MAX_RANKS)]]] = Field(
        None, max_length=MAX_RANKS, description="the ranks in ring order, each worker once")


def ring_order(ctx: Context) -> list[int]:
    """Ranks in ring order: as given by the `order` option, else 0..N−1."""
    order = list(ctx.option("order", range(ctx.workers)))
    if sorted(order) != list(range(ctx.workers)):
        raise ValueError(f"ring: order must list each of the {ctx.workers} workers (0 to {ctx.workers - 1}) once")
    return order


def transfers(ctx: Context, length: int) -> int:
    return 2 * ctx.workers * (ctx.workers - 1)


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    order = ring_order(ctx)
    n = len(order)
    schedule = Schedule("ring", ctx.workers, size)
    if n < 2:
        return schedule
    for step in ring_reduce_scatter(order, offset, length) + ring_allgather(order, offset, length):
        schedule.add_step(step)
    return schedule


def ring_reduce_scatter(order: list[int], offset: int, length: int) -> list[list[Transfer]]:
    """n−1 steps of ring reduce-scatter among `order` over the range: step s sends chunk
    (p − s) mod n from position p to p + 1, so p ends owning the sum of chunk (p+1) mod n."""
    n = len(order)
    pieces = chunks(offset, length, n)
    return [
        [Transfer(rank, order[(p + 1) % n], *pieces[(p - s) % n], "reduce") for p, rank in enumerate(order)]
        for s in range(n - 1)
    ]


def ring_allgather(order: list[int], offset: int, length: int) -> list[list[Transfer]]:
    """n−1 steps of ring allgather, starting from the ownership `ring_reduce_scatter` leaves."""
    n = len(order)
    pieces = chunks(offset, length, n)
    return [
        [Transfer(rank, order[(p + 1) % n], *pieces[(p + 1 - s) % n], "copy") for p, rank in enumerate(order)]
        for s in range(n - 1)
    ]
