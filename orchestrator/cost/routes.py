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
        shares: dict[int, float] = {}
        hops = 0.0
        for path in self.topology.layered_paths(src, address):
            weight = 1.0
            for name, crossing in path[:-1]:
                if crossing == "l3":  # a routing decision: split over its equal-cost next hops
                    weight /= len(self.topology.lookup(name, address))
            for a, b in zip(path, path[1:]):
                index = self._index[(a[0], b[0])]
                shares[index] = shares.get(index, 0.0) + weight
            hops += weight * (len(path) - 1)
        return self._over_nics(shares), hops

    def _over_nics(self, shares: dict[int, float]) -> Usage:
        """The usage, with the host NICs its links between hosts cross."""
        for index, weight in list(shares.items()):
            for nic in self._crossing.get(index, ()):
                shares[nic] = shares.get(nic, 0.0) + weight
        return tuple(sorted(shares.items()))
