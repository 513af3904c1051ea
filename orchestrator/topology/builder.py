"""`TopologyBuilder`: the small vocabulary the per-kind modules use to describe a network."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from typing import Callable, Iterable, Mapping

from orchestrator.errors import TopologyError
from orchestrator.topology.model import (
    BRIDGE,
    IFNAMSIZ,
    Endpoint,
    Interface,
    Kind,
    Link,
    NextHop,
    Node,
    Route,
    Topology,
    _Table,
)


MAX_SERVERS = 4096  # beyond this no single machine emulates a lab, and tables grow as N^2


class TopologyBuilder:
    def __init__(self, kind: str, params: dict) -> None:
        self.kind = kind
        self.params = params
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self.routes: dict[str, list[Route]] = {}
        self._neighbour_hop: dict[tuple[str, str], NextHop] = {}

    # -- nodes ------------------------------------------------------------------------------
    def server(self, name: str, forwards: bool = False, **attrs) -> Node:
        return self._add(Node(name, "server", "host", forwards=forwards, attrs=attrs))

    def switch(self, name: str, kind: Kind, **attrs) -> Node:
        node = self._add(Node(name, "switch", kind, forwards=kind == "l3", attrs=attrs))
        if kind == "l2":
            self.bridge(name)
        return node

    def _add(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise TopologyError(f"duplicate node name {node.name!r}")
        self.nodes[node.name] = node
        return node

    def bridge(self, node: str, address: ipaddress.IPv4Interface | None = None) -> None:
        """Give `node` its bridge (an l2 switch's crossbar, or an l3 switch's access LAN)."""
        self._interface(node, Interface(BRIDGE, address=address, is_bridge=True))

    def _interface(self, node: str, iface: Interface) -> None:
        interfaces = self.nodes[node].interfaces
        if iface.name in interfaces:
            raise TopologyError(f"duplicate interface {iface.name!r} on {node}")
        interfaces[iface.name] = iface

    # -- links ------------------------------------------------------------------------------
    def next_ifname(self, node: str) -> str:
        interfaces = self.nodes[node].interfaces
        return f"{node}-eth{len(interfaces) - (BRIDGE in interfaces)}"  # the bridge is no port

    def link(
        self,
        a: str,
        b: str,
        a_address: ipaddress.IPv4Interface | None = None,
        b_address: ipaddress.IPv4Interface | None = None,
        a_ifname: str | None = None,
        b_ifname: str | None = None,
        level: int | None = None,
    ) -> Link:
        """A wire between `a` and `b`. A port of an l2 switch joins its bridge by itself."""
        ends = []
        for node, address, ifname in ((a, a_address, a_ifname), (b, b_address, b_ifname)):
            name = ifname or self.next_ifname(node)
            master = BRIDGE if self.nodes[node].kind == "l2" else None
            self._interface(node, Interface(name, address=address, master=master, level=level))
            ends.append(Endpoint(node, name))
        link = Link(ends[0], ends[1])
        self.links.append(link)
        for here, there in ((link.a, link.b), (link.b, link.a)):
            far = self.nodes[there.node].interfaces[there.interface].address
            self._neighbour_hop[(here.node, there.node)] = NextHop(
                here.interface, far.ip if far is not None else None
            )
        return link

    def enslave(self, node: str, ifname: str) -> None:
        """Put port `ifname` of `node` into the node's bridge (an l3 switch's access port)."""
        interfaces = self.nodes[node].interfaces
        interfaces[ifname] = replace(interfaces[ifname], master=BRIDGE)

    # -- routes -----------------------------------------------------------------------------
    def hop(self, node: str, neighbour: str) -> NextHop:
        """The next hop from `node` straight to a directly wired `neighbour`."""
        try:
            return self._neighbour_hop[(node, neighbour)]
        except KeyError:
            raise TopologyError(f"{node} has no link to {neighbour}") from None

    def route(
        self,
        node: str,
        prefix: ipaddress.IPv4Network | ipaddress.IPv4Address,
        nexthops: Iterable[NextHop],
    ) -> None:
        hops = tuple(nexthops)
        if not hops:
            raise TopologyError(f"route to {prefix} on {node} has no next hop")
        network = prefix if isinstance(prefix, ipaddress.IPv4Network) else ipaddress.IPv4Network(prefix)
        self.routes.setdefault(node, []).append(Route(network, hops))

    def check_size(self, servers: int) -> None:
        if servers > MAX_SERVERS:
            raise TopologyError(
                f"this {self.kind} has {servers} servers; one machine emulates at most "
                f"{MAX_SERVERS}: choose smaller parameters"
            )

    # -- result -----------------------------------------------------------------------------
    def host_routing(self, servers: Mapping[str, object], first_hop: Callable[[str, str], NextHop]) -> "HostRouting":
        """Routes of relaying servers (BCube, torus) given by `first_hop(src, dst)`: see HostRouting."""
        return HostRouting(self.nodes, servers, first_hop)

    def build(self, facts: dict, lazy_routes: "HostRouting | None" = None) -> Topology:
        """The finished topology; `lazy_routes` gives the tables of large kinds on use."""
        for node in self.nodes.values():
            for iface in node.interfaces.values():
                if len(iface.name) > IFNAMSIZ:
                    raise TopologyError(
                        f"interface name {iface.name!r} on {node.name} is longer than Linux's "
                        f"{IFNAMSIZ} characters: this {self.kind} is too large to name"
                    )
        return Topology(
            self.kind, self.params, self.nodes, self.links, self.routes, facts,
            lazy_routes.routes if lazy_routes else None, lazy_routes.lookup if lazy_routes else None,
        )


class HostRouting:
    """The tables of relaying servers: on every server in `servers`, a /32 to every address of
    every other server that is not on one of its own subnets, via `first_hop(src, dst)`.

    The lab installs them whole (`routes`). The cost model only asks where an address goes
    (`lookup`), which is answered from `first_hop` without the table: a 1,024-server torus
    holds 10 M such routes (about 7 GB as Python objects), of which a prediction needs a
    few per server. Both answer alike (tests/unit/test_topology_routing.py)."""

    def __init__(self, nodes: Mapping[str, Node], servers: Mapping[str, object],
                 first_hop: Callable[[str, str], NextHop]) -> None:
        self.nodes, self.servers, self.first_hop = nodes, servers, first_hop
        # one tuple per (node, next hop): the model keys what a hop reaches by the tuple
        self._hops: dict[tuple[str, NextHop], tuple[NextHop, ...]] = {}
        self._connected: dict[str, _Table] = {}  # a node's table of its connected subnets alone

    def routes(self, src: str) -> list[Route]:
        if src not in self.servers:
            return []
        own = {i.address.network for i in self.nodes[src].data_nics()}
        table = []
        for dst in self.servers:
            if dst == src:
                continue
            hop = (self.first_hop(src, dst),)
            for nic in self.nodes[dst].data_nics():
                if nic.address.network not in own:
                    table.append(Route(ipaddress.IPv4Network(nic.address.ip), hop))
        return table

    def lookup(self, topology: Topology, node: str, address: ipaddress.IPv4Address) -> tuple[NextHop, ...]:
        """What the node's table (its connected subnets, which win, then `routes`) gives: an
        address of another server (any address is a data NIC's) off those subnets goes by
        `first_hop`."""
        connected = self._connected.get(node)
        if connected is None:
            connected = self._connected[node] = _Table(self.nodes[node], [])
        hops = connected.lookup(address)
        if hops:
            return hops
        owner = topology.owner(address)
        if node not in self.servers or owner is None or owner.node == node or owner.node not in self.servers:
            return ()
        hop = self.first_hop(node, owner.node)
        return self._hops.setdefault((node, hop), (hop,))
