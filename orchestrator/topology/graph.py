"""Any network from a file: servers, l2 and l3 switches and the links between them (the
`graph` kind; spec/lab.py's GraphSpec reads it from a lab file, GraphML or networkx
node-link JSON).

How it is addressed and routed, from the graph alone:
- a LAN is an l3 switch's access ports (the servers wired straight to it, gateway .1 on its
  bridge, as a leaf-spine's), an l2 segment (l2 switches wired to each other, with the
  servers wired to them and at most one l3 switch, whose port on it is the gateway .1), or a
  wire between two servers;
- l3 switches are joined by /31 links;
- a server has one NIC per link, addressed on that link's LAN; its first link in the file is
  its primary NIC, where transfers to it are addressed;
- servers listed under `relays` forward packets that are not theirs (as BCube's and DCell's
  servers do); no other server does, so no path passes through one;
- every node routes each LAN it is not on over every next hop on a shortest path to it
  (counted in hops through l3 switches and relays): ECMP wherever paths tie. A server's most
  common next hops cover the whole data pool in one route.

Every rule the builder relies on is checked first, in one line naming the node or link:
duplicate nodes, links to nodes that do not exist, servers without a link, two servers wired
together with neither relaying, two NICs of one node on one segment, l2 loops, a LAN with two
gateways, and servers that could not reach each other.
"""

from __future__ import annotations

import ipaddress
from collections import Counter, deque
from typing import Iterable, NamedTuple

from orchestrator.errors import TopologyError
from orchestrator.topology.addressing import LinkPool, StructuredPool, lan_host_bits
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology


class Lan(NamedTuple):
    gateway: str | None  # the l3 switch holding .1 (its bridge or its port on a segment)
    servers: list[str]  # in the file's order of servers
    switches: list[str]  # the l2 switches of a segment; [] for access ports or a server wire


def check(servers: list[str], l2: list[str], l3: list[str], links: Iterable[tuple[str, str]],
          relays: Iterable[str] = ()) -> None:
    """TopologyError (one line) for a graph the builder cannot address and route."""
    _checked(servers, l2, l3, list(links), list(relays))


def _checked(servers, l2, l3, pairs, relays) -> tuple[dict[str, str], list[Lan]]:
    """The role of each node and the LANs of a graph that passes every rule."""
    role: dict[str, str] = {}
    for kind, names in (("server", servers), ("l2", l2), ("l3", l3)):
        for name in names:
            if name in role:
                raise TopologyError(f"node {name} is listed twice ({role[name]} and {kind}): give each node one name")
            role[name] = kind
    if not servers:
        raise TopologyError("the graph has no server")
    for name in relays:
        if role.get(name) != "server":
            raise TopologyError(f"relays: {name} is no server of the graph: list the servers that forward")
    relaying = set(relays)
    wired: dict[str, list[str]] = {name: [] for name in role}
    seen: set[frozenset[str]] = set()
    for a, b in pairs:
        for end in (a, b):
            if end not in role:
                raise TopologyError(f"link {a}-{b}: {end} is no node of the graph (a dangling link): list it under "
                                    "servers, l2 or l3")
        if a == b:
            raise TopologyError(f"link {a}-{b} joins a node to itself")
        if frozenset((a, b)) in seen:
            raise TopologyError(f"link {a}-{b} is listed twice: one link per pair of nodes")
        seen.add(frozenset((a, b)))
        if role[a] == role[b] == "server" and not relaying & {a, b}:
            raise TopologyError(f"link {a}-{b} joins two servers and neither relays, so no one else could use it: "
                                f"list one under relays, or put a switch between them")
        wired[a].append(b)
        wired[b].append(a)
    for server in servers:
        if not wired[server]:
            raise TopologyError(f"server {server} has no link: wire it to a switch")
    parent = {name: name for name in l2}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for a, b in pairs:
        if role[a] == role[b] == "l2":
            if root(a) == root(b):
                raise TopologyError(f"link {a}-{b} closes a loop of l2 switches (no spanning tree here): make one "
                                    "of them l3 or drop the link")
            parent[root(a)] = root(b)
    lans = _lans(servers, l2, l3, pairs, role)
    _reachable(servers, lans, pairs, role, relaying)
    return role, lans


