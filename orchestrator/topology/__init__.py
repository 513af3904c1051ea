"""Topology library: pure descriptions of lab networks (no root, no I/O).

`build(spec)` turns a lab's topology spec (and address pools) into a `Topology`: servers with
their NICs, switches (`l2` bridges or `l3` routers), links, addresses, the static routes of
every forwarding node, and the structural facts algorithms need.
"""

from __future__ import annotations

import ipaddress

# Only the standard library below this package: Mininet's `mn` loads it with Debian's Python.
from orchestrator.errors import TopologyError
from orchestrator.topology import bcube, blocks, fattree, graph, groups, layouts, switched, torus
from orchestrator.topology.kinds import KINDS, TopologyKind, kind_of, register_kind
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
    "KINDS", "TopologyKind", "build", "from_lab", "kind_of", "register_kind",
]


# The built-in kinds, registered as a user's kind would be (orchestrator.spec.register_topology
# pairs each with its lab-file model).
for _kind in (
    TopologyKind("bcube", lambda spec, data, links: bcube.build(spec.n, spec.k, data, links), ("n", "k"),
                 "BCube", layouts.bcube, bcube.nic_addresses, groups.bcube, blocks.bcube),
    TopologyKind("fattree", lambda spec, data, links: fattree.build(spec.k, data, links), ("k",),
                 "Fat-Tree", layouts.fattree, None, groups.by_attr("pod", "pod"), blocks.by_attr("pod")),
    TopologyKind("torus", lambda spec, data, links: torus.build(spec.k, spec.d, data, links), ("k", "d"),
                 "Torus", layouts.torus, torus.nic_addresses, groups.torus, blocks.torus),
    TopologyKind("bigraph", lambda spec, data, links: switched.build_bigraph(
        spec.switches, spec.servers_per_switch, data, links), ("switches", "servers_per_switch"),
                 "BiGraph", layouts.bigraph, None, groups.bigraph, blocks.by_switch),
    TopologyKind("leafspine", lambda spec, data, links: switched.build_leafspine(
        spec.leaves, spec.spines, spec.servers_per_leaf, data, links), ("leaves", "spines", "servers_per_leaf"),
                 "Leaf-spine", layouts.leafspine, None, groups.by_attr("switch"), blocks.by_switch),
    TopologyKind("star", lambda spec, data, links: switched.build_star(spec.servers, data, links), ("servers",),
                 "Star", layouts.star, None, groups.none),
    TopologyKind("graph", graph.from_spec, (), "Graph", layouts.graph, None, groups.none),
):
    register_kind(_kind)

DEFAULT_DATA = ipaddress.IPv4Network("10.0.0.0/8")
DEFAULT_LINKS = ipaddress.IPv4Network("172.16.0.0/12")


def build(spec, addressing=None) -> Topology:
    """The topology for a topology spec (`BCubeSpec`, …: anything with `kind` and parameters).

    `addressing` is a lab's AddressingSpec (or anything with `data` and `links` networks).
    """
    data = addressing.data if addressing is not None else DEFAULT_DATA
    links = addressing.links if addressing is not None else DEFAULT_LINKS
    return kind_of(spec.kind).build(spec, data, links)


def from_lab(lab) -> Topology:
    """The topology of a validated LabSpec, with its links' own rates, delays and queues (links.overrides)."""
    topology = build(lab.topology, lab.addressing)
    for index, override in enumerate(lab.links.overrides):
        a, b = override.link.split("-")
        if not topology.links_between(a, b):
            raise TopologyError(f"links.overrides[{index}].link: {override.link}: this {topology.kind} has no link "
                                f"between {a} and {b} (`testbed topology` lists its links)")
        topology.set_link(a, b, None if override.bandwidth is None else float(override.bandwidth), override.delay,
                          override.queue)
    return topology
