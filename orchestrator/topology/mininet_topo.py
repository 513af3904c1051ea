"""Mininet interop: any testbed topology as a Mininet `Topo` that configures itself.

`to_mininet(topology)` gives a Topo with the same nodes, links and interface names. Its node
classes carry our address plan and routes, so `Mininet(to_mininet(t))` (or `mn --custom
topologies/mn_custom.py --topo bcube,4,1`) builds a network that routes like a testbed lab:
servers are Hosts that relay where the topology says so; switches are Switch subclasses
living in their own namespaces (an l2 bridge, or an l3 router with ECMP), which keeps them
out of the root namespace where Docker's FORWARD DROP would silence a Linux bridge.

This is the path for Mininet users; `testbed up` builds the same network with netlink,
much faster, and attaches Mininet nodes to it for `testbed cli`.
"""

from __future__ import annotations

from mininet.link import Link, TCLink
from mininet.node import Host, Switch
from mininet.topo import Topo

from orchestrator.topology.model import BRIDGE, FORWARDING_SYSCTLS, Node, Topology


def ip_commands(topology: Topology, node: Node) -> list[str]:
    """The `ip`/`sysctl` commands that configure `node` once its interfaces exist."""
    commands = []
    if node.forwards:
        commands.append("sysctl -qw " + " ".join(f"{k}={v}" for k, v in FORWARDING_SYSCTLS.items()))
    bridge = node.interfaces.get(BRIDGE)
    if bridge is not None:
        commands.append(f"ip link add {BRIDGE} type bridge stp_state 0 forward_delay 0")
        commands.append(f"ip link set {BRIDGE} up")
    for iface in node.interfaces.values():
        if iface.master:
            commands.append(f"ip link set {iface.name} master {iface.master}")
        if iface.address is not None:
            commands.append(f"ip addr add {iface.address} dev {iface.name}")
    for route in topology.routes_of(node.name):
        hops = " ".join(
            f"nexthop via {h.via} dev {h.dev}" if h.via else f"nexthop dev {h.dev}"
            for h in route.nexthops
        )
        commands.append(f"ip route replace {route.prefix} {hops}")
    return commands


class TestbedHost(Host):
    """A server: addresses on every NIC, relaying and routes where the topology says."""

    __test__ = False

    def config(self, commands: list[str] | None = None, addresses: dict | None = None, **params):
        result = super().config(**params)
        for command in commands or []:
            self.cmd(command)
        for ifname, address in (addresses or {}).items():  # so IP() and pingall know them
            intf = self.nameToIntf[ifname]
            intf.ip, intf.prefixLen = address.split("/")
        return result


class _NamespacedSwitch(Switch):
    """A switch in its own network namespace, configured by shell commands at start."""

    def __init__(self, name: str, commands: list[str] | None = None, **params):
        params["inNamespace"] = True  # Mininet.addSwitch passes False; a bridge here must not
        super().__init__(name, **params)
        self.commands = commands or []

    def start(self, controllers):
        for command in self.commands:
            self.cmd(command)

    def connected(self) -> bool:
        return True  # nothing to connect to: no controller is involved


class BridgeSwitch(_NamespacedSwitch):
    """An l2 switch: a Linux bridge inside the switch's namespace."""


class RouterSwitch(_NamespacedSwitch):
    """An l3 switch: forwarding on, ECMP routes, an access bridge for its servers."""


def to_mininet(topology: Topology, bandwidth_mbit: float | None = None, **link_params) -> Topo:
    """A Mininet Topo for `topology`. With `bandwidth_mbit`, links are TCLinks shaped to it."""
    topo = Topo()
    for index, node in enumerate(topology.nodes.values()):
        commands = ip_commands(topology, node)
        if node.is_server:
            addresses = {i.name: str(i.address) for i in node.data_nics()}
            topo.addHost(
                node.name, cls=TestbedHost, ip=None, commands=commands, addresses=addresses
            )
        else:
            cls = BridgeSwitch if node.kind == "l2" else RouterSwitch
            topo.addSwitch(node.name, cls=cls, dpid=f"{index + 1:016x}", commands=commands)
    params = dict(link_params)
    if bandwidth_mbit is not None:
        params.update(cls=TCLink, bw=bandwidth_mbit)
    else:
        params.setdefault("cls", Link)
    for link in topology.links:
        topo.addLink(
            link.a.node,
            link.b.node,
            intfName1=link.a.interface,
            intfName2=link.b.interface,
            **params,
        )
    return topo
