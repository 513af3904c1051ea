"""Parameter server with M shards: push (reduce) then pull (copy); 2 steps.

The range is cut into M shards (`chunks`). Shard m has one owner: server rank N+m with
separate servers (option `colocated` False, the default), else worker m (M ≤ N). Step 1:
every worker except the owner sends shard m to its owner, which adds it in (servers start
from zeros, so they end with exactly the sum). Step 2: the owner sends the sum to every
worker except itself.

Options: `shards` (M, default N), `colocated` (default False).
Bytes, separate servers: every worker sends S and receives S; every server receives
N·S/M and sends N·S/M, so the lower bound is max(S, N·S/M)·β with push and pull
overlapped. Colocated with M = N this is exactly mesh.
N = 1 needs no communication: no steps.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from orchestrator.collectives.context import Context
from orchestrator.collectives.options import MAX_RANKS, AlgorithmOptions
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


class Options(AlgorithmOptions):
    shards: Optional[int] = Field(None, strict=True, ge=1, le=MAX_RANKS, description="M, default the workers")
    colocated: bool = Field(False, description="shards on the workers instead of separate servers")


def transfers(ctx: Context, length: int) -> int:
    n, shards = ctx.workers, int(ctx.option("shards", ctx.workers))
    if n < 2:
        return 0
    return 2 * shards * (n - 1 if ctx.option("colocated", False) else n)


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    n = ctx.workers
    shards = int(ctx.option("shards", n))
    colocated = bool(ctx.option("colocated", False))
    if shards < 1:
        raise ValueError(f"ps: shards must be at least 1, got {shards}")
    if colocated and shards > n:
        raise ValueError(f"ps: {shards} colocated shards need at least {shards} workers, got {n}")
    owners = list(range(shards)) if colocated else list(range(n, n + shards))
    schedule = Schedule("ps", n if colocated else n + shards, size, workers=tuple(range(n)))
    schedule.meta.update(shards=shards, colocated=colocated)
    if n < 2:
        return schedule
    pieces = chunks(offset, length, shards)
    # an owner only receives its own shard in the push and only sends it in the pull, and
    # a colocated owner sends other shards while receiving its own: never overlapping
    schedule.add_step(
        Transfer(w, owner, *pieces[m], "reduce") for m, owner in enumerate(owners) for w in range(n) if w != owner
    )
    schedule.add_step(
        Transfer(owner, w, *pieces[m], "copy") for m, owner in enumerate(owners) for w in range(n) if w != owner
    )
    return schedule
