"""The wires between hosts: every link whose ends a placement (topology/partition.py) puts on
two hosts becomes two VXLAN devices, one per end, with a VNI of its own.

Each end is made from its host's namespace, where its UDP socket stays on the underlay, and
created straight inside the node's namespace under the link end's own name: the node sees a
plain NIC, so addresses, bridges, routes and shaping (the same HTB and queue as a veth's) are
applied to it unchanged. Unicast to the other host, no learning: a wire, not a segment.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Mapping

from orchestrator.emulation import kernel
from orchestrator.errors import EmulationError
from orchestrator.topology.model import Endpoint, Link, Topology
from orchestrator.topology.partition import Placement

MIN_VNI, MAX_VNI = 4096, 2**24 - 1  # below 4096: left to whatever else the underlay carries


@dataclass(frozen=True)
class Wire:
    link: Link
    vni: int
    hosts: tuple[str, str]  # the hosts of link.a and link.b


def plan(topology: Topology, placement: Placement, taken: Iterable[int] = ()) -> list[Wire]:
    """A wire for every link that crosses hosts, each with the lowest VNI not `taken` (the
    VNIs of other labs on these hosts, from their journals)."""
    used = set(taken)
    wires, vni = [], MIN_VNI
    for link in placement.crossing(topology):
        while vni in used:
            vni += 1
        if vni > MAX_VNI:
            raise EmulationError("no VXLAN network identifier is left for this lab's wires: take labs down")
        used.add(vni)
        wires.append(Wire(link, vni, (placement.host_of[link.a.node], placement.host_of[link.b.node])))
    return wires


def make_end(nl: kernel.Netlink, wire: Wire, end: Endpoint, host_ns: str | None,
             underlay: Mapping[str, ipaddress.IPv4Address], node_ns: str, txqlen: int, mtu: int) -> None:
    """The VXLAN device of one end of `wire`, in `node_ns`, named as the link end is."""
    here, there = wire.hosts if end == wire.link.a else wire.hosts[::-1]
    kernel.add_vxlan(nl, host_ns, end.interface, wire.vni, underlay[here], underlay[there], node_ns, txqlen, mtu)
