"""Any network from a file: servers, l2 and l3 switches and the links between them (the
`graph` kind; spec/lab.py's GraphSpec reads it from a lab file, GraphML or networkx
node-link JSON).

How it is addressed and routed, from the graph alone:
- a LAN is an l3 switch's access ports (the servers wired straight to it, gateway .1 on its
  bridge, as a leaf-spine's), or an l2 segment (l2 switches wired to each other, with their
  servers and at most one l3 switch, whose port on it is the gateway .1);
- l3 switches are joined by /31 links and route every LAN they do not hold by shortest paths
  (in l3 hops) to the switch that holds it, over every equal-cost next hop (ECMP);
- a server sends the whole data pool to its LAN's gateway; within a LAN it reaches the others
  on-link. Servers have one NIC each and relay nothing.

Every rule the builder relies on is checked first, in one line naming the node or link:
duplicate nodes, links to nodes that do not exist, servers without a link (or with more
than one, or wired to a server), l2 loops, a LAN with two gateways, and servers that could
not reach each other.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from orchestrator.errors import TopologyError
from orchestrator.topology.addressing import LinkPool, StructuredPool, lan_host_bits
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology


def check(servers: list[str], l2: list[str], l3: list[str], links: Iterable[tuple[str, str]]) -> None:
    """TopologyError (one line) for a graph the builder cannot address and route."""
    role: dict[str, str] = {}
    for kind, names in (("server", servers), ("l2", l2), ("l3", l3)):
        for name in names:
            if name in role:
                raise TopologyError(f"node {name} is listed twice ({role[name]} and {kind}): give each node one name")
            role[name] = kind
    if not servers:
        raise TopologyError("the graph has no server")
    wired: dict[str, list[str]] = {name: [] for name in role}
    seen: set[frozenset[str]] = set()
    for a, b in links:
        for end in (a, b):
            if end not in role:
                raise TopologyError(f"link {a}-{b}: {end} is no node of the graph (a dangling link): list it under "
                                    "servers, l2 or l3")
        if a == b:
            raise TopologyError(f"link {a}-{b} joins a node to itself")
        if frozenset((a, b)) in seen:
            raise TopologyError(f"link {a}-{b} is listed twice: one link per pair of nodes")
        seen.add(frozenset((a, b)))
        if role[a] == role[b] == "server":
            raise TopologyError(f"link {a}-{b} joins two servers: a graph lab's servers relay nothing; put a "
                                "switch between them")
        wired[a].append(b)
        wired[b].append(a)
    for server in servers:
        if not wired[server]:
            raise TopologyError(f"server {server} has no link: wire it to a switch")
        if len(wired[server]) > 1:
            raise TopologyError(f"server {server} has {len(wired[server])} links: a graph lab's servers have one "
                                "NIC each")
    parent = {name: name for name in l2}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    pairs = list(links)
    for a, b in pairs:
        if role[a] == role[b] == "l2":
            if root(a) == root(b):
                raise TopologyError(f"link {a}-{b} closes a loop of l2 switches (no spanning tree here): make one "
                                    "of them l3 or drop the link")
            parent[root(a)] = root(b)
    _reachable(_lans(servers, l2, l3, pairs, role), l3, pairs, role)


def _reachable(lans, l3, pairs, role) -> None:
    """TopologyError unless every LAN with servers can reach every other one."""
    routed = [(gateway, members) for gateway, members, _ in lans if members]
    if len(routed) < 2:
        return
    for gateway, members in routed:
        if gateway is None:
            raise TopologyError(f"servers {', '.join(members[:3])}… are on an l2 segment with no l3 switch, so they "
                                "cannot reach the other LANs: wire an l3 switch to it")
    fabric: dict[str, list[str]] = {name: [] for name in l3}
    for a, b in pairs:
        if role[a] == role[b] == "l3":
            fabric[a].append(b)
            fabric[b].append(a)
    reached = _distances(fabric, routed[0][0])
    for gateway, _ in routed[1:]:
        if gateway not in reached:
            raise TopologyError(f"l3 switch {gateway} has no path to {routed[0][0]}: the servers behind them cannot "
                                "reach each other")


def build(servers: list[str], l2: list[str], l3: list[str], links: list[tuple[str, str, float | None]],
          data_pool, links_pool) -> Topology:
    """The topology of a checked graph; `links`: (a, b, rate in bits/s or None)."""
    check(servers, l2, l3, [(a, b) for a, b, _ in links])
    role = {**{s: "server" for s in servers}, **{s: "l2" for s in l2}, **{s: "l3" for s in l3}}
    builder = TopologyBuilder("graph", {"servers": len(servers), "switches": len(l2) + len(l3), "links": len(links)})
    builder.check_size(len(servers))
    lans = _lans(servers, l2, l3, [(a, b) for a, b, _ in links], role)
    preferred, minimal = lan_host_bits(max(len(members) + 1 for _, members, _ in lans))
    pool = StructuredPool(data_pool, [len(lans)], preferred, "addressing.data", f"a graph of {len(lans)} LANs", minimal)
    p2p = LinkPool(links_pool, sum(1 for a, b, _ in links if role[a] == role[b] == "l3"), "addressing.links")
    for name in l2:
        builder.switch(name, "l2")
    for name in l3:
        builder.switch(name, "l3")
    wired_at = {}  # server → its address on its LAN
    lan_of = {}
    for index, (gateway, members, switches) in enumerate(lans):
        for j, server in enumerate(members):
            wired_at[server], lan_of[server] = StructuredPool.host(pool.subnet(index), j + 2), index
        if gateway is not None and not switches and members:  # an l3 switch's access LAN: gateway on its bridge
            builder.bridge(gateway, StructuredPool.host(pool.subnet(index), 1))
    for rank, server in enumerate(servers):  # ranks in the file's order
        builder.server(server, index=rank, lan=lan_of[server])
    rates: dict[tuple[str, str], float] = {}
    for a, b, rate in links:
        if role[b] == "server":
            a, b = b, a
        if role[a] == "server":  # a server's one NIC: to its access switch or an l2 switch
            link = builder.link(a, b, a_address=wired_at[a])
            if role[b] == "l3":
                builder.enslave(b, link.b.interface)
        elif role[a] == role[b] == "l3":
            builder.link(a, b, *p2p.allocate())
        elif "l3" in (role[a], role[b]):  # an l3 switch's port on an l2 segment: the segment's gateway
            router, switch = (a, b) if role[a] == "l3" else (b, a)
            index = next(i for i, (_, _, members) in enumerate(lans) if switch in members)
            builder.link(router, switch, a_address=StructuredPool.host(pool.subnet(index), 1))
        else:
            builder.link(a, b)
        if rate is not None:
            rates[(a, b)] = rates[(b, a)] = float(rate)
    _routes(builder, lans, l3, links, role, data_pool, pool)
    groups = [members for _, members, _ in lans if members]
    topology = builder.build({"groups": groups, "lans": len(lans), "symmetric": False})
    topology.rates.update(rates)
    return topology


def from_spec(spec, data_pool, links_pool) -> Topology:
    """The `graph` kind's builder: a GraphSpec's nodes and links, each link with its own rate,
    delay and queue where the spec gives them."""
    topology = build(list(spec.servers), list(spec.l2), list(spec.l3),
                     [(link.a, link.b, link.bandwidth) for link in spec.links], data_pool, links_pool)
    for link in spec.links:
        topology.set_link(link.a, link.b, None, getattr(link, "delay", None), getattr(link, "queue", None))
    return topology


def _lans(servers, l2, l3, pairs, role) -> list[tuple[str | None, list[str], list[str]]]:
    """(gateway l3 switch or None, servers, l2 switches) of every LAN: each l2 segment, then
    each l3 switch's access ports."""
    neighbours: dict[str, list[str]] = {name: [] for name in role}
    for a, b in pairs:
        neighbours[a].append(b)
        neighbours[b].append(a)
    lans, placed = [], set()
    for start in l2:
        if start in placed:
            continue
        segment, queue = [], deque([start])
        placed.add(start)
        while queue:
            here = queue.popleft()
            segment.append(here)
            for there in neighbours[here]:
                if role[there] == "l2" and there not in placed:
                    placed.add(there)
                    queue.append(there)
        members = [s for s in servers if neighbours[s][0] in segment]
        ports = [n for switch in segment for n in neighbours[switch] if role[n] == "l3"]
        routers = sorted(set(ports))
        if len(ports) > len(routers):
            twice = next(r for r in routers if ports.count(r) > 1)
            raise TopologyError(f"l3 switch {twice} has {ports.count(twice)} ports on the l2 segment of "
                                f"{', '.join(segment)}: one port per segment (it would hold its address twice)")
        if len(routers) > 1:
            raise TopologyError(f"the l2 segment of {', '.join(segment)} has {len(routers)} l3 switches "
                                f"({', '.join(routers)}): give a segment one gateway")
        lans.append((routers[0] if routers else None, members, segment))
    for switch in l3:
        members = [s for s in servers if neighbours[s][0] == switch]
        if members:
            lans.append((switch, members, []))
    return lans


