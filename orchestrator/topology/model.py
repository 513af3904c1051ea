"""The pure description of a lab network: nodes, interfaces, links, addresses and routes.

Nothing here touches the system. A `Topology` is what every other layer reads: emulation
makes it live, the cost model maps schedules onto its routes, the CLI draws and describes
it. Routes are per-node tables as Linux would hold them (connected routes are implied by
interface addresses); `path()` walks them hop by hop, through L2 bridges, exactly as a
packet would, so a test can prove that every pair is reachable without loops.
"""

from __future__ import annotations

import copy
import functools

import ipaddress
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal

from orchestrator.errors import TopologyError

IFNAMSIZ = 15  # Linux interface names hold at most 15 characters

Role = Literal["server", "switch"]
Kind = Literal["host", "l2", "l3"]
BRIDGE = "br0"  # the bridge inside an l2 switch, or the access bridge of an l3 switch

# What the kernel of a node that forwards (`Node.forwards`) is set to, in the lab and under
# Mininet alike. ECMP hashes the 5-tuple the way a switch does (policy 3 with these fields),
# not policy 1: that one uses a forwarded TCP packet's socket hash (sk_txhash, random per
# connection and drawn again after a timeout), which no route lookup can see, so the cost
# model's paths (Lab.connection_paths) would not be the packets' and a flow could move
# mid-run.
MULTIPATH_HASH_FIELDS = 0x01 | 0x02 | 0x04 | 0x10 | 0x20  # src, dst address; protocol; src, dst port
FORWARDING_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.all.rp_filter": "0",  # BCube and torus routes are asymmetric
    "net.ipv4.conf.default.rp_filter": "0",
    "net.ipv4.fib_multipath_hash_policy": "3",
    "net.ipv4.fib_multipath_hash_fields": hex(MULTIPATH_HASH_FIELDS),
}


# Entries of the L2 search trees a topology keeps (one tree per interface a path starts
# from, an entry per interface it reaches): about 100 bytes each, so at most ~150 MB.
L2_TREE_ENTRIES = 1_500_000


@dataclass(frozen=True)
class Interface:
    name: str
    address: ipaddress.IPv4Interface | None = None
    master: str | None = None  # the bridge this port is enslaved to
    is_bridge: bool = False
    level: int | None = None  # BCube level / torus dimension this NIC serves, if any


@dataclass(frozen=True)
class Endpoint:
    node: str
    interface: str

    def __str__(self) -> str:
        return f"{self.node}:{self.interface}"


@dataclass(frozen=True)
class Link:
    a: Endpoint
    b: Endpoint

    def other(self, node: str) -> Endpoint:
        return self.b if self.a.node == node else self.a

    def nodes(self) -> tuple[str, str]:
        return self.a.node, self.b.node


@dataclass(frozen=True)
class NextHop:
    dev: str
    via: ipaddress.IPv4Address | None = None  # None: the destination is on-link


@dataclass(frozen=True)
class Route:
    prefix: ipaddress.IPv4Network
    nexthops: tuple[NextHop, ...]

    @property
    def is_ecmp(self) -> bool:
        return len(self.nexthops) > 1


@dataclass
class Node:
    name: str
    role: Role
    kind: Kind
    interfaces: dict[str, Interface] = field(default_factory=dict)
    forwards: bool = False  # relays packets not addressed to it (routers, BCube/torus servers)
    attrs: dict = field(default_factory=dict)  # structural facts: digits, coords, pod, half...

    @property
    def is_server(self) -> bool:
        return self.role == "server"

    def addresses(self) -> list[ipaddress.IPv4Interface]:
        return [i.address for i in self.interfaces.values() if i.address is not None]

    def data_nics(self) -> list[Interface]:
        """Interfaces that carry an address (a server's NICs, a router's ports)."""
        return [i for i in self.interfaces.values() if i.address is not None]


class RoutingError(TopologyError):
    """A walk of the routing tables found a black hole or a loop."""


