"""Labs beyond one Linux bridge (1,023 ports): a management network over several bridges
that the host routes between, servers that still cannot reach each other over it, and the
refusals of what this host cannot hold, before anything is built.

The 1,024-server lab (fattree,16: 1,344 namespaces, 3,072 links) takes about a minute to
come up and a few seconds to go on this project's machines (2 cores), inside CI's budget.
It needs more learnt ARP entries than a stock kernel allows (6,144 for its routes; the
default net.ipv4.neigh.default.gc_thresh3 is 1,024), so the test raises that host-wide
limit as a user must, and puts it back.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from orchestrator.emulation import Lab, capacity, kernel, plan
from orchestrator.emulation.journal import LabState
from orchestrator.errors import HostLimit, TopologyError
from orchestrator.spec import lab_from_argument
from tests.netns.probes import unreachable_pairs

GC_THRESH3 = Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3")


def host_reaches(addresses: list[str]) -> set[str]:
    """The addresses the root namespace gets an echo reply from (one fping to all)."""
    out = subprocess.run(["fping", "-a", "-r", "2", "-t", "500", "-i", "1", *addresses],
                         capture_output=True, text=True, timeout=300).stdout
    return set(out.split())


def alive_from(lab: Lab, server: str, addresses: list[str]) -> set[str]:
    """The addresses `server` gets an echo reply from."""
    proc = lab.popen(server, ["fping", "-a", "-r", "0", "-t", "300", "-i", "1", *addresses],
                     stdout=-1, stderr=-1, text=True)
    out, _ = proc.communicate(timeout=300)
    return set(out.split())


def root_links_of(lab: Lab) -> set[str]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    return {name for name in names if name.startswith(f"tb{lab.plan.id}-")}


def check_management(lab: Lab) -> None:
    """The orchestrator reaches every server; a server reaches no other, on its own bridge
    or another; every root link is journalled and in the lab's netdev group; the host holds
    a permanent ARP entry for every server, on the server's bridge."""
    servers = [s.name for s in lab.topology.servers]
    address = {s: str(lab.mgmt_address(s)) for s in servers}
    assert host_reaches(list(address.values())) == set(address.values())
    by_bridge: dict[str, list[str]] = {}
    for server in servers:
        by_bridge.setdefault(lab.plan.mgmt_master[server], []).append(server)
    assert list(by_bridge) == lab.plan.mgmt_bridges() and len(by_bridge) > 1
    for bridge, members in by_bridge.items():
        source = members[0]
        others = [address[s] for s in servers if s != source]
        assert alive_from(lab, source, others) == set(), (bridge, source)
    journal = {e.name for e in lab.state.journal() if e.kind == "host_link"}
    assert root_links_of(lab) == set(lab.plan.root_links()) <= journal
    grouped = subprocess.run(["ip", "-o", "link", "show", "group", str(lab.plan.link_group)],
                             capture_output=True, text=True).stdout
    assert len(grouped.splitlines()) == len(lab.plan.root_links())
    for bridge, members in by_bridge.items():
        permanent = subprocess.run(["ip", "neigh", "show", "nud", "permanent", "dev", bridge],
                                   capture_output=True, text=True).stdout
        assert {line.split()[0] for line in permanent.splitlines()} == {address[s] for s in members}


def check_gone(lab: Lab) -> None:
    assert root_links_of(lab) == set()
    assert kernel.list_namespaces(f"{plan.NAMESPACE_PREFIX}{lab.name}-") == []
    assert not LabState(lab.name).exists()


def test_management_over_several_bridges(monkeypatch):
    """The layout of a 1,024-server lab, in small: 16 servers on bridges of at most 4 ports."""
    monkeypatch.setattr(plan, "BRIDGE_MAX_PORTS", 4)
    lab = Lab.up(lab_from_argument("fattree,4", **{"servers.runtime": "netns", "name": "scale-split"}))
    try:
        assert len(lab.plan.mgmt_bridges()) == 4
        check_management(lab)
        servers = [s.name for s in lab.topology.servers]
        assert unreachable_pairs(lab, sources=servers[::5]) == []  # the fabric is untouched
    finally:
        lab.down()
    check_gone(lab)


@pytest.fixture
def neighbour_room():
    """Room for fattree,16's learnt ARP entries in the host-wide table, for this test only."""
    before = int(GC_THRESH3.read_text())
    wanted = 16384  # what `up` tells the user to set for this lab
    if before < wanted:
        GC_THRESH3.write_text(str(wanted))
    yield
    if before < wanted:
        GC_THRESH3.write_text(str(before))


def test_1024_servers(neighbour_room):
    spec = lab_from_argument("fattree,16", **{"servers.runtime": "netns", "name": "scale-1024"})
    lab = Lab.up(spec)
    try:
        assert len(lab.topology.servers) == 1024
        assert lab.plan.mgmt_bridges() == [f"tb{lab.plan.id}-br", f"tb{lab.plan.id}-b1"]
        check_management(lab)
        # across pods, through edge, aggregation and core routers, both ways
        far = {"p0e0h0": "p15e7h7", "p15e7h7": "p0e0h0", "p7e3h1": "p8e4h2"}
        for src, dst in far.items():
            assert alive_from(lab, src, [str(lab.topology.address_of(dst))]), (src, dst)
    finally:
        lab.down()
    check_gone(lab)


def test_up_refuses_what_the_host_cannot_hold_before_building(monkeypatch):
    stock = capacity.HostLimits(gc_thresh3=1024, open_files_soft=1024, open_files_hard=1024,
                                mem_available_mib=capacity.host_limits().mem_available_mib)
    monkeypatch.setattr(capacity, "host_limits", lambda: stock)
    cases = [
        ("fattree,12", HostLimit, "net.ipv4.neigh.default.gc_thresh3"),
        ("star,1100", TopologyError, "BR_MAX_PORTS"),
    ]
    for argument, error, names in cases:
        name = f"scale-refused-{argument.split(',')[0]}"
        with pytest.raises(error, match=names):
            Lab.up(lab_from_argument(argument, **{"servers.runtime": "netns", "name": name}))
        assert not LabState(name).exists()
        assert kernel.list_namespaces(f"{plan.NAMESPACE_PREFIX}{name}-") == []


def test_an_explicit_management_subnet_inside_a_host_network_is_refused():
    candidates = [(n, dev) for n, dev in kernel.root_networks_on()
                  if not n.is_loopback and n.prefixlen <= 30 and not n.overlaps(ipaddress.IPv4Network("100.64.0.0/10"))]
    if not candidates:
        pytest.skip("this host has no network outside loopback and 100.64.0.0/10 to collide with")
    network, device = candidates[0]
    subnet = next(network.subnets(new_prefix=max(24, network.prefixlen)))
    spec = lab_from_argument("star,2", **{
        "servers.runtime": "netns", "name": "scale-subnet", "management.subnet": str(subnet),
        "addressing.data": "100.64.0.0/16", "addressing.links": "100.65.0.0/16",
    })
    with pytest.raises(TopologyError) as caught:
        Lab.up(spec)
    assert f"management.subnet {subnet} overlaps" in str(caught.value)
    assert device in str(caught.value)
    assert not LabState("scale-subnet").exists()
