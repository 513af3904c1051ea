"""What a lab will be on this machine, decided before anything is created (pure, no I/O).

Names: every node lives in the network namespace `testbed-<lab>-<node>` (for Docker servers
that is the container's namespace, attached under that name; the container is named the
same). Only the management network touches the root namespace: a bridge `tb<id>-br` that
holds the orchestrator's address, and one veth end `tb<id>-<rank>` per server, where <id> is
six hex digits of the lab name's hash, so two labs never clash and every name fits Linux's
15 characters.

A bridge holds at most 1,023 ports, so a lab with more servers spreads them evenly over
more bridges `tb<id>-b<n>` (n = 1, 2, …), and the host routes between them: each extra
bridge holds the orchestrator's address as a /32 and routes to its servers' block of the
lab's one subnet, which every server still sees whole on its `mgmt0`. No frame is ever
bridged from one port to another in the root namespace: server ports are isolated, and
bridges are not joined by links. (A tree of bridges joined by veths was tried first: with
br_netfilter loaded, as dockerd loads it, frames bridged at the leaves pass the root
namespace's inet forward hook as if routed, where isolation drops them.)

Addresses are resolved statically: every `mgmt0` has a MAC made from the lab id and the
server's rank, every management bridge the gateway's, and both sides hold permanent ARP
entries. The kernel's neighbour table is one table for every namespace, limited by
net.ipv4.neigh.default.gc_thresh3 (1,024 by default); permanent entries do not count
against it, so a busy fabric cannot crowd the orchestrator out of its servers (with learnt
entries, an all-pairs ping over fattree,8 left the host reaching 32 of its 128 servers).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from orchestrator.emulation.journal import lab_id
from orchestrator.errors import TopologyError
from orchestrator.topology import Topology
from orchestrator.topology.addressing import bits_for
from orchestrator.topology.model import FORWARDING_SYSCTLS

# `TESTBED_NETNS_PREFIX`: hosts faked as namespaces of one machine (orchestrator/hosts/fake.py)
# share its named namespaces, so each host's worker names its own apart
NAMESPACE_PREFIX = os.environ.get("TESTBED_NETNS_PREFIX", "testbed-")
MGMT_POOL = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544 benchmarking range
MGMT_IF = "mgmt0"
# BR_MAX_PORTS is 1,024 and port number 0 is reserved: adding a 1,024th port fails with
# EXFULL ("Exchange full"), measured on Linux 6.18.
BRIDGE_MAX_PORTS = 1023
MGMT_MAC_PREFIX = 0x0E  # locally administered, unicast

BASE_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",  # no router solicitations or DAD in counters
    "net.ipv6.conf.default.disable_ipv6": "1",
}
# Veths hand a packet to the receiving CPU's backlog: packets of one flow sent from both
# CPUs arrive out of order, which no real link does, and TCP took them for losses (~10
# spurious fast retransmits per ring allreduce on 8 servers). Receive Packet Steering on
# every CPU keeps each flow on one CPU. The mask applies to devices made in the namespace
# afterwards; kernels before 6.2 lack the setting (written only where present).
RPS_DEFAULT_MASK = "net.core.rps_default_mask"
OPTIONAL_SYSCTLS = frozenset({RPS_DEFAULT_MASK})
SLOW_START_AFTER_IDLE = "net.ipv4.tcp_slow_start_after_idle"  # servers': spec.servers.tcp_slow_start_after_idle


def cpu_mask(cpus: int) -> str:
    """A cpumask of CPUs 0..cpus-1 as the kernel writes it: hex, 32 bits per comma group."""
    digits = format((1 << cpus) - 1, "x")
    digits = digits.zfill(-(-len(digits) // 8) * 8)
    return ",".join(digits[i : i + 8] for i in range(0, len(digits), 8))


def namespace_name(lab: str, node: str, prefix: str = NAMESPACE_PREFIX) -> str:
    return f"{prefix}{lab}-{node}"


def link_group(lab: str) -> int:
    return 0x7E000000 | int(lab_id(lab), 16)


def mgmt_prefixlen(servers: int) -> int:
    """A /24 while it fits (host + servers + network + broadcast), larger beyond."""
    return min(24, 32 - bits_for(servers + 3))


def choose_mgmt_subnet(
    servers: int, taken: list[ipaddress.IPv4Network], pool: ipaddress.IPv4Network = MGMT_POOL
) -> ipaddress.IPv4Network:
    """The first subnet of the management pool that overlaps nothing in `taken`."""
    for candidate in pool.subnets(new_prefix=mgmt_prefixlen(servers)):
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise TopologyError(
        f"no free management subnet left in {pool}: remove stale labs (testbed clean) or set "
        "management.subnet"
    )


def bridge_count(servers: int, ports: int = BRIDGE_MAX_PORTS) -> int:
    """Management bridges for `servers` ports of at most `ports` each (at least one)."""
    return max(1, -(-servers // ports))


def mgmt_mac(id_: str, slot: int) -> str:
    """The MAC of management slot `slot` of lab `id_`: 0 is the gateway, rank + 1 a server."""
    octets = [MGMT_MAC_PREFIX, *bytes.fromhex(id_), slot >> 8, slot & 0xFF]
    return ":".join(f"{octet:02x}" for octet in octets)


@dataclass
class LabPlan:
    lab: str
    topology: Topology
    runtime: str
    mgmt_subnet: ipaddress.IPv4Network
    bridge_ports: int | None = None  # ports per management bridge; None: BRIDGE_MAX_PORTS
    id: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)  # node → namespace
    mgmt: dict[str, tuple[str, ipaddress.IPv4Interface]] = field(default_factory=dict)
    mgmt_master: dict[str, str] = field(default_factory=dict)  # server → bridge its port is on
    mgmt_macs: dict[str, str] = field(default_factory=dict)  # server → MAC of its mgmt0
    # the host's routes to the servers of every bridge but the first (which has the subnet's)
    mgmt_routes: list[tuple[ipaddress.IPv4Network, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.id = lab_id(self.lab)
        servers = self.topology.servers
        if len(servers) + 2 > self.mgmt_subnet.num_addresses - 1:
            raise TopologyError(
                f"management.subnet {self.mgmt_subnet} is too small for {len(servers)} servers"
            )
        if len(servers) >= 1 << 16:  # MAC slots (builder.MAX_SERVERS keeps far below)
            raise TopologyError(f"{len(servers)} servers: a management network holds at most 65,535")
        self.namespaces = {name: namespace_name(self.lab, name) for name in self.topology.nodes}
        bridges = self.mgmt_bridges()
        per_bridge = -(-len(servers) // len(bridges))  # balanced
        base = int(self.mgmt_subnet.network_address)
        for rank, server in enumerate(servers):
            address = ipaddress.IPv4Interface((base + 2 + rank, self.mgmt_subnet.prefixlen))
            self.mgmt[server.name] = (f"tb{self.id}-{rank}", address)
            self.mgmt_master[server.name] = bridges[rank // per_bridge]
            self.mgmt_macs[server.name] = mgmt_mac(self.id, rank + 1)
        for n, bridge in enumerate(bridges[1:], 1):
            ranks = range(n * per_bridge, min(len(servers), (n + 1) * per_bridge))
            if ranks:  # the fewest CIDR blocks that cover the bridge's addresses exactly
                first, last = (ipaddress.IPv4Address(base + 2 + rank) for rank in (ranks[0], ranks[-1]))
                self.mgmt_routes += [(block, bridge) for block in ipaddress.summarize_address_range(first, last)]

    @property
    def link_group(self) -> int:
        """The netdev group of this lab's root-namespace links (deleted in one call)."""
        return link_group(self.lab)

    @property
    def mgmt_bridge(self) -> str:
        """The first management bridge: the orchestrator's address with the subnet's route."""
        return f"tb{self.id}-br"

    @property
    def mgmt_gateway(self) -> ipaddress.IPv4Interface:
        """The orchestrator's address on the management bridge (root namespace)."""
        return ipaddress.IPv4Interface((int(self.mgmt_subnet.network_address) + 1, self.mgmt_subnet.prefixlen))

    @property
    def mgmt_gateway_mac(self) -> str:
        """The MAC of every management bridge: the gateway's, wherever a server sits."""
        return mgmt_mac(self.id, 0)

    def mgmt_bridges(self) -> list[str]:
        """Every management bridge, `mgmt_bridge` first."""
        count = bridge_count(len(self.topology.servers), self.bridge_ports or BRIDGE_MAX_PORTS)
        return [self.mgmt_bridge] + [f"tb{self.id}-b{n}" for n in range(1, count)]

    def sysctls(self, node: str) -> dict[str, str]:
        values = dict(BASE_SYSCTLS) | {RPS_DEFAULT_MASK: cpu_mask(os.cpu_count() or 1)}
        if self.topology.nodes[node].forwards:
            values.update(FORWARDING_SYSCTLS)
        return values

    def container_name(self, node: str) -> str:
        return self.namespaces[node]

    def root_links(self) -> list[str]:
        """Every link of the lab in the root namespace: its bridges and server ports."""
        return self.mgmt_bridges() + [host_if for host_if, _ in self.mgmt.values()]
