"""Hosts faked as network namespaces on one underlay bridge: how the hosts tier and
bench/multihost.py stand in for a rack of machines on this one. Each host namespace has one
underlay NIC (`ul0`) with its address; the bridge lives in a namespace of its own, so nothing
touches the machine's own network. A context manager: everything it made goes when it ends."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from typing import Iterator

from orchestrator.emulation import kernel

UNDERLAY = ipaddress.IPv4Network("192.0.2.0/24")  # TEST-NET-1: never routed anywhere


@dataclass(frozen=True)
class FakeHosts:
    prefix: str
    names: tuple[str, ...]

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> ipaddress.IPv4Address:
        return UNDERLAY.network_address + 1 + self.names.index(host)

    @property
    def underlay(self) -> dict[str, ipaddress.IPv4Address]:
        return {host: self.address(host) for host in self.names}


@contextlib.contextmanager
def fake_hosts(prefix: str, names: list[str], mtu: int = 9000) -> Iterator[FakeHosts]:
    """Namespaces `<prefix>-<host>` joined by a bridge in `<prefix>-ul`, underlay MTU `mtu`."""
    hosts = FakeHosts(prefix, tuple(names))
    bridge_ns = f"{prefix}-ul"
    spaces = [bridge_ns, *(hosts.namespace(h) for h in names)]
    kernel.create_namespaces(spaces)
    try:
        with kernel.Netlink() as nl:
            nl.open(spaces)
            kernel.add_bridge(nl, bridge_ns, "ul")
            kernel.set_up(nl, bridge_ns, "ul")
            for index, host in enumerate(names):
                port = f"p{index}"
                kernel.add_veth(nl, hosts.namespace(host), "ul0", bridge_ns, port, 1000, mtu=mtu)
                kernel.enslave(nl, bridge_ns, port, "ul")
                kernel.set_up(nl, bridge_ns, port)
                kernel.set_up(nl, hosts.namespace(host), "lo")
                kernel.add_address(nl, hosts.namespace(host), "ul0",
                                   ipaddress.IPv4Interface(f"{hosts.address(host)}/{UNDERLAY.prefixlen}"))
        yield hosts
    finally:
        for space in spaces:
            kernel.delete_namespace(space)
