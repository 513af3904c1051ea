"""The wires between hosts: every link whose ends a placement (topology/partition.py) puts on
two hosts becomes two VXLAN devices, one per end, with a VNI of its own.

Each end is made from its host's namespace, where its UDP socket stays on the underlay, and
created straight inside the node's namespace under the link end's own name: the node sees a
plain NIC, so addresses, bridges, routes and shaping (the same HTB and queue as a veth's) are
applied to it unchanged. Unicast to the other host, no learning: a wire, not a segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from orchestrator.errors import EmulationError
from orchestrator.topology.model import Endpoint, Link, Topology
from orchestrator.topology.partition import Placement

MIN_VNI, MAX_VNI = 4096, 2**24 - 1  # below 4096: left to whatever else the underlay carries


@dataclass(frozen=True)
class Wire:
    link: Link
    vni: int
    hosts: tuple[str, str]  # the hosts of link.a and link.b

    def ends(self) -> tuple[tuple[Endpoint, str, str], ...]:
        """(link end, its host, the other end's host) of both ends: what each host makes."""
        return (self.link.a, *self.hosts), (self.link.b, *self.hosts[::-1])


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

