"""Topology library: pure descriptions of lab networks (no root, no I/O).

`build(spec)` turns a lab's topology spec (and address pools) into a `Topology`: servers with
their NICs, switches (`l2` bridges or `l3` routers), links, addresses, the static routes of
every forwarding node, and the structural facts algorithms need.
"""

from __future__ import annotations

import ipaddress

# Only the standard library below this package: Mininet's `mn` loads it with Debian's Python.
from orchestrator.errors import TopologyError
from orchestrator.topology import bcube, fattree, graph, switched, torus
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


# Positional parameters of each kind, for `bcube,4,1`-style names (CLI and Mininet's --topo).
SHORTHAND = {
    "bcube": ("n", "k"),
    "fattree": ("k",),
    "torus": ("k", "d"),
    "bigraph": ("switches", "servers_per_switch"),
    "leafspine": ("leaves", "spines", "servers_per_leaf"),
    "star": ("servers",),
}

DEFAULT_DATA = ipaddress.IPv4Network("10.0.0.0/8")
DEFAULT_LINKS = ipaddress.IPv4Network("172.16.0.0/12")


def build(spec, addressing=None) -> Topology:
    """The topology for a topology spec (`BCubeSpec`, …: anything with `kind` and parameters).

    `addressing` is a lab's AddressingSpec (or anything with `data` and `links` networks).
    """
    data = addressing.data if addressing is not None else DEFAULT_DATA
    links = addressing.links if addressing is not None else DEFAULT_LINKS
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
        case "graph":
            return graph.build(list(spec.servers), list(spec.l2), list(spec.l3),
                               [(link.a, link.b, link.bandwidth) for link in spec.links], data, links)
    raise ValueError(f"unknown topology kind {spec.kind!r}")


def from_lab(lab) -> Topology:
    """The topology of a validated LabSpec, with its links' own rates (links.overrides)."""
    topology = build(lab.topology, lab.addressing)
    for index, override in enumerate(lab.links.overrides):
        a, b = override.link.split("-")
        if not topology.links_between(a, b):
            raise TopologyError(f"links.overrides[{index}].link: {override.link}: this {topology.kind} has no link "
                                f"between {a} and {b} (`testbed topology` lists its links)")
        topology.rates[(a, b)] = topology.rates[(b, a)] = float(override.bandwidth)
    return topology
