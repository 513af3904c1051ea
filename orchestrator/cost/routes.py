"""Where a transfer's bytes go: the link directions its connection crosses, as the lab's
routing tables send it.

A transfer leaves `src` towards the peer's address on the NIC the schedule names (the
address its kind's `nic_addresses` gives, as the agents pick it). From there the routing tables decide, hop by hop: BCube servers relay by digit
correction, the torus routes by dimension order, Fat-Tree, BiGraph and leaf-spine routers
spread over equal-cost next hops.

ECMP: the kernel hashes each connection onto one next hop; which one depends on ephemeral
ports nobody can know in advance. Before a run, the model takes the expectation: at every
hop with e equal-cost next hops a connection sends 1/e of its bytes each way (a fixed split,
like per-packet spraying), which predicts the mean load of every link and no hash
collisions. Once a lab run's connections are open, their real paths can be read off the
lab (`Lab.connection_paths`) and `pinned` here: the prediction beside the measurement then
has the collisions the network really has. On fattree,4 at 50 Mbit (12.5 MB, back to back)
a mesh measured 2.16 × the even-spread prediction and 1.20 × the hashed one;
halving-doubling 1.93 and 1.10; a double tree 1.30 and 1.03.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from orchestrator.topology import Topology, kinds
from orchestrator.topology.model import RoutingError
from orchestrator.topology.partition import Underlay

Address = ipaddress.IPv4Address


def target_address(topology: Topology, node: str, nic: int | None) -> Address:
    """The address of `node` a transfer leaving by sender NIC `nic` is sent to."""
    if nic is not None:
        address = kinds.nic_addresses(topology, node).get(nic)
        if address is not None:
            return address
    return topology.address_of(node)


@dataclass(frozen=True)
class LinkDirection:
    """One direction of one link: what the lab shapes, and what the model shares."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}→{self.dst}"


Usage = tuple[tuple[int, float], ...]  # (link direction index, share of the connection's bytes)


Pinned = dict[tuple[str, Address], list[str]]  # (source server, address) → the node path it takes


