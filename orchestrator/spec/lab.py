"""The lab file: one YAML document describing a network and its servers.

Only `name` and `topology` are required:

    name: bcube-4-1
    topology: {kind: bcube, n: 4, k: 1}          # Guo et al. notation: n^(k+1) servers
    links: {bandwidth: 100Mbit, delay: 0ms, jitter: 0ms, loss: 0, queue: 1000, mtu: 1500}
    servers: {runtime: docker, image: testbed/server:latest, cpus: 0.5, memory: 512M, tcp_congestion: cubic}
    rdma: none                                   # or softroce
    management: {subnet: auto}                   # out-of-band network, e.g. 198.18.5.0/24
    addressing: {data: 10.0.0.0/8, links: 172.16.0.0/12}
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)

from orchestrator import units

Name = Annotated[
    str,
    Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,23}$",
        description="lower-case letters, digits and '-', at most 24 characters",
    ),
]


def _wrap(parser):
    def validate(value: Any) -> Any:
        if value is None:
            return value
        return parser(value)

    return validate


Rate = Annotated[int, BeforeValidator(_wrap(units.parse_rate)), PlainSerializer(units.format_rate)]
Seconds = Annotated[
    float,
    BeforeValidator(_wrap(units.parse_duration)),
    PlainSerializer(lambda s: f"{s * 1000:g}ms"),
]
Bytes = Annotated[int, BeforeValidator(_wrap(units.parse_size))]
Percent = Annotated[float, BeforeValidator(_wrap(units.parse_percent))]
Network = Annotated[ipaddress.IPv4Network, PlainSerializer(str)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BCubeSpec(_Strict):
    """BCube(n, k) in Guo et al.'s notation: k+1 levels, n^(k+1) servers, (k+1)·n^k switches."""

    kind: Literal["bcube"]
    n: int = Field(strict=True, ge=2, le=64, description="switch port count")
    k: int = Field(strict=True, ge=0, le=7, description="highest level (k+1 levels)")


class FatTreeSpec(_Strict):
    """Al-Fares fat-tree: k pods, k^3/4 hosts, 5k^2/4 switches."""

    kind: Literal["fattree"]
    k: int = Field(strict=True, ge=2, le=64, description="switch port count, even")

    @field_validator("k")
    @classmethod
    def _even(cls, k: int) -> int:
        if k % 2:
            raise ValueError(f"must be even (got {k}): a fat-tree splits switch ports in halves")
        return k


class TorusSpec(_Strict):
    """k-ary d-cube, server-centric: every server links to its ±1 neighbours in each dimension."""

    kind: Literal["torus"]
    k: int = Field(strict=True, ge=2, le=64, description="nodes per dimension")
    d: int = Field(strict=True, ge=1, le=6, description="dimensions")


class BiGraphSpec(_Strict):
    """EFLOPS BiGraph: switches split in two halves, complete bipartite between them."""

    kind: Literal["bigraph"]
    switches: int = Field(strict=True, ge=2, le=128, description="switch count, even")
    servers_per_switch: int = Field(strict=True, ge=1, le=128)

    @field_validator("switches")
    @classmethod
    def _even(cls, switches: int) -> int:
        if switches % 2:
            raise ValueError(f"must be even (got {switches}): BiGraph has two equal halves")
        return switches


class LeafSpineSpec(_Strict):
    kind: Literal["leafspine"]
    leaves: int = Field(strict=True, ge=1, le=256)
    spines: int = Field(strict=True, ge=1, le=64)
    servers_per_leaf: int = Field(strict=True, ge=1, le=253)


class StarSpec(_Strict):
    """Servers on one L2 switch: the control case for every algorithm."""

    kind: Literal["star"]
    servers: int = Field(strict=True, ge=1, le=4000)


TopologySpec = Annotated[
    Union[BCubeSpec, FatTreeSpec, TorusSpec, BiGraphSpec, LeafSpineSpec, StarSpec],
    Field(discriminator="kind"),
]
TOPOLOGY_KINDS = ("bcube", "fattree", "torus", "bigraph", "leafspine", "star")


class LinksSpec(_Strict):
    """Every fabric link, both directions. Delay, jitter and loss need sch_netem."""

    bandwidth: Rate = Field(default=1_000_000_000, description="e.g. 100Mbit, 1Gbit")
    delay: Seconds = 0.0
    jitter: Seconds = 0.0
    loss: Percent = 0.0
    queue: int = Field(strict=True, default=1000, ge=1, le=1_000_000, description="packets")
    mtu: int = Field(strict=True, default=1500, ge=576, le=65535, description="bytes; 9000 for jumbo frames")

    @property
    def needs_netem(self) -> bool:
        return self.delay > 0 or self.jitter > 0 or self.loss > 0

    @model_validator(mode="after")
    def _jitter_needs_delay(self) -> "LinksSpec":
        if self.jitter > self.delay:
            raise ValueError("jitter must not exceed delay (netem draws delay ± jitter)")
        return self


class ServersSpec(_Strict):
    runtime: Literal["docker", "netns"] = "docker"
    image: str = Field(default="testbed/server:latest", min_length=1)
    cpus: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="CPU share per server, e.g. 0.5"
    )

    @field_validator("cpus", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of CPUs, e.g. 0.5")
        return value
    memory: Bytes | None = Field(default=None, description="memory limit per server, e.g. 512M")
    # Pinned, not inherited: hosts differ (Debian defaults to cubic, some clouds to bbr), and
    # on shaped links BBR's probing stalls single flows for ~100 ms, which a synchronous
    # collective pays on every step (ring on star,8 at 200 Mbit: 0.82 × link with bbr, 0.95
    # with cubic).
    tcp_congestion: str = Field(
        default="cubic", pattern=r"^[a-z0-9_]+$",
        description="TCP congestion control of the servers' data-plane connections, e.g. cubic, reno, bbr, dctcp",
    )


class ManagementSpec(_Strict):
    """Out-of-band network: a bridge in the root namespace, one `mgmt0` on every server."""

    subnet: Network | Literal["auto"] = Field(
        default="auto", description="'auto' picks a free /24 (or larger) in 198.18.0.0/15"
    )


class AddressingSpec(_Strict):
    """Pools for data-plane addresses; they live inside the lab's namespaces only."""

    data: Network = Field(
        default=ipaddress.IPv4Network("10.0.0.0/8"), description="server-facing subnets"
    )
    links: Network = Field(
        default=ipaddress.IPv4Network("172.16.0.0/12"),
        description="router-to-router /31 links",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> "AddressingSpec":
        if self.data.overlaps(self.links):
            raise ValueError(f"data pool {self.data} overlaps links pool {self.links}")
        return self


class LabSpec(_Strict):
    name: Name
    topology: TopologySpec
    links: LinksSpec = LinksSpec()
    servers: ServersSpec = ServersSpec()
    rdma: Literal["none", "softroce"] = "none"
    management: ManagementSpec = ManagementSpec()
    addressing: AddressingSpec = AddressingSpec()

    @model_validator(mode="after")
    def _management_apart(self) -> "LabSpec":
        subnet = self.management.subnet
        if subnet != "auto":
            for pool_name in ("data", "links"):
                pool = getattr(self.addressing, pool_name)
                if subnet.overlaps(pool):
                    raise ValueError(
                        f"management.subnet {subnet} overlaps addressing.{pool_name} {pool}: "
                        "pick disjoint ranges"
                    )
        return self
