"""The table of topology kinds: one record per kind, holding every part of it the package
needs (builder, shorthand, drawing, NIC facts, structure groups). The built-ins register
through `register_kind` like any other (topology/__init__.py); a lab file's `topology:`
mapping is the kind's spec model, paired with its record by `orchestrator.spec.register_topology`
(pydantic lives in spec/, not here: Mininet loads this package with Debian's Python).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from orchestrator.errors import TopologyError
from orchestrator.origins import Origin
from orchestrator.topology.model import Topology

Address = ipaddress.IPv4Address
Builder = Callable[[Any, ipaddress.IPv4Network, ipaddress.IPv4Network], Topology]


@dataclass(frozen=True)
class TopologyKind:
    """What the package knows of one kind of topology.

    build(spec, data, links): the Topology of a spec (anything with the kind's parameters as
        attributes) within the data and link address pools.
    shorthand: the parameters `bcube,4,1` names, in order; () when the kind has none.
    title: how drawings and reports name it ("Fat-Tree").
    layout(topology) -> topology.layouts.Layout: where its nodes go in a drawing (None: laid out
        as a graph).
    nic_addresses(topology, server) -> {sender NIC index: address}: the address of `server` that
        a sender's NIC of that index reaches directly (None: one NIC per server, every transfer
        goes to the primary address).
    groups(topology) -> {group: servers}: structure groups for inventories (topology.groups).
    blocks(topology) -> [[node, …], …]: nodes that should share a host when a lab spans several,
        neighbouring blocks near in the network (topology.blocks; None: cut as a graph).
    """

    name: str
    build: Builder
    shorthand: tuple[str, ...] = ()
    title: str = ""
    layout: Callable[[Topology], Any] | None = None
    nic_addresses: Callable[[Topology, str], dict[int, Address]] | None = None
    groups: Callable[[Topology], dict[str, list[str]]] | None = None
    blocks: Callable[[Topology], list[list[str]]] | None = None
    origin: str = ""  # where it was registered from: "built-in", or a plugin's file


KINDS: dict[str, TopologyKind] = {}
# where registrations come from while a plugin loads (orchestrator/plugins.py sets it)
_origin = Origin("topology_origin")
origin = _origin.within  # `with kinds.origin(file):` — kinds registered within record it


def register_kind(kind: TopologyKind) -> TopologyKind:
    """Add a kind to the table; a taken or malformed name is a TopologyError (one line)."""
    if not isinstance(kind.name, str) or not re.fullmatch(r"[a-z][a-z0-9]{0,15}", kind.name):
        # `kind,N,…` names a lab `kind-N-…`: lab names allow neither '_' nor capitals
        raise TopologyError(f"topology kind {kind.name!r}: name it with at most 16 lower-case letters and digits")
    if kind.name in KINDS:
        raise TopologyError(f"topology kind {kind.name} is registered already ({KINDS[kind.name].origin}): "
                            "pick another name")
    if not callable(kind.build):
        raise TopologyError(f"topology kind {kind.name}: build must be callable (spec, data, links) -> Topology")
    kind = replace(kind, title=kind.title or kind.name, origin=kind.origin or _origin.get())
    KINDS[kind.name] = kind
    return kind


def kind_of(name: str) -> TopologyKind:
    try:
        return KINDS[name]
    except KeyError:
        raise TopologyError(f"unknown topology kind {name!r}: use one of {', '.join(KINDS)}") from None


def shorthand() -> dict[str, tuple[str, ...]]:
    """kind → its positional parameters, for the kinds `kind,N,…` can name."""
    return {name: kind.shorthand for name, kind in KINDS.items() if kind.shorthand}


def nic_addresses(topology: Topology, server: str) -> dict[int, Address]:
    """For each NIC index a sender may name, the address of `server` it reaches ({} for kinds
    with one NIC per server)."""
    facts = kind_of(topology.kind).nic_addresses
    return facts(topology, server) if facts is not None else {}


def groups(topology: Topology) -> dict[str, list[str]]:
    chosen = kind_of(topology.kind).groups
    return chosen(topology) if chosen is not None else {}
