"""Mininet objects attached to a live lab: the lab *is* a Mininet network to its users.

`testbed up` builds with netlink (much faster than Mininet's own build), then this module
hands out Mininet nodes whose shells enter the lab's existing namespaces or containers, so
Mininet's CLI (`pingall`, `h00 ping h33`, `link h00 l0s0 down`, `xterm`…) and scripts using
`node.cmd()` work on it unchanged. Nothing here creates or deletes network objects.

`link A B down|up` is the one command that changes the lab: Mininet's own version only
flips the interfaces, leaving relays without the routes the kernel dropped (BCube's pingall
stuck at 11/12 after down and up), so it goes through `net.link_status(a, b, up)`, which
the CLI points at the fault path and which defaults to `Lab.set_link`.
"""

from __future__ import annotations

from mininet.link import Intf, Link
from mininet.log import error
from mininet.net import Mininet
from mininet.node import Node


class AttachedNode(Node):
    """A Mininet node whose shell runs in an existing namespace (or a container's)."""

    def __init__(self, name: str, prefix: list[str], **params) -> None:
        self.prefix = prefix
        super().__init__(name, inNamespace=True, **params)

    def _popen(self, cmd, **params):
        # Mininet starts its shell with `mnexec -cdn …`, which would make a new namespace;
        # enter ours instead, detached from our terminal as mnexec -d would be.
        if cmd and cmd[0] == "mnexec" and self.shell is None:
            cmd = self.prefix + list(cmd[2:])
            params["start_new_session"] = True
        return super()._popen(cmd, **params)

    def addIntf(self, intf, port=None, moveIntfFn=None):  # noqa: N802,N803 (Mininet's names)
        # the interface already lives in this node's namespace: never move it
        return super().addIntf(intf, port=port, moveIntfFn=lambda *args: None)


class AttachedIntf(Intf):
    """An existing interface; uses `ip` because lab images carry no ifconfig."""

    def __init__(self, name: str, node: Node, address=None) -> None:
        super().__init__(name, node=node, up=None)  # up=None: do not touch it now
        if address is not None:
            self.ip, self.prefixLen = str(address.ip), address.network.prefixlen

    def ifconfig(self, *args):
        if args and args[0] in ("up", "down"):
            return self.cmd("ip", "link", "set", "dev", self.name, args[0])
        return self.cmd("ip", "addr", "show", "dev", self.name)


class AttachedLink(Link):
    """The pair of interfaces of an existing veth link (Mininet's Link would create one)."""

    def __init__(self, intf1: Intf, intf2: Intf) -> None:  # noqa: D107 - no super(): no creation
        self.intf1, self.intf2 = intf1, intf2
        intf1.link = intf2.link = self

    def stop(self):
        pass

    def delete(self):
        pass


class AttachedNet(Mininet):
    """Mininet's network over a live lab, whose `link` command changes the lab's links
    through `link_status(a, b, up)` rather than flipping the interfaces behind its back."""

    def __init__(self, lab, **params) -> None:
        super().__init__(**params)
        self.link_status = lambda a, b, up: lab.set_link(a, b, up)

    def configLinkStatus(self, src: str, dst: str, status: str) -> None:  # noqa: N802 (Mininet's name)
        if src not in self.nameToNode or dst not in self.nameToNode:
            error(f"src or dst not in network: {src} {dst}\n")
            return
        if status not in ("up", "down"):
            error(f"unknown link status {status!r}: up or down\n")
            return
        from orchestrator.errors import TestbedError

        try:
            self.link_status(src, dst, status == "up")
        except TestbedError as exc:
            error(f"{exc}\n")


def attach(lab) -> Mininet:
    """A Mininet network for a live lab, nodes attached, nothing built."""
    Mininet.inited = True  # skip Mininet.init(): it raises host-wide limits and sysctls
    net = AttachedNet(lab, topo=None, build=False, controller=None)
    net.built = True
    nodes = {}
    for node in lab.topology.nodes.values():
        attached = AttachedNode(node.name, lab.command_prefix(node.name))
        for port, iface in enumerate(i for i in node.interfaces.values() if not i.is_bridge):
            AttachedIntf(iface.name, attached, iface.address)
        nodes[node.name] = attached
        (net.hosts if node.is_server else net.switches).append(attached)
        net.nameToNode[node.name] = attached
    for link in lab.topology.links:
        a, b = nodes[link.a.node], nodes[link.b.node]
        net.links.append(AttachedLink(a.nameToIntf[link.a.interface], b.nameToIntf[link.b.interface]))
    return net
