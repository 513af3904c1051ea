"""Re-forming a collective over the survivors of a failure (pure).

A run that survives failures (runner.driver.run(survive=True)) recompiles its algorithm's
schedule over the live servers after every change of membership. How depends on the
algorithm, registered with it (`register(..., reform=)`, default: `renumber`;
registry.reform dispatches):

- renumber: the live workers become ranks 0..n−1 in their old order, the live parameter
  servers follow; ring, tree, halving-doubling (any n: MPICH's method), mesh, ps (its
  shards re-cut over the live servers), … compile over that as over any n.
- keep_ranks (BML, and HiPS on BCube, which goes on as BML): ranks stay the topology's, the dead servers are named in the `failed`
  option and the algorithm splits the gradient into N−f sets and detours the flows they
  relayed (REFERENCE.md); dead ranks get empty plans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from orchestrator.collectives.context import Context


@dataclass(frozen=True)
class Membership:
    """A compiled membership: the context to build schedules with, and every live server's rank."""

    ctx: Context
    ranks: dict[str, int]  # live node → its rank in the re-formed schedules


Reform = Callable[[Context, list[str], list[str], set[str]], Membership]


def renumber(ctx: Context, workers: list[str], servers: list[str], dead: set[str]) -> Membership:
    """Live workers first, in order, then live servers; options that name ranks remapped."""
    live_workers = [w for w in workers if w not in dead]
    live_servers = [s for s in servers if s not in dead]
    if not live_workers:
        raise ValueError("every worker has failed")
    nodes = live_workers + live_servers
    ranks = {node: rank for rank, node in enumerate(nodes)}
    options = dict(ctx.options)
    if "order" in options:  # a ring's order, by old rank
        options["order"] = [ranks[workers[r]] for r in options["order"] if workers[r] not in dead]
    if servers:  # parameter servers: one shard per live one
        if not live_servers:
            raise ValueError("every parameter server has failed")
        options["shards"] = len(live_servers)
    elif options.get("colocated") and options.get("shards", 0) > len(live_workers):
        options["shards"] = len(live_workers)  # shards on workers: the dead ones' move to the living
    keep_nodes = tuple(nodes) if ctx.nodes else ()
    return Membership(replace(ctx, workers=len(live_workers), nodes=keep_nodes, options=options), ranks)


def keep_ranks(ctx: Context, workers: list[str], servers: list[str], dead: set[str]) -> Membership:
    """Ranks unchanged; the algorithm told which servers failed (option `failed`)."""
    nodes = list(ctx.nodes) or workers + servers
    options = dict(ctx.options) | {"failed": sorted(dead)}
    return Membership(replace(ctx, options=options), {n: r for r, n in enumerate(nodes) if n not in dead})
