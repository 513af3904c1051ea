"""Views of a topology for people and programs: counts, diameter, and a JSON document."""

from __future__ import annotations

from collections import Counter

import networkx as nx

from orchestrator.topology.model import Endpoint, Topology


def graph(topology: Topology) -> nx.MultiGraph:
    """Nodes and links as a networkx multigraph (node attribute `role`, `kind`)."""
    g = nx.MultiGraph()
    for node in topology.nodes.values():
        g.add_node(node.name, role=node.role, kind=node.kind, **node.attrs)
    for link in topology.links:
        g.add_edge(link.a.node, link.b.node, a=link.a.interface, b=link.b.interface)
    return g


def diameter(topology: Topology) -> tuple[int, int]:
    """(links, switches) on the longest shortest path between two servers.

    Every kind we build is symmetric under its automorphisms (any server can be mapped onto
    any other), so one server's eccentricity is the diameter; tests check this against all
    sources on small sizes. Routing follows shortest paths, so this is also the routed
    diameter (tests check that too).
    """
    servers = topology.servers
    if len(servers) < 2:
        return 0, 0
    g = nx.Graph(graph(topology))
    sources = servers[:1] if topology.facts.get("symmetric", True) else servers  # a graph file's: every one
    best: tuple[int, int] = (0, 0)
    for source in sources:
        paths = nx.single_source_shortest_path(g, source.name)
        far = max((s.name for s in servers if s.name != source.name and s.name in paths),
                  key=lambda name: len(paths[name]), default=None)
        if far is not None:
            best = max(best, topology.hop_counts(paths[far]))
    return best


def summary(topology: Topology) -> dict:
    servers, switches = topology.servers, topology.switches
    nics = Counter(len(s.data_nics()) for s in servers)
    links, switch_hops = diameter(topology)
    return {
        "kind": topology.kind,
        "params": topology.params,
        "servers": len(servers),
        "switches": len(switches),
        "switches_by_kind": dict(Counter(s.kind for s in switches)),
        "links": len(topology.links),
        "nics_per_server": sorted(nics)[0] if len(nics) == 1 else dict(nics),
        "diameter_links": links,
        "diameter_switches": switch_hops,
        "relaying_servers": any(s.forwards for s in servers),
    }


def to_json(topology: Topology, with_routes: bool = False) -> dict:
    """The whole topology as plain data (what `testbed topology --json` prints)."""
    def interfaces(node, addressed_only: bool) -> list[dict]:
        out = []
        for iface in node.interfaces.values():
            if addressed_only and iface.address is None:
                continue
            peer = topology.peer(Endpoint(node.name, iface.name))
            entry = {"name": iface.name, "address": str(iface.address) if iface.address else None}
            if iface.level is not None:
                entry["level"] = iface.level
            if peer is not None:
                entry["peer"] = {"node": peer.node, "interface": peer.interface}
            if iface.master:
                entry["bridge"] = iface.master
            out.append(entry)
        return out

    def attrs(node) -> dict:
        return {key: list(v) if isinstance(v, tuple) else v for key, v in node.attrs.items()}

    doc = {
        "kind": topology.kind,
        "params": topology.params,
        "summary": summary(topology),
        "servers": [
            {"name": s.name, "rank": rank, "forwards": s.forwards, "nics": interfaces(s, True), **attrs(s)}
            for rank, s in enumerate(topology.servers)
        ],
        "switches": [
            {"name": s.name, "kind": s.kind, "ports": interfaces(s, False), **attrs(s)}
            for s in topology.switches
        ],
        "links": [
            {"a": l.a.node, "a_interface": l.a.interface, "b": l.b.node, "b_interface": l.b.interface}
            for l in topology.links
        ],
        "facts": topology.facts,
    }
    if with_routes:
        doc["routes"] = {
            name: [
                {
                    "prefix": str(r.prefix),
                    "nexthops": [{"dev": h.dev, "via": str(h.via) if h.via else None} for h in r.nexthops],
                }
                for r in topology.routes_of(name)
            ]
            for name in topology.nodes
        }
    return doc