class Topology:
    """Nodes, links and routes of one lab network. Build it with `TopologyBuilder`."""

    def __init__(
        self,
        kind: str,
        params: dict,
        nodes: dict[str, Node],
        links: list[Link],
        routes: dict[str, list[Route]],
        facts: dict,
        lazy_routes: Callable[[str], list[Route]] | None = None,
        lazy_lookup: Callable[["Topology", str, ipaddress.IPv4Address], tuple[NextHop, ...]] | None = None,
    ) -> None:
        self.kind = kind
        self.params = params
        self.nodes = nodes
        self.links = links
        # bits/s of single link directions that are not the lab's links.bandwidth (links.overrides)
        self.rates: dict[tuple[str, str], float] = {}
        # a link direction's own one-way delay (s) and queue (packets), where it has them
        self.delays: dict[tuple[str, str], float] = {}
        self.queues: dict[tuple[str, str], int] = {}
        self._routes = routes
        self._lazy_routes = lazy_routes
        self._lazy_lookup = lazy_lookup  # answers `lookup` without building tables (HostRouting)
        self.facts = facts
        self._owner: dict[ipaddress.IPv4Address, Endpoint] = {}
        for node in nodes.values():
            for iface in node.interfaces.values():
                if iface.address is not None:
                    self._owner[iface.address.ip] = Endpoint(node.name, iface.name)
        self._wire: dict[Endpoint, Endpoint] = {}
        for link in links:
            self._wire[link.a] = link.b
            self._wire[link.b] = link.a
        self._tables: dict[str, _Table] = {}
        self._l2_trees: dict[Endpoint, dict[Endpoint, Endpoint]] = {}
        self._l2_entries = 0
        self._bridge_ports: dict[Endpoint, list[Endpoint]] = {}

    # -- inventory --------------------------------------------------------------------------
    def with_rates(self, rates: dict[tuple[str, str], float]) -> "Topology":
        """A copy of this topology with some link directions at other rates (bit/s): what a
        link-degrade makes of it. This one, which caches may hold, stays as it is."""
        changed = copy.copy(self)
        changed.rates = {**self.rates, **rates}
        return changed

    @property
    def servers(self) -> list[Node]:
        """Servers in rank order (the order the builder added them)."""
        return [n for n in self.nodes.values() if n.is_server]

    @property
    def switches(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.is_server]

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise TopologyError(f"no node named {name!r} in this {self.kind} topology") from None

    def owner(self, address: ipaddress.IPv4Address | str) -> Endpoint | None:
        return self._owner.get(ipaddress.IPv4Address(address))

    def peer(self, endpoint: Endpoint) -> Endpoint | None:
        """The interface at the other end of the wire plugged into `endpoint`."""
        return self._wire.get(endpoint)

    def links_of(self, node: str) -> list[Link]:
        return [link for link in self.links if node in link.nodes()]

    def rate_of(self, a: str, b: str, default: float) -> float:
        """Bits/s of the link direction a → b: its own rate, or the lab's `default`."""
        return self.rates.get((a, b), default)

    def delay_of(self, a: str, b: str, default: float) -> float:
        """One-way seconds of the link direction a → b: its own delay, or the lab's `default`."""
        return self.delays.get((a, b), default)

    def queue_of(self, a: str, b: str, default: int) -> int:
        """Packets the link direction a → b queues: its own, or the lab's `default`."""
        return self.queues.get((a, b), default)

    def set_link(self, a: str, b: str, rate: float | None = None, delay: float | None = None,
                 queue: int | None = None) -> None:
        """Give the link between a and b (both directions) a rate, delay or queue of its own."""
        for table, value in ((self.rates, rate), (self.delays, delay), (self.queues, queue)):
            if value is not None:
                table[(a, b)] = table[(b, a)] = value

    def links_between(self, a: str, b: str) -> list[Link]:
        """The links wiring nodes a and b together (none if they are not neighbours)."""
        return [link for link in self.links if set(link.nodes()) == {a, b}]

    def address_of(self, node: str) -> ipaddress.IPv4Address:
        """A node's primary data address: its first addressed interface."""
        nics = self.node(node).data_nics()
        if not nics:
            raise TopologyError(f"node {node!r} has no data address")
        return nics[0].address.ip

    # -- routing ----------------------------------------------------------------------------
    def routes_of(self, node: str) -> list[Route]:
        """The static routes of `node` (connected routes are implied by its addresses)."""
        if node not in self._routes and self._lazy_routes is not None:
            self._routes[node] = self._lazy_routes(node)
        return self._routes.get(node, [])

    def lookup(self, node: str, address: ipaddress.IPv4Address) -> tuple[NextHop, ...]:
        if self._lazy_lookup is not None:
            return self._lazy_lookup(self, node, address)
        table = self._tables.get(node)
        if table is None:
            table = self._tables[node] = _Table(self.nodes[node], self.routes_of(node))
        return table.lookup(address)

    def path(self, src: str, dst: str | ipaddress.IPv4Address) -> list[str]:
        """The node-by-node path routing takes from `src` to `dst` (first ECMP branch)."""
        return self.paths(src, dst, first_only=True)[0]

    def paths(
        self, src: str, dst: str | ipaddress.IPv4Address, first_only: bool = False
    ) -> list[list[str]]:
        """Every path the routing tables allow (all ECMP branches), each a list of node names.

        `dst` is a node name (its primary address) or an address. Raises RoutingError on a
        black hole or a forwarding loop.
        """
        return [[name for name, _ in path] for path in self.layered_paths(src, dst, first_only)]

    def layered_paths(
        self, src: str, dst: str | ipaddress.IPv4Address, first_only: bool = False
    ) -> list[list[tuple[str, str]]]:
        """Like `paths`, each node paired with how it was crossed: "l3" where a routing table
        was consulted (routers, relaying servers, the ends), "l2" where a bridge switched."""
        self.node(src)
        target = self.address_of(dst) if isinstance(dst, str) else ipaddress.IPv4Address(dst)
        if self.owner(target) is None:
            raise RoutingError(f"no interface in the topology has address {target}")
        results: list[list[tuple[str, str]]] = []
        stack: list[tuple[str, list[tuple[str, str]]]] = [(src, [(src, "l3")])]
        while stack:
            node, path = stack.pop()
            if self._is_local(node, target):
                results.append(path)
                if first_only:
                    break
                continue
            hops = self.lookup(node, target)
            names = [name for name, _ in path]
            if not hops:
                raise RoutingError(f"black hole: {node} has no route to {target} (path {names})")
            if not self.nodes[node].forwards and node != src:
                raise RoutingError(f"{node} does not forward but is asked to relay to {target}")
            chosen = hops[:1] if first_only else hops
            for hop in reversed(chosen):
                gateway = hop.via or target
                segment = self._l2_path(Endpoint(node, hop.dev), gateway)
                if segment is None:
                    raise RoutingError(
                        f"{node} sends to {target} via {gateway} on {hop.dev}, "
                        f"which is not reachable on that segment"
                    )
                nxt = segment[-1]
                if nxt in names:
                    raise RoutingError(f"forwarding loop towards {target}: {names + segment}")
                crossed = [(name, "l2") for name in segment[:-1]] + [(nxt, "l3")]
                stack.append((nxt, path + crossed))
        return results

    def hop(self, node: str, dev: str, gateway: ipaddress.IPv4Address) -> list[str]:
        """The nodes a packet crosses from `node`, leaving by `dev`, to the owner of
        `gateway`: bridges of the segment, then the owner (RoutingError if not on it)."""
        segment = self._l2_path(Endpoint(node, dev), ipaddress.IPv4Address(gateway))
        if segment is None:
            raise RoutingError(f"{node} sends via {gateway} on {dev}, which is not reachable on that segment")
        return segment

    @functools.cached_property
    def has_ecmp(self) -> bool:
        """Whether some node spreads a destination over several next hops."""
        return any(route.is_ecmp for name in self.nodes for route in self.routes_of(name))

    def _is_local(self, node: str, target: ipaddress.IPv4Address) -> bool:
        owner = self.owner(target)
        return owner is not None and owner.node == node

    def _l2_path(self, start: Endpoint, gateway: ipaddress.IPv4Address) -> list[str] | None:
        """Nodes crossed from `start` (exclusive) to the owner of `gateway` on its L2 segment."""
        goal = self.owner(gateway)
        if goal is None or goal == start:
            return None
        parents = self._l2_tree(start)
        if goal not in parents:
            return None
        chain = []
        here = goal
        while here != start:
            chain.append(here)
            here = parents[here]
        crossed = [start.node]
        for endpoint in reversed(chain):
            if crossed[-1] != endpoint.node:
                crossed.append(endpoint.node)
        return crossed[1:]

    def _l2_tree(self, start: Endpoint) -> dict[Endpoint, Endpoint]:
        """The breadth-first tree of `start`'s L2 segment (endpoint → the one it was reached
        from), computed once per start: a path of one pair then costs its length, not the
        segment's size (a 200-server star's mesh took 75 s searching the bridge per pair).
        At most L2_TREE_ENTRIES entries are kept, the oldest trees dropped first."""
        parents = self._l2_trees.get(start)
        if parents is not None:
            return parents
        parents = {start: start}
        queue: deque[Endpoint] = deque([start])
        while queue:
            here = queue.popleft()
            for there in self._segment_neighbours(here):
                if there not in parents:
                    parents[there] = here
                    queue.append(there)
        self._l2_entries += len(parents)
        while self._l2_entries > L2_TREE_ENTRIES and self._l2_trees:
            self._l2_entries -= len(self._l2_trees.pop(next(iter(self._l2_trees))))
        self._l2_trees[start] = parents
        return parents

    @functools.cached_property
    def widest_segment(self) -> int:
        """Interfaces of the largest L2 segment (a bridge's ports, their wires' far ends and
        the bridge; 2 for a point-to-point wire): what one path search may have to cross."""
        bridges = [Endpoint(node.name, iface.name) for node in self.nodes.values()
                   for iface in node.interfaces.values() if iface.is_bridge]
        return max([2] + [2 * len(self._ports(bridge)) + 1 for bridge in bridges])

    def _segment_neighbours(self, here: Endpoint) -> Iterator[Endpoint]:
        """Interfaces one L2 step away: the wire's far end, bridge to port, port to bridge."""
        wired = self._wire.get(here)
        if wired is not None:
            yield wired
        node = self.nodes[here.node]
        iface = node.interfaces[here.interface]
        if iface.master is not None:
            yield Endpoint(here.node, iface.master)
        if iface.is_bridge:
            yield from self._ports(here)

    def _ports(self, bridge: Endpoint) -> list[Endpoint]:
        """The ports enslaved to `bridge`, found once per bridge."""
        ports = self._bridge_ports.get(bridge)
        if ports is None:
            ports = self._bridge_ports[bridge] = [Endpoint(bridge.node, port.name)
                                                  for port in self.nodes[bridge.node].interfaces.values()
                                                  if port.master == bridge.interface]
        return ports

    def hop_counts(self, path: list[str]) -> tuple[int, int]:
        """(links, switches) crossed by a node path."""
        return len(path) - 1, sum(1 for name in path if not self.nodes[name].is_server)


class _Table:
    """A node's routing table: longest-prefix match over connected and static routes."""

    def __init__(self, node: Node, routes: list[Route]) -> None:
        self.by_length: dict[int, dict[int, tuple[NextHop, ...]]] = {}
        for iface in node.interfaces.values():
            if iface.address is not None and iface.address.network.prefixlen < 32:
                self._add(iface.address.network, (NextHop(iface.name),))
        for route in routes:
            self._add(route.prefix, route.nexthops)
        self.lengths = sorted(self.by_length, reverse=True)

    def _add(self, prefix: ipaddress.IPv4Network, hops: tuple[NextHop, ...]) -> None:
        table = self.by_length.setdefault(prefix.prefixlen, {})
        key = int(prefix.network_address)
        table.setdefault(key, hops)  # connected routes come first and win, as in Linux

    def lookup(self, address: ipaddress.IPv4Address) -> tuple[NextHop, ...]:
        value = int(address)
        for length in self.lengths:
            mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
            hops = self.by_length[length].get(value & mask)
            if hops is not None:
                return hops
        return ()
