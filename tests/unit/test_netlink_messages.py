"""The requests kernel.py encodes itself are byte for byte what pyroute2 encodes (pyroute2's
IPBatch encodes without sending), apart from the sequence number Netlink.request writes."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from orchestrator.emulation import kernel

IPBatch = kernel.pyroute2().IPBatch  # with the link attributes kernel.py names for it
IP = ipaddress.IPv4Address


def pyroute2_bytes(call) -> bytes:
    batch = IPBatch()
    try:
        call(batch)
        return bytes(batch.batch)
    finally:
        batch.close()


def same(ours: bytes, theirs: bytes) -> None:
    """Equal but for the header's sequence number and port id (bytes 8-16)."""
    assert len(ours) == len(theirs)
    assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:], (ours.hex(), theirs.hex())


@pytest.mark.parametrize("kwargs,ours", [
    ({"dst": "10.1.0.0/16", "oif": 5, "gateway": "10.0.0.2"},
     kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, IP("10.0.0.2"))])),
    ({"dst": "10.1.0.0/16", "oif": 5}, kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, None)])),
    ({"dst": "0.0.0.0/0", "oif": 5, "gateway": "10.0.0.2"},
     kernel.route_message(ipaddress.IPv4Network("0.0.0.0/0"), [(5, IP("10.0.0.2"))])),
    ({"dst": "10.0.0.0/8", "multipath": [{"oif": 5}, {"oif": 6, "gateway": "10.0.1.2"}]},
     kernel.route_message(ipaddress.IPv4Network("10.0.0.0/8"), [(5, None), (6, IP("10.0.1.2"))])),
    ({"dst": "10.1.0.0/16", "oif": 5, "gateway": "10.0.0.2", "metrics": {"cc_algo": "bbr"}},
     kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, IP("10.0.0.2"))],
                          metrics=kernel.RouteMetrics("bbr"))),
    ({"dst": "10.1.0.0/16", "oif": 5, "gateway": "10.0.0.2",
      "metrics": {"initcwnd": 100, "initrwnd": 100, "cc_algo": "cubic"}},
     kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, IP("10.0.0.2"))],
                          metrics=kernel.RouteMetrics("cubic", 100))),
    ({"dst": "10.1.0.0/16", "oif": 5, "metrics": {"initcwnd": 40, "initrwnd": 40}},
     kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, None)], metrics=kernel.RouteMetrics(initcwnd=40))),
    ({"dst": "10.1.0.0/16", "oif": 5, "metrics": {"initcwnd": 100, "features": 1, "initrwnd": 100,
                                                  "cc_algo": "dctcp"}},
     kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, None)],
                          metrics=kernel.RouteMetrics("dctcp", 100, ecn=True))),
    ({"dst": "198.18.2.0/23", "oif": 9, "prefsrc": "198.18.0.1"},
     kernel.route_message(ipaddress.IPv4Network("198.18.2.0/23"), [(9, None)], source=IP("198.18.0.1"))),
])
def test_route_add(kwargs, ours):
    same(ours, pyroute2_bytes(lambda b: b.route("add", **kwargs)))


def test_route_replace_with_multipath_and_congestion():
    ours = kernel.route_message(ipaddress.IPv4Network("10.1.0.0/16"), [(5, IP("10.0.0.2")), (6, IP("10.0.1.2"))],
                                replace=True, metrics=kernel.RouteMetrics("dctcp"))
    theirs = pyroute2_bytes(lambda b: b.route(
        "replace", dst="10.1.0.0/16", multipath=[{"oif": 5, "gateway": "10.0.0.2"}, {"oif": 6, "gateway": "10.0.1.2"}],
        metrics={"cc_algo": "dctcp"}))
    same(ours, theirs)


def test_connected_route_with_congestion():
    ours = kernel.route_message(ipaddress.IPv4Network("10.1.0.0/24"), [(5, None)], replace=True,
                                metrics=kernel.RouteMetrics("cubic"),
                                source=IP("10.1.0.2"), scope=253, protocol=2)
    theirs = pyroute2_bytes(lambda b: b.route(
        "replace", dst="10.1.0.0/24", oif=5, prefsrc="10.1.0.2", scope=253, proto=2, metrics={"cc_algo": "cubic"}))
    same(ours, theirs)


def test_address_neighbour_link_up_and_isolation():
    same(kernel.address_message(5, ipaddress.IPv4Interface("10.0.0.1/24")),
         pyroute2_bytes(lambda b: b.addr("add", index=5, address="10.0.0.1", prefixlen=24)))
    same(kernel.neighbour_message(5, IP("198.18.0.2"), "0e:01:02:03:00:01", kernel.NUD_PERMANENT),
         pyroute2_bytes(lambda b: b.neigh("replace", dst="198.18.0.2", lladdr="0e:01:02:03:00:01", ifindex=5, state=0x80)))
    same(kernel.link_up_message(5, "x"), pyroute2_bytes(lambda b: b.link("set", index=5, state="up")))
    same(kernel.link_up_message(None, "mgmt0"), pyroute2_bytes(lambda b: b.link("set", ifname="mgmt0", state="up")))
    same(kernel.isolate_message("tb123456-7"),
         pyroute2_bytes(lambda b: b.link("set", ifname="tb123456-7", kind="bridge_slave", isolated=1)))


