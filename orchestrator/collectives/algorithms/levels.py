"""Server coordinates of the level-structured topologies (BCube levels, torus dimensions)
that HiPS, BML and HDRM build their stages on, and the check that a context fits them."""

from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import Field, field_validator

from orchestrator.collectives.context import Context
from orchestrator.collectives.options import MAX_RANKS, AlgorithmOptions
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
    return coords, *level_shape(topology)


def level_shape(topology: Topology) -> tuple[int, int]:
    """(base, levels) of a BCube or torus, from its facts alone."""
    if topology.kind == "bcube":
        return topology.facts["n"], topology.facts["levels"]
    return topology.facts["k"], topology.facts["d"]


def with_coord(c: Coords, level: int, value: int) -> Coords:
    return c[:level] + (value,) + c[level + 1 :]


def stage_groups(coords: list[Coords], base: int, level: int) -> list[list[int]]:
    """Ranks that share every coordinate but `level`, each group ordered by that coordinate
    (switch port order in BCube, + ring order in a torus)."""
    index = {c: r for r, c in enumerate(coords)}
    return [
        [index[with_coord(c, level, v)] for v in range(base)] for c in coords if c[level] == 0
    ]


class FailedOptions(AlgorithmOptions):
    """HiPS and BML: the servers that failed (names, or one comma-separated string)."""

    failed: Optional[Union[list[Annotated[str, Field(max_length=64)]], Annotated[str, Field(max_length=65536)]]] = Field(
        None, description="failed servers, e.g. [h11] or h11,h22")

    @field_validator("failed")
    @classmethod
    def _names(cls, value):
        if isinstance(value, str):  # `-o failed=h11,h22`: names, not a string's letters
            value = [name.strip() for name in value.split(",") if name.strip()]
        if value is not None and len(value) > MAX_RANKS:
            raise ValueError(f"at most {MAX_RANKS} servers")
        return value


def stage_transfers(ctx: Context, length: int) -> int:
    """Bound of the transfers of HiPS and BML: h parts through h stages of meshes among `base`
    (BCube: 2 per pair and stage) or of ± rings (torus: 4); with failed servers, the detours
    at most as many again."""
    topology = ctx.topology
    if topology is None or topology.kind not in ("bcube", "torus"):
        return 0  # the build refuses it before making anything
    base, h = level_shape(topology)
    factor = 2 if topology.kind == "bcube" else 4
    return factor * h * h * ctx.workers * (base - 1) * (2 if ctx.option("failed") else 1)