class Routes:
    """Link usage of connections over one topology, computed once per (source, address).
    `pinned` paths, where given, replace the routing tables' spread."""

    def __init__(self, topology: Topology, pinned: Pinned | None = None, underlay: Underlay | None = None) -> None:
        self.topology = topology
        self.pinned = dict(pinned or {})
        self.directions: list[LinkDirection] = []
        self._index: dict[tuple[str, str], int] = {}
        for link in topology.links:
            a, b = link.nodes()
            for pair in ((a, b), (b, a)):
                if pair in self._index:
                    raise ValueError(f"two links join {a} and {b}: the model cannot tell them apart")
                self._index[pair] = len(self.directions)
                self.directions.append(LinkDirection(*pair))
        self._usage: dict[tuple[str, Address], tuple[Usage, float]] = {}
        self._addresses: dict[tuple[str, int | None], Address] = {}
        # (node, its table's next hops, the address if one is on-link) → (the routing point
        # each reaches, link directions crossed)
        self._segments: dict[tuple[str, int, int | None], list[tuple[str, tuple[int, ...]]]] = {}
        self._keep: list = []
        self.underlay = underlay
        self._nics: dict[int, float] = {}  # a host NIC's direction → its bits/s
        self._crossing: dict[int, tuple[int, ...]] = {}  # a link direction between hosts → the NICs it crosses
        if underlay is not None:
            self._add_nics(underlay)

    def _add_nics(self, underlay: Underlay) -> None:
        """Each host NIC of known rate, out and in, as one more shared direction (`host⇢underlay`)."""
        out, into = {}, {}
        for host, bps in underlay.nic_bps.items():
            for side, pair in ((out, (f"{host} NIC", "underlay")), (into, ("underlay", f"{host} NIC"))):
                side[host] = len(self.directions)
                self._nics[len(self.directions)] = bps
                self.directions.append(LinkDirection(*pair))
        for (a, b), index in self._index.items():
            here, there = underlay.host_of[a], underlay.host_of[b]
            if here != there:
                self._crossing[index] = tuple(i for i in (out.get(here), into.get(there)) if i is not None)

    def capacities(self, network) -> list[float]:
        """Payload bytes/s of every link direction, by index: its own rate (the topology's
        `rates`, from links.overrides) or the network's, times the payload share; a host NIC's
        rate times the payload share and VXLAN's."""
        rates = self.topology.rates
        out = []
        for index, d in enumerate(self.directions):
            if index in self._nics:
                out.append(self._nics[index] / 8 * network.efficiency * self.underlay.payload_share)
            else:
                out.append(rates.get((d.src, d.dst), network.bandwidth) / 8 * network.efficiency)
        return out

    def address(self, dst: str, nic: int | None = None) -> Address:
        """The address of server `dst` a transfer leaving by `nic` goes to."""
        key = (dst, nic)
        if key not in self._addresses:
            self._addresses[key] = target_address(self.topology, dst, nic)
        return self._addresses[key]

    def usage(self, src: str, dst: str, nic: int | None = None) -> tuple[Usage, float]:
        """(link directions with the share of bytes each carries, mean hop count) of a
        transfer from server `src` to server `dst` leaving by `nic`."""
        if src == dst:
            raise ValueError(f"a transfer from {src} to itself crosses no link")
        address = self.address(dst, nic)
        key = (src, address)
        if key not in self._usage:
            self._usage[key] = self._spread(src, address)
        return self._usage[key]

    def _spread(self, src: str, address: Address) -> tuple[Usage, float]:
        pinned = self.pinned.get((src, address))
        if pinned is not None:
            try:
                links = sorted({self._index[(a, b)] for a, b in zip(pinned, pinned[1:])})
            except KeyError:
                raise ValueError(f"the path {pinned} from {src} to {address} crosses no link of the topology") from None
            return self._over_nics({link: 1.0 for link in links}), float(len(pinned) - 1)
        order, edges = self._routing_dag(src, address)
        weight = dict.fromkeys(order, 0.0)
        weight[src] = 1.0
        shares: dict[int, float] = {}
        hops = 0.0
        for node in order:  # every routing point after all that send to it: its weight is whole
            fanout = edges[node]
            if not fanout:
                continue
            part = weight[node] / len(fanout)  # a routing decision: split over its equal-cost next hops
            for nxt, links in fanout:
                weight[nxt] += part
                for index in links:
                    shares[index] = shares.get(index, 0.0) + part
                hops += part * len(links)
        return self._over_nics(shares), hops

    def _routing_dag(self, src: str, address: Address) -> tuple[list[str], dict[str, list[tuple[str, tuple[int, ...]]]]]:
        """The routing points (`src`, routers, relaying servers) a transfer from `src` to
        `address` reaches, senders before receivers, and each one's equal-cost next hops
        with the link directions to them: what `Topology.layered_paths` walks path by path,
        each point once, so a Fat-Tree's 64 paths cost their ~150 distinct hops, not 64 × 7
        (RoutingError on a black hole, a loop or a relay that does not forward, as there)."""
        topology = self.topology
        topology.node(src)
        owner = topology.owner(address)
        if owner is None:
            raise RoutingError(f"no interface in the topology has address {address}")
        edges: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        finished: list[str] = []
        on_stack = {src}
        stack = [(src, iter(self._next_hops(src, address, owner.node, src)))]
        edges[src] = []
        while stack:
            node, pending = stack[-1]
            step = next(pending, None)
            if step is None:  # every point it sends to is done: depth-first postorder
                stack.pop()
                on_stack.discard(node)
                finished.append(node)
                continue
            edges[node].append(step)
            nxt = step[0]
            if nxt in on_stack:
                raise RoutingError(f"forwarding loop towards {address}: {[n for n, _ in stack] + [nxt]}")
            if nxt not in edges:
                edges[nxt] = []
                on_stack.add(nxt)
                stack.append((nxt, iter(self._next_hops(nxt, address, owner.node, src))))
        finished.reverse()
        return finished, edges

    def _next_hops(self, node: str, address: Address, goal: str, src: str) -> list[tuple[str, tuple[int, ...]]]:
        """(next routing point, link directions to it) of each equal-cost next hop of `node`
        towards `address` (none at its owner, `goal`); a segment is looked up once per
        (node, device, gateway), whichever transfer crosses it."""
        if node == goal:
            return []
        topology = self.topology
        hops = topology.lookup(node, address)
        if not hops:
            raise RoutingError(f"black hole: {node} has no route to {address} (from {src})")
        if node != src and not topology.nodes[node].forwards:
            raise RoutingError(f"{node} does not forward but is asked to relay to {address}")
        # a table's entry is one tuple of next hops for its whole prefix: what they reach is
        # the same for every address there, but for an on-link hop (it goes to the address)
        key = (node, id(hops), None if all(hop.via for hop in hops) else int(address))
        out = self._segments.get(key)
        if out is None:
            out = self._segments[key] = [self._segment(node, hop.dev, hop.via or address) for hop in hops]
            self._keep.append(hops)  # the key holds its id: keep it alive
        return out

    def _segment(self, node: str, dev: str, gateway: Address) -> tuple[str, tuple[int, ...]]:
        """(the routing point reached from `node` by `dev` towards `gateway`, link directions crossed)."""
        crossed = [node, *self.topology.hop(node, dev, gateway)]
        return crossed[-1], tuple(self._index[(a, b)] for a, b in zip(crossed, crossed[1:]))

    def _over_nics(self, shares: dict[int, float]) -> Usage:
        """The usage, with the host NICs its links between hosts cross."""
        for index, weight in list(shares.items()):
            for nic in self._crossing.get(index, ()):
                shares[nic] = shares.get(nic, 0.0) + weight
        return tuple(sorted(shares.items()))
