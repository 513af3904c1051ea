"""Mesh (diffuse and collect): all-to-all reduce-scatter, then all-to-all allgather; 2 steps.

Rank j owns chunk j: everyone sends it chunk j at once (N−1 flows into each rank), j adds
them up, then sends the sum to everyone. Each rank sends 2(N−1)/N · S bytes. This is also
PS with the shards colocated on the workers.
"""

from __future__ import annotations

from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


def mesh_steps(
    ranks: list[int], offset: int, length: int, nic: int | None = None
) -> tuple[list[Transfer], list[Transfer]]:
    """(reduce-scatter, allgather) transfers of a mesh among `ranks` over one range; the
    i-th rank of `ranks` ends up owning the i-th chunk. Used by HiPS, BML and FlexTree."""
    pieces = chunks(offset, length, len(ranks))
    scatter = [
        Transfer(src, owner, *pieces[i], "reduce", nic)
        for i, owner in enumerate(ranks) for src in ranks if src != owner
    ]
    gather = [
        Transfer(owner, dst, *pieces[i], "copy", nic)
        for i, owner in enumerate(ranks) for dst in ranks if dst != owner
    ]
    return scatter, gather


def transfers(ctx: Context, length: int) -> int:
    return 2 * ctx.workers * (ctx.workers - 1)


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    schedule = Schedule("mesh", ctx.workers, size)
    scatter, gather = mesh_steps(list(range(ctx.workers)), offset, length)
    schedule.add_step(scatter)
    schedule.add_step(gather)
    return schedule
