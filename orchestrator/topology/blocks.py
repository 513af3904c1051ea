"""The blocks of a topology: groups of nodes that should share a host when a lab spans
several (topology/partition.py), in an order where neighbouring blocks are near in the
network. A kind registers its blocks (topology/kinds.py); nodes in no block (BCube's upper
levels, Fat-Tree cores, spines) are shared out afterwards.

- BCube: a level-0 switch and its servers (the upper levels join groups).
- Fat-Tree: a pod, its edge and aggregation switches and hosts.
- torus: a slab, the servers of one first coordinate (only its rings along dimension 0 cross).
- BiGraph, leaf-spine: a switch and its servers.
"""

from __future__ import annotations

from orchestrator.topology.model import Topology

Blocks = list[list[str]]


def bcube(topology: Topology) -> Blocks:
    level0 = sorted((n for n in topology.switches if n.attrs.get("level") == 0), key=lambda n: n.attrs["index"])
    return [[switch.name, *(link.other(switch.name).node for link in topology.links_of(switch.name))]
            for switch in level0]


def by_attr(attr: str):
    """One block per value of a node attribute, servers and switches alike (`pod`)."""
    def blocks(topology: Topology) -> Blocks:
        out: dict = {}
        for node in topology.nodes.values():
            if attr in node.attrs:
                out.setdefault(node.attrs[attr], []).append(node.name)
        return [out[key] for key in sorted(out)]

    return blocks


def torus(topology: Topology) -> Blocks:
    out: dict[int, list[str]] = {}
    for server in topology.servers:
        out.setdefault(server.attrs["coords"][0], []).append(server.name)
    return [out[key] for key in sorted(out)]


def by_switch(topology: Topology) -> Blocks:
    """A switch and the servers whose `switch` it is."""
    out: dict[str, list[str]] = {}
    for server in topology.servers:
        if "switch" in server.attrs:
            out.setdefault(server.attrs["switch"], [server.attrs["switch"]]).append(server.name)
    return list(out.values())
