"""Wires between hosts (issue 31, orchestrator/hosts/wires.py): a link whose ends a placement
puts on two hosts is two VXLAN devices made from each host's namespace and created inside the
nodes' namespaces. The nodes see plain NICs that carry their traffic, shaped like a veth; two
wires between the same two hosts do not hear each other; a node sees no underlay."""

from __future__ import annotations

import ipaddress
import subprocess
import uuid

import pytest

from orchestrator.emulation import kernel
from orchestrator.hosts import wires
from orchestrator.hosts.fake import fake_hosts
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.partition import Host, Placement


def two_pairs():
    """Two separate server pairs, each on its own l2 switch: a–s–b and c–t–d."""
    builder = TopologyBuilder("pairs", {})
    for name in "abcd":
        builder.server(name)
    for name in "st":
        builder.switch(name, "l2")
    for server, switch in zip("abcd", "sstt"):
        builder.link(server, switch)
    return builder.build({})


def run(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(kernel.in_netns(ns) + list(argv), capture_output=True, text=True, timeout=30)


@pytest.fixture
def split():
    """The two pairs with each server's link crossing: servers on host x, switches on host y."""
    topology = two_pairs()
    host_of = {"a": "x", "b": "x", "c": "x", "d": "x", "s": "y", "t": "y"}
    placement = Placement((Host("x"), Host("y")), host_of, "by hand")
    prefix = f"tbw{uuid.uuid4().hex[:4]}"
    nodes = {name: f"{prefix}-n-{name}" for name in topology.nodes}
    with fake_hosts(prefix, ["x", "y"]) as hosts:
        kernel.create_namespaces(list(nodes.values()))
        try:
            planned = wires.plan(topology, placement, taken=[wires.MIN_VNI + 1])
            with kernel.Netlink() as nl:
                nl.open([*nodes.values(), *(hosts.namespace(h) for h in hosts.names)])
                for node in ("s", "t"):
                    kernel.add_bridge(nl, nodes[node], "br0")
                for wire in planned:
                    for end, here, there in wire.ends():
                        kernel.add_vxlan(nl, hosts.namespace(here), end.interface, wire.vni, hosts.address(here),
                                         hosts.address(there), nodes[end.node], 1000, 1500)
                        kernel.set_up(nl, nodes[end.node], end.interface)
                        kernel.shape(nl, nodes[end.node], end.interface, 50_000_000, 100)
                        if end.node in ("s", "t"):
                            kernel.enslave(nl, nodes[end.node], end.interface, "br0")
                # a and c, b and d share one subnet: only the wires keep the pairs apart
                for index, name in enumerate("abcd"):
                    iface = f"{name}-eth0"
                    kernel.add_address(nl, nodes[name], iface, ipaddress.IPv4Interface(f"10.99.0.{index + 1}/24"))
            yield topology, planned, nodes, hosts
        finally:
            for space in nodes.values():
                kernel.delete_namespace(space)


def test_wires_carry_their_link_and_nothing_else(split):
    topology, planned, nodes, hosts = split
    assert [w.vni for w in planned] == [wires.MIN_VNI, wires.MIN_VNI + 2, wires.MIN_VNI + 3, wires.MIN_VNI + 4]
    assert run(nodes["a"], "ping", "-c", "2", "-i", "0.2", "-W", "1", "10.99.0.2").returncode == 0  # a–s–b
    assert run(nodes["c"], "ping", "-c", "2", "-i", "0.2", "-W", "1", "10.99.0.4").returncode == 0  # c–t–d
    assert run(nodes["a"], "ping", "-c", "1", "-W", "1", "10.99.0.3").returncode != 0  # c is on the other wires
    shown = run(nodes["a"], "ip", "-d", "link", "show", "a-eth0").stdout
    assert "vxlan id" in shown and "nolearning" in shown and f"link-netns {hosts.namespace('x')}" in shown
    with kernel.Netlink() as nl:
        assert kernel.read_rate(nl, nodes["a"], "a-eth0") == 50_000_000
    shown = run(nodes["a"], "ip", "-o", "-4", "address").stdout.split()
    seen = {ipaddress.IPv4Interface(word).ip for word in shown if "/" in word}
    assert seen == {ipaddress.IPv4Address("10.99.0.1")}  # its own, no underlay (lo is down)
