"""Server coordinates of the level-structured topologies (BCube levels, torus dimensions)
that HiPS, BML and HDRM build their stages on, and the check that a context fits them."""

from __future__ import annotations

from orchestrator.collectives.context import Context
from orchestrator.topology import Topology

Coords = tuple[int, ...]  # indexed by level (BCube) or dimension (torus)


def topology_ranks(ctx: Context, algorithm: str, kinds: tuple[str, ...]) -> tuple[Topology, dict[str, int]]:
    """The context's topology and server name → rank, after checking they fit `algorithm`:
    a topology of one of `kinds`, one rank per server, `ctx.nodes` naming each server once."""
    topology = ctx.topology
    if topology is None:
        raise ValueError(f"{algorithm} needs a {' or '.join(kinds)} topology, and the context has none")
    if topology.kind not in kinds:
        raise ValueError(f"{algorithm} runs on {' or '.join(kinds)} only, not on {topology.kind}")
    servers = [s.name for s in topology.servers]
    if ctx.workers != len(servers):
        raise ValueError(
            f"{algorithm} needs one worker per server: {len(servers)} servers, {ctx.workers} workers"
        )
    names = list(ctx.nodes) if ctx.nodes else servers
    if len(names) != len(servers) or set(names) != set(servers):
        raise ValueError(f"{algorithm}: ctx.nodes must name each of the {len(servers)} servers exactly once")
    return topology, {name: rank for rank, name in enumerate(names)}


def level_coords(topology: Topology, ranks: dict[str, int]) -> tuple[list[Coords], int, int]:
    """(coords per rank indexed by level/dimension, base, h) of a BCube or torus."""
    coords: list[Coords] = [()] * len(ranks)
    for server in topology.servers:
        if topology.kind == "bcube":
            digits = server.attrs["digits"]  # most significant first: reverse to index by level
            coords[ranks[server.name]] = tuple(reversed(digits))
        else:
            coords[ranks[server.name]] = tuple(server.attrs["coords"])
    if topology.kind == "bcube":
        return coords, topology.facts["n"], topology.facts["levels"]
    return coords, topology.facts["k"], topology.facts["d"]


def with_coord(c: Coords, level: int, value: int) -> Coords:
    return c[:level] + (value,) + c[level + 1 :]


def stage_groups(coords: list[Coords], base: int, level: int) -> list[list[int]]:
    """Ranks that share every coordinate but `level`, each group ordered by that coordinate
    (switch port order in BCube, + ring order in a torus)."""
    index = {c: r for r, c in enumerate(coords)}
    return [
        [index[with_coord(c, level, v)] for v in range(base)] for c in coords if c[level] == 0
    ]
