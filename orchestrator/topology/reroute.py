"""Routes around dead links: which routes each node must change so that every server
address that can still be reached is reached (pure: no I/O).

The lab's own routes stay wherever they still work. A node's route towards a destination
"works" when each of its next hops lies on a live link and leads strictly closer to the
destination in the surviving network (hop count, relaying only through nodes that forward):
then every path made of such hops ends at the destination, without loops. Where the lab's
hops fail that test, the node gets a /32 override to the destination over its next hops
that are on a shortest surviving path: Fat-Tree, leaf-spine and BiGraph routers drop a dead
next hop from their ECMP groups, BCube and torus servers detour over parallel paths.

With no dead links there are no overrides (every topology's own routes are shortest paths).
"""

from __future__ import annotations

import ipaddress
from collections import deque
from typing import Collection

from orchestrator.topology.model import Endpoint, Link, NextHop, Topology

Overrides = dict[str, dict[ipaddress.IPv4Network, tuple[NextHop, ...]]]  # node → /32 → hops

# (own interface, neighbour node, neighbour's address on the shared segment)
Adjacency = dict[str, list[tuple[str, str, ipaddress.IPv4Address]]]


def dead_ends(dead: Collection[Link]) -> set[Endpoint]:
    return {end for link in dead for end in (link.a, link.b)}


def adjacency(topology: Topology, dead: Collection[Link]) -> Adjacency:
    """Each addressed node's L3 neighbours over live wires (through bridges too)."""
    cut = dead_ends(dead)
    found: Adjacency = {}
    for node in topology.nodes.values():
        nics = node.data_nics()
        if not nics:
            continue  # an l2 switch: crossed by segments, never a hop
        neighbours = found.setdefault(node.name, [])
        for nic in nics:
            start = Endpoint(node.name, nic.name)
            if start in cut:
                continue
            for there in _segment(topology, start, cut):
                address = topology.nodes[there.node].interfaces[there.interface].address
                if address is not None and there.node != node.name:
                    neighbours.append((nic.name, there.node, address.ip))
    return found


def _segment(topology: Topology, start: Endpoint, cut: set[Endpoint]) -> list[Endpoint]:
    """Every interface on `start`'s L2 segment, crossing only live wires."""
    seen, queue = {start}, deque([start])
    while queue:
        here = queue.popleft()
        node = topology.nodes[here.node]
        iface = node.interfaces[here.interface]
        steps = []
        if here not in cut and (wired := topology.peer(here)) is not None:
            steps.append(wired)
        if iface.master is not None:
            steps.append(Endpoint(here.node, iface.master))
        if iface.is_bridge:
            steps += [Endpoint(here.node, p.name) for p in node.interfaces.values() if p.master == iface.name]
        for there in steps:
            if there not in seen:
                seen.add(there)
                queue.append(there)
    return list(seen)


def destinations(topology: Topology, dead: Collection[Link]) -> list[tuple[str, ipaddress.IPv4Address]]:
    """(server, address) of every server NIC on a live link: what must stay reachable."""
    cut = dead_ends(dead)
    return [
        (server.name, nic.address.ip)
        for server in topology.servers
        for nic in server.data_nics()
        if Endpoint(server.name, nic.name) not in cut
    ]


def distances(topology: Topology, graph: Adjacency, target: str) -> dict[str, int]:
    """Hops from each node to `target`, relaying only through nodes that forward."""
    dist, queue = {target: 0}, deque([target])
    while queue:
        here = queue.popleft()
        if here != target and not topology.nodes[here].forwards:
            continue  # reaches the target, carries nobody else's packets there
        for _, there, _ in graph.get(here, ()):
            if there not in dist:
                dist[there] = dist[here] + 1
                queue.append(there)
    return dist


def overrides(topology: Topology, dead: Collection[Link]) -> Overrides:
    """node → {destination /32 → next hops} wherever the lab's own routes no longer work."""
    return _overrides(topology, dead) if dead else {}


def _overrides(topology: Topology, dead: Collection[Link]) -> Overrides:
    cut = dead_ends(dead)
    graph = adjacency(topology, dead)
    owners = {nic.address.ip: node.name for node in topology.nodes.values() for nic in node.data_nics()}
    live_pairs = {node: {(dev, there) for dev, there, _ in hops} for node, hops in graph.items()}
    result: Overrides = {}
    for owner, address in destinations(topology, dead):
        dist = distances(topology, graph, owner)
        prefix = ipaddress.IPv4Network(address)
        for node, hops in graph.items():
            if node == owner or node not in dist:
                continue
            closer = dist[node] - 1
            installed = [h for h in topology.lookup(node, address) if Endpoint(node, h.dev) not in cut]
            working = [h for h in installed if _leads_closer(topology, owners, live_pairs[node], dist, h, owner, closer)]
            if working and len(working) == len(installed):
                continue  # what the kernel holds still works
            wanted = working or _shortest(topology, hops, dist, owner, address, closer)
            if wanted and set(wanted) != set(installed):
                result.setdefault(node, {})[prefix] = tuple(wanted)
    return result


def _leads_closer(topology: Topology, owners: dict, live: set[tuple[str, str]], dist: dict[str, int], hop: NextHop,
                  target: str, closer: int) -> bool:
    """Whether `hop` crosses a live segment to a node strictly closer to `target` that
    forwards (or is the target). On-link hops (no via) lead to the target itself."""
    gateway = owners.get(hop.via) if hop.via is not None else target
    if gateway is None or (hop.dev, gateway) not in live or dist.get(gateway, closer + 1) > closer:
        return False
    return gateway == target or topology.nodes[gateway].forwards


def _shortest(topology: Topology, hops, dist: dict[str, int], owner: str, address: ipaddress.IPv4Address,
              closer: int) -> list[NextHop]:
    chosen: dict[tuple[str, ipaddress.IPv4Address | None], NextHop] = {}
    for dev, there, via in hops:
        if dist.get(there) == closer and (there == owner or topology.nodes[there].forwards):
            hop = NextHop(dev, None if via == address else via)
            chosen.setdefault((hop.dev, hop.via), hop)
    return sorted(chosen.values(), key=lambda h: (h.dev, int(h.via or 0)))
