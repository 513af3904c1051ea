"""2D (hierarchical) allreduce over Y groups of X ranks; 2(X−1) + 2(Y−1) steps.

1. reduce-scatter inside every group (ring, X−1 steps): the rank at ring position p of its
   group ends with the group's sum of chunk (p+1) mod X (chunks of the range, X of them);
2. allreduce of each chunk across groups (ring RS + AG, 2(Y−1) steps) among the Y ranks,
   one per group, holding the same chunk: all X rings at once;
3. allgather inside every group (ring, X−1 steps).

Bytes per rank: 2(X−1)/X·S inside the group plus 2(Y−1)/(XY)·S across groups, together
ring's 2(N−1)/N·S; only the latter crosses group (switch) boundaries.

Groups, first that applies:
- option `group` = X: consecutive ranks [0, X), [X, 2X), …; ValueError unless X divides N;
- `ctx.topology.facts["groups"]`, a list of server-name lists (servers under one switch),
  mapped to ranks through `ctx.nodes` (or, if empty, the order of `ctx.topology.servers`),
  when the groups restricted to the N ranks are non-empty, equal in size and cover them all;
- else consecutive ranks in groups of the largest divisor of N that is ≤ √N (X = 1, a
  plain ring across "groups", for prime N).
The groups used are in `schedule.meta["groups"]`.
"""

from __future__ import annotations

import math

from typing import Optional

from pydantic import Field

from orchestrator.collectives.context import Context
from orchestrator.collectives.options import MAX_RANKS, AlgorithmOptions
from orchestrator.collectives.algorithms.ring import ring_allgather, ring_reduce_scatter
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


def _topology_groups(ctx: Context) -> list[list[int]] | None:
    topology = ctx.topology
    groups = topology.facts.get("groups") if topology is not None else None
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        return None  # e.g. BCube keeps one list of groups per level: no single grouping
    names = list(ctx.nodes) or [node.name for node in topology.servers]
    rank = {name: r for r, name in enumerate(names[: ctx.workers])}
    mapped = [[rank[name] for name in group if name in rank] for group in groups]
    mapped = [g for g in mapped if g]
    if len({len(g) for g in mapped}) != 1 or sorted(r for g in mapped for r in g) != list(range(ctx.workers)):
        return None
    return mapped


class Options(AlgorithmOptions):
    group: Optional[int] = Field(None, strict=True, ge=1, le=MAX_RANKS, description="ranks per group")


def transfers(ctx: Context, length: int) -> int:
    groups = groups_of(ctx)
    x, g = len(groups[0]), len(groups)
    return 2 * ctx.workers * (x - 1) + 2 * ctx.workers * (g - 1)


def groups_of(ctx: Context) -> list[list[int]]:
    """The groups (lists of ranks) hierarchical allreduce uses; see the module docstring."""
    n = ctx.workers
    x = ctx.option("group")
    if x is None:
        found = _topology_groups(ctx)
        if found is not None:
            return found
        x = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0) if n > 0 else 1
    x = int(x)
    if x < 1 or n % x:
        raise ValueError(f"hierarchical: group size {x} does not divide the {n} workers into equal groups")
    return [list(range(start, start + x)) for start in range(0, n, x)]


def _concurrent(*phases: list[list[Transfer]]) -> list[list[Transfer]]:
    """Steps of independent phases (disjoint ranks or ranges) run side by side."""
    steps: list[list[Transfer]] = [[] for _ in range(max((len(p) for p in phases), default=0))]
    for phase in phases:
        for index, step in enumerate(phase):
            steps[index].extend(step)
    return steps


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    groups = groups_of(ctx)
    schedule = Schedule("hierarchical", ctx.workers, size)
    schedule.meta["groups"] = groups
    if ctx.workers < 2:
        return schedule
    x = len(groups[0])
    pieces = chunks(offset, length, x)
    across = []
    for k, piece in enumerate(pieces):
        holders = [group[(k - 1) % x] for group in groups]  # position p owns chunk p+1
        across.append(ring_reduce_scatter(holders, *piece) + ring_allgather(holders, *piece))
    for step in (
        _concurrent(*(ring_reduce_scatter(g, offset, length) for g in groups))
        + _concurrent(*across)
        + _concurrent(*(ring_allgather(g, offset, length) for g in groups))
    ):
        schedule.add_step(step)
    return schedule
