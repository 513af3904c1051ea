"""Topology library: pure descriptions of lab networks (no root, no I/O).

`build(spec)` turns a lab's topology spec (and address pools) into a `Topology`: servers with
their NICs, switches (`l2` bridges or `l3` routers), links, addresses, the static routes of
every forwarding node, and the structural facts algorithms need.
"""

from __future__ import annotations

from orchestrator.spec.lab import AddressingSpec, LabSpec
from orchestrator.topology import bcube, fattree, switched, torus
from orchestrator.topology.model import (
    Endpoint,
    Interface,
    Link,
    NextHop,
    Node,
    Route,
    RoutingError,
    Topology,
)

__all__ = [
    "Endpoint", "Interface", "Link", "NextHop", "Node", "Route", "RoutingError", "Topology",
    "build", "from_lab",
]


def build(spec, addressing: AddressingSpec | None = None) -> Topology:
    """The topology for a topology spec (`BCubeSpec`, `FatTreeSpec`, …)."""
    addressing = addressing or AddressingSpec()
    data, links = addressing.data, addressing.links
    match spec.kind:
        case "bcube":
            return bcube.build(spec.n, spec.k, data, links)
        case "fattree":
            return fattree.build(spec.k, data, links)
        case "torus":
            return torus.build(spec.k, spec.d, data, links)
        case "bigraph":
            return switched.build_bigraph(spec.switches, spec.servers_per_switch, data, links)
        case "leafspine":
            return switched.build_leafspine(
                spec.leaves, spec.spines, spec.servers_per_leaf, data, links
            )
        case "star":
            return switched.build_star(spec.servers, data, links)
    raise ValueError(f"unknown topology kind {spec.kind!r}")


def from_lab(lab: LabSpec) -> Topology:
    return build(lab.topology, lab.addressing)