@pytest.mark.parametrize("args,options", [
    (("add", "htb", kernel.HTB_ROOT), {"default": 1}),
    (("add-class", "htb", kernel.HTB_CLASS),
     {"parent": kernel.HTB_ROOT, "rate": "100000000bit", "ceil": "100000000bit", "burst": 67050, "cburst": 67050,
      "quantum": 12112}),
    (("add", "pfifo", kernel.LEAF), {"parent": kernel.HTB_CLASS, "limit": 1000}),
])
def test_tc_templates_carry_the_interface_index(args, options):
    command, kind, handle = args
    for index in (3, 70000):
        ours = kernel.tc_message(index, command, kind, handle, **options)
        same(ours, pyroute2_bytes(lambda b: b.tc(command, kind, index, handle, **options)))
        assert struct.unpack_from("=i", ours, 20)[0] == index


def test_veth_pairs():
    gso = kernel.BIG_GSO_BYTES
    ours = kernel.veth_message(kernel.VethEnd("h0-eth0", 1000, 1500, gso, ns_fd=1234),
                               kernel.VethEnd("p0e0-eth1", 1000, 1500, gso, ns_fd=1235))
    big = {"gso_max_size": gso, "gro_max_size": gso, "gso_ipv4_max_size": gso, "gro_ipv4_max_size": gso}
    theirs = pyroute2_bytes(lambda b: b.link(
        "add", ifname="h0-eth0", kind="veth", state="up", txqlen=1000, mtu=1500, **big, net_ns_fd=1234,
        peer={"ifname": "p0e0-eth1", "txqlen": 1000, "mtu": 1500, **big, "net_ns_fd": 1235}))
    same(ours, theirs)
    ours = kernel.veth_message(kernel.VethEnd("tb123456-7", 1000, group=0x7E123456, master=9),
                               kernel.VethEnd("mgmt0", 1000, ns_fd=1235, mac="0e:12:34:56:00:08"))
    theirs = pyroute2_bytes(lambda b: b.link(
        "add", ifname="tb123456-7", kind="veth", state="up", txqlen=1000, group=0x7E123456, master=9,
        peer={"ifname": "mgmt0", "txqlen": 1000, "address": "0e:12:34:56:00:08", "net_ns_fd": 1235}))
    same(ours, theirs)


def test_links_are_read_as_pyroute2_reads_them():
    stats = struct.pack("=4Q", 7, 8, 700, 800) + bytes(8 * 20)
    body = struct.pack("=BBHiII", 0, 0, 1, 4, kernel.IFF_UP, 0)
    for kind, payload in [(kernel.IFLA_IFNAME, b"h0-eth0\0"), (kernel.IFLA_MTU, struct.pack("=I", 1500)),
                          (kernel.IFLA_OPERSTATE, b"\x06"), (kernel.IFLA_CARRIER, b"\x01"),
                          (kernel.IFLA_STATS64, stats), (kernel.IFLA_GSO_IPV4_MAX_SIZE, struct.pack("=I", 262144)),
                          (kernel.IFLA_TSO_MAX_SIZE, struct.pack("=I", 65536))]:
        body += kernel._attr(kind, payload)
    name, facts = kernel.parse_link(kernel._message(kernel.RTM_NEWLINK, 0, body))
    assert name == "h0-eth0"
    assert facts == {"state": "UP", "up": True, "carrier": True, "mtu": 1500, "gso_ipv4_bytes": 262144,
                     "tso_max_bytes": 65536, "rx_bytes": 700, "tx_bytes": 800, "rx_packets": 7, "tx_packets": 8}


def test_the_link_attributes_decoded_are_numbered_as_pyroute2_names_them():
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    names = {i: entry[0] for i, entry in enumerate(ifinfmsg.nla_map)}
    assert [names[n] for n in (kernel.IFLA_MTU, kernel.IFLA_OPERSTATE, kernel.IFLA_STATS64, kernel.IFLA_CARRIER,
                               kernel.IFLA_TSO_MAX_SIZE)] == \
        ["IFLA_MTU", "IFLA_OPERSTATE", "IFLA_STATS64", "IFLA_CARRIER", "IFLA_TSO_MAX_SIZE"]


def test_bridge_port_and_link_lookup():
    same(kernel.master_message(5, 9), pyroute2_bytes(lambda b: b.link("set", index=5, master=9)))
    same(kernel.get_link_message("mgmt0"), pyroute2_bytes(lambda b: b.link("get", ifname="mgmt0")))


def test_group_delete():
    body = struct.pack("=BBHiII", 0, 0, 0, 0, 0, 0) + kernel._attr(kernel.IFLA_GROUP, struct.pack("=I", 0x7E123456))
    ours = kernel._message(kernel.RTM_DELLINK, kernel.NLM_F_REQUEST | kernel.NLM_F_ACK, body)
    same(ours, pyroute2_bytes(lambda b: b.link("del", group=0x7E123456)))