def _routes(builder: TopologyBuilder, lans, l3, links, role, data_pool, pool) -> None:
    """Servers: the data pool via their gateway. l3 switches: each LAN they do not hold over
    every next hop on a shortest l3 path to its gateway. Refused when a server cannot reach one."""
    fabric: dict[str, list[str]] = {name: [] for name in l3}
    for a, b, _ in links:
        if role[a] == role[b] == "l3":
            fabric[a].append(b)
            fabric[b].append(a)
    routed = [i for i, (gateway, members, _) in enumerate(lans) if members]
    if len(routed) > 1:
        for index in routed:
            gateway, members, _ = lans[index]
            if gateway is None:
                raise TopologyError(f"servers {', '.join(members[:3])}… are on an l2 segment with no l3 switch, so "
                                    "they cannot reach the other LANs: wire an l3 switch to it")
    uplink = {link.a.node: link.b.node for link in builder.links if role[link.a.node] == "server"}
    for index in routed:
        gateway, members, switches = lans[index]
        if gateway is None:
            continue
        gateway_ip = _gateway_ip(builder, gateway, switches)
        for server in members:
            if len(routed) > 1:
                builder.route(server, data_pool, [NextHop(builder.hop(server, uplink[server]).dev, gateway_ip)])
        distance = _distances(fabric, gateway)
        for router in l3:
            if router == gateway:
                continue
            if router not in distance:
                if any(lans[i][0] == router for i in routed):
                    raise TopologyError(f"l3 switch {router} has no path to {gateway}: the servers behind them "
                                        "cannot reach each other")
                continue
            hops = [builder.hop(router, n) for n in fabric[router] if distance.get(n) == distance[router] - 1]
            builder.route(router, pool.subnet(index), hops)


def _gateway_ip(builder: TopologyBuilder, gateway: str, segment: list[str]):
    """The gateway's address on its LAN: its bridge's (access ports) or its port's on the segment."""
    interfaces = builder.nodes[gateway].interfaces
    if not segment:
        return interfaces["br0"].address.ip
    for link in builder.links:
        ends = {link.a.node: link.a, link.b.node: link.b}
        if gateway in ends and (set(ends) - {gateway}) & set(segment):
            return interfaces[ends[gateway].interface].address.ip
    raise TopologyError(f"{gateway} has no port on its segment")  # unreachable: _lans found one


def _distances(fabric: dict[str, list[str]], start: str) -> dict[str, int]:
    distance, queue = {start: 0}, deque([start])
    while queue:
        here = queue.popleft()
        for there in fabric[here]:
            if there not in distance:
                distance[there] = distance[here] + 1
                queue.append(there)
    return distance