def _reachable(servers, lans: list[Lan], pairs, role, relaying) -> None:
    """TopologyError unless every server reaches every LAN with servers on it. LANs joined by
    a node that forwards (an l3 switch, a relay) or an l3–l3 link are one component; a server
    reaches the components of its own LANs."""
    parent = list(range(len(lans)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    on: dict[str, list[int]] = {}
    for index, lan in enumerate(lans):
        for node in [*lan.servers, *([lan.gateway] if lan.gateway else [])]:
            on.setdefault(node, []).append(index)
    for a, b in pairs:  # an l3–l3 link: its ends' LANs meet
        if role[a] == role[b] == "l3":
            parent.append(len(parent))
            for end in (a, b):
                on.setdefault(end, []).append(len(parent) - 1)
    for node, indices in on.items():
        if role[node] == "l3" or node in relaying:
            for index in indices[1:]:
                parent[root(index)] = root(indices[0])
    wanted = {root(i): lan for i, lan in enumerate(lans) if lan.servers}
    for server in servers:
        missing = set(wanted) - {root(i) for i in on[server]}
        if missing:
            far = wanted[min(missing)].servers[0]
            raise TopologyError(f"server {server} cannot reach {far}: no l3 switch or relay forwards between their "
                                "LANs; wire an l3 switch between them, or list a server on the way under relays")


def build(servers: list[str], l2: list[str], l3: list[str], links: list[tuple[str, str, float | None]],
          data_pool, links_pool, relays: Iterable[str] = ()) -> Topology:
    """The topology of a checked graph; `links`: (a, b, rate in bits/s or None); `relays`:
    the servers that forward."""
    relays = list(relays)
    pairs = [(a, b) for a, b, _ in links]
    role, lans = _checked(servers, l2, l3, pairs, relays)
    builder = TopologyBuilder("graph", {"servers": len(servers), "switches": len(l2) + len(l3), "links": len(links)})
    builder.check_size(len(servers))
    preferred, minimal = lan_host_bits(max(len(lan.servers) + 1 for lan in lans))
    pool = StructuredPool(data_pool, [len(lans)], preferred, "addressing.data", f"a graph of {len(lans)} LANs", minimal)
    p2p = LinkPool(links_pool, sum(1 for a, b in pairs if role[a] == role[b] == "l3"), "addressing.links")
    for name in l2:
        builder.switch(name, "l2")
    for name in l3:
        builder.switch(name, "l3")
    segment_of = {switch: index for index, lan in enumerate(lans) for switch in lan.switches}
    access_of = {lan.gateway: index for index, lan in enumerate(lans) if lan.gateway is not None and not lan.switches}
    wire_of = {frozenset(lan.servers): index for index, lan in enumerate(lans) if lan.gateway is None and not lan.switches}
    for index, lan in enumerate(lans):
        if lan.gateway is not None and not lan.switches:  # an l3 switch's access LAN: gateway on its bridge
            builder.bridge(lan.gateway, StructuredPool.host(pool.subnet(index), 1))

    def lan_index(server: str, other: str) -> int:
        """The LAN a server's link to `other` puts its NIC on."""
        if role[other] == "server":
            return wire_of[frozenset((server, other))]
        return segment_of[other] if role[other] == "l2" else access_of[other]

    address = {(server, index): StructuredPool.host(pool.subnet(index), j + 2)
               for index, lan in enumerate(lans) for j, server in enumerate(lan.servers)}
    primary = {}
    for a, b in pairs:
        for server, other in ((a, b), (b, a)):
            if role[server] == "server":
                primary.setdefault(server, lan_index(server, other))
    relaying = set(relays)
    for rank, server in enumerate(servers):  # ranks in the file's order
        builder.server(server, forwards=server in relaying, index=rank, lan=primary[server])
    rates: dict[tuple[str, str], float] = {}
    for a, b, rate in links:
        if role[b] == "server" and role[a] != "server":
            a, b = b, a
        if role[a] == role[b] == "server":
            index = lan_index(a, b)
            builder.link(a, b, a_address=address[(a, index)], b_address=address[(b, index)])
        elif role[a] == "server":  # a server's NIC: to its access switch or an l2 switch
            link = builder.link(a, b, a_address=address[(a, lan_index(a, b))])
            if role[b] == "l3":
                builder.enslave(b, link.b.interface)
        elif role[a] == role[b] == "l3":
            builder.link(a, b, *p2p.allocate())
        elif "l3" in (role[a], role[b]):  # an l3 switch's port on an l2 segment: the segment's gateway
            router, switch = (a, b) if role[a] == "l3" else (b, a)
            builder.link(router, switch, a_address=StructuredPool.host(pool.subnet(segment_of[switch]), 1))
        else:
            builder.link(a, b)
        if rate is not None:
            rates[(a, b)] = rates[(b, a)] = float(rate)
    targets = [pool.subnet(index) for index, lan in enumerate(lans) if lan.servers]
    _routes(builder, targets, data_pool)
    groups: dict[int, list[str]] = {}
    for server in servers:  # each server in the group of its primary NIC's LAN
        groups.setdefault(primary[server], []).append(server)
    topology = builder.build({"groups": list(groups.values()), "lans": len(lans), "symmetric": False,
                              "relays": relays})
    topology.rates.update(rates)
    return topology


def from_spec(spec, data_pool, links_pool) -> Topology:
    """The `graph` kind's builder: a GraphSpec's nodes and links, each link with its own rate,
    delay and queue where the spec gives them."""
    topology = build(list(spec.servers), list(spec.l2), list(spec.l3),
                     [(link.a, link.b, link.bandwidth) for link in spec.links], data_pool, links_pool,
                     list(getattr(spec, "relays", ())))
    for link in spec.links:
        topology.set_link(link.a, link.b, None, getattr(link, "delay", None), getattr(link, "queue", None))
    return topology


def _lans(servers, l2, l3, pairs, role) -> list[Lan]:
    """Every LAN: each l2 segment, then each l3 switch's access ports, then each wire between
    two servers. Two NICs of one node on one segment are refused (it would hold two
    addresses of one subnet)."""
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
        ports = Counter(n for switch in segment for n in neighbours[switch] if role[n] != "l2")
        twice = next((node for node, count in ports.items() if count > 1), None)
        if twice is not None:
            raise TopologyError(f"{role[twice]} {'switch ' if role[twice] == 'l3' else ''}{twice} has {ports[twice]} "
                                f"ports on the l2 segment of {', '.join(segment)}: one port per segment (it would "
                                "hold its address twice)")
        routers = sorted(n for n in ports if role[n] == "l3")
        if len(routers) > 1:
            raise TopologyError(f"the l2 segment of {', '.join(segment)} has {len(routers)} l3 switches "
                                f"({', '.join(routers)}): give a segment one gateway")
        lans.append(Lan(routers[0] if routers else None, [s for s in servers if s in ports], segment))
    for switch in l3:
        members = [s for s in servers if switch in neighbours[s]]
        if members:
            lans.append(Lan(switch, members, []))
    for a, b in pairs:
        if role[a] == role[b] == "server":
            lans.append(Lan(None, [a, b], []))
    return lans


def _routes(builder: TopologyBuilder, targets: list[ipaddress.IPv4Network], data_pool) -> None:
    """Routes of every node to each target LAN it is not on, over every next hop on a shortest
    path (breadth first from the LAN, through forwarding nodes only). A server's most common
    next hops stand for the whole data pool. Servers that do not forward and sit on the same
    LANs share one table (computed once: a leaf's servers are routed alike)."""
    index: dict[ipaddress.IPv4Network, int] = {}
    nets: dict[str, list[tuple[int, str]]] = {}  # node → (LAN, its NIC there)
    forwarding: list[list[tuple[str, ipaddress.IPv4Address]]] = []  # LAN → who forwards there, at what address
    forwards = {name for name, node in builder.nodes.items() if node.forwards}
    for node in builder.nodes.values():
        for nic in node.data_nics():
            lan = index.setdefault(nic.address.network, len(index))
            if lan == len(forwarding):
                forwarding.append([])
            nets.setdefault(node.name, []).append((lan, nic.name))
            if node.name in forwards:
                forwarding[lan].append((node.name, nic.address.ip))
    alike: dict[tuple[int, ...], list[str]] = {}  # the LANs of servers that do not forward → those servers
    for server in builder.nodes.values():
        if server.is_server and server.name not in forwards:
            alike.setdefault(tuple(sorted(lan for lan, _ in nets[server.name])), []).append(server.name)
    Hops = tuple[tuple[int, str, ipaddress.IPv4Address], ...]  # (LAN, the sender's NIC, via)
    tables: dict[str, dict[ipaddress.IPv4Network, Hops]] = {}  # forwarding servers' tables
    shared: dict[tuple[int, ...], dict[ipaddress.IPv4Network, tuple[tuple[int, ipaddress.IPv4Address], ...]]] = {}
    for target in targets:
        goal = index[target]
        distance = {node: 0 for node, _ in forwarding[goal]}
        frontier = list(distance)
        while frontier:  # over forwarding nodes only: nobody else passes a packet on
            later = []
            for here in frontier:
                for lan, _ in nets[here]:
                    for there, _ in forwarding[lan]:
                        if there not in distance:
                            distance[there] = distance[here] + 1
                            later.append(there)
            frontier = later
        for node, steps in distance.items():
            if steps == 0:
                continue
            hops = tuple((lan, dev, via) for lan, dev in nets[node]
                         for there, via in forwarding[lan] if distance[there] == steps - 1)
            if builder.nodes[node].is_server:
                tables.setdefault(node, {})[target] = hops
            else:
                builder.route(node, target, [NextHop(dev, via) for _, dev, via in hops])
        for lans in alike:
            if goal in lans:
                continue
            near = min(distance.get(there, len(distance)) for lan in lans for there, _ in forwarding[lan])
            shared.setdefault(lans, {})[target] = tuple(
                (lan, via) for lan in lans for there, via in forwarding[lan] if distance.get(there) == near)
    for server, table in tables.items():
        _server_table(builder, server, table, data_pool, lambda hops: [NextHop(dev, via) for _, dev, via in hops])
    for lans, table in shared.items():
        for server in alike[lans]:
            dev = dict(nets[server])
            _server_table(builder, server, table, data_pool, lambda hops: [NextHop(dev[lan], via) for lan, via in hops])


def _server_table(builder: TopologyBuilder, server: str, table: dict, data_pool, hops_of) -> None:
    """One route for the whole data pool over the most common next hops, one per LAN reached
    otherwise."""
    common = Counter(table.values()).most_common(1)[0][0]
    builder.route(server, data_pool, hops_of(common))
    for target, hops in table.items():
        if hops != common:
            builder.route(server, target, hops_of(hops))
