"""Labs in bare namespaces, through the real kernel: reachability, paths, shaping, ECMP,
isolation of the management network, refusal of what the kernel lacks, and teardown."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.emulation import Lab, cleanup, features, kernel
from orchestrator.emulation.lab import largest_super_packet
from orchestrator.emulation.journal import LabState
from orchestrator.errors import LabExists, MissingFeature, NodeNotFound
from orchestrator.spec import lab_from_argument
from tests.conftest import until
from tests.netns.probes import iperf3_mbit, l3_hops, traced_hops, tx_bytes, unreachable_pairs

READY = sorted(Path(__file__).resolve().parents[2].joinpath("topologies").glob("*.yaml"))


@pytest.mark.parametrize("lab_file", READY, ids=lambda p: p.stem)
def test_all_pairs_ping_on_every_ready_lab(make_lab, lab_file):
    lab = make_lab(str(lab_file), **{"servers.runtime": "netns"})
    assert unreachable_pairs(lab) == []


@pytest.mark.parametrize("shorthand", ["bcube,3,2", "torus,3,3", "fattree,6", "bigraph,6,2", "torus,2,3", "star,3"])
def test_all_pairs_ping_on_sizes_nobody_wrote_a_file_for(make_lab, shorthand):
    lab = make_lab(shorthand, **{"servers.runtime": "netns"})
    assert unreachable_pairs(lab, sources=[s.name for s in lab.topology.servers[::3]]) == []


def test_bcube_relay_path_matches_topology_route(make_lab):
    lab = make_lab("bcube,4,1", **{"servers.runtime": "netns"})
    for src, dst in [("h00", "h33"), ("h12", "h21"), ("h00", "h01"), ("h31", "h13")]:
        route = lab.topology.layered_paths(src, dst, first_only=True)[0]
        traced = traced_hops(lab, src, str(lab.topology.address_of(dst)))
        assert traced == l3_hops(route), (src, dst, route)
    # the relay really is a server: h00 → h33 goes through h30
    assert traced_hops(lab, "h00", "10.0.3.4")[0] == "h30"


@pytest.mark.parametrize("shorthand,pairs", [
    ("torus,4,2", [("t00", "t22"), ("t03", "t31"), ("t11", "t12")]),
    ("fattree,4", [("p0e0h0", "p3e1h1"), ("p0e0h0", "p0e1h0"), ("p2e1h1", "p2e1h0")]),
    ("bigraph,4,2", [("su0h0", "su1h1"), ("su0h0", "sl1h0")]),
])
def test_traced_path_is_one_of_the_routed_paths(make_lab, shorthand, pairs):
    lab = make_lab(shorthand, **{"servers.runtime": "netns"})
    for src, dst in pairs:
        traced = traced_hops(lab, src, str(lab.topology.address_of(dst)))
        allowed = [l3_hops(p) for p in lab.topology.layered_paths(src, dst)]
        assert traced in allowed, (src, dst, traced, allowed)


def test_iperf3_gets_90_to_100_percent_of_a_100mbit_link(make_lab):
    lab = make_lab("star,2", **{"servers.runtime": "netns", "links.bandwidth": "100Mbit"})
    goodput = iperf3_mbit(lab, "h0", "h1")
    assert 90 <= goodput <= 100, goodput


def test_shaping_is_per_link_rate_and_status_reports_it(make_lab):
    lab = make_lab("star,2", **{"servers.runtime": "netns", "links.bandwidth": "20Mbit"})
    goodput = iperf3_mbit(lab, "h0", "h1", seconds=2)
    assert 17 <= goodput <= 20, goodput
    report = lab.status()
    assert {l["rate_bps"] for l in report["links"]} == {20_000_000}
    assert all(l["state"] == "up" for l in report["links"])
    assert all(n["alive"] for n in report["nodes"])


def _send_udp_flows(lab, src: str, dst: str, ports: list[int], packets: int = 20) -> None:
    """UDP datagrams to `dst` from each source port in `ports` (each port is a 5-tuple)."""
    script = (
        "import socket,sys\n"
        "dst=sys.argv[1]\n"
        "for port in map(int, sys.argv[2:]):\n"
        "    s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('', port))\n"
        f"    [s.sendto(b'x'*1000, (dst, 9)) for _ in range({packets})]\n"
        "    s.close()\n"
    )
    proc = lab.popen(src, [sys.executable, "-c", script, dst, *map(str, ports)], stdout=-1, stderr=-1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def _uplink_tx(lab, edge: str) -> dict[str, int]:
    links = tx_bytes(lab, [edge])[edge]
    aggs = {l.other(edge).node: l.a.interface if l.a.node == edge else l.b.interface
            for l in lab.topology.links_of(edge) if l.other(edge).node.startswith(edge[:2] + "a")}
    return {agg: links[ifname] for agg, ifname in aggs.items()}


def test_ecmp_spreads_flows_and_keeps_each_flow_on_one_uplink(make_lab):
    lab = make_lab("fattree,4", **{"servers.runtime": "netns"})
    dst = str(lab.topology.address_of("p1e0h0"))
    before = _uplink_tx(lab, "p0e0")
    _send_udp_flows(lab, "p0e0h0", dst, list(range(40000, 40064)))
    spread = {agg: tx - before[agg] for agg, tx in _uplink_tx(lab, "p0e0").items()}
    total = sum(spread.values())
    assert len(spread) == 2 and total >= 64 * 20 * 1000
    assert min(spread.values()) > 0.1 * total, spread  # 64 flows, hashed: both uplinks used
    before = _uplink_tx(lab, "p0e0")
    _send_udp_flows(lab, "p0e0h0", dst, [41000], packets=200)  # one 5-tuple
    single = {agg: tx - before[agg] for agg, tx in _uplink_tx(lab, "p0e0").items()}
    assert sorted(v > 100_000 for v in single.values()) == [False, True], single


def test_fabric_down_leaves_only_the_management_network(make_lab):
    lab = make_lab("bcube,3,1", **{"servers.runtime": "netns"})
    for link in lab.topology.links:
        lab.set_link(link.a.node, link.b.node, up=False)
    servers = [s.name for s in lab.topology.servers]
    assert len(unreachable_pairs(lab, sources=servers[:3])) == 3 * (len(servers) - 1)
    # the orchestrator (root namespace) still reaches every server over management
    for server in servers:
        ping = subprocess.run(["ping", "-c1", "-W1", str(lab.mgmt_address(server))], capture_output=True)
        assert ping.returncode == 0, server
    # servers cannot use the management bridge to reach each other (isolated ports)
    assert len(unreachable_pairs(lab, sources=servers[:2], via="mgmt")) == 2 * (len(servers) - 1)
    # and bringing the fabric back restores the data plane
    for link in lab.topology.links:
        lab.set_link(link.a.node, link.b.node, up=True)
    assert unreachable_pairs(lab, sources=servers[:2]) == []


def test_management_network_is_not_routed_into_the_fabric(make_lab):
    lab = make_lab("fattree,4", **{"servers.runtime": "netns"})
    subnet = lab.plan.mgmt_subnet
    for node in lab.topology.nodes:
        routes = lab.exec(node, ["ip", "-j", "route"]).stdout
        for route in json.loads(routes):
            if route["dst"] != "default":
                net = ipaddress.IPv4Network(route["dst"], strict=False)
                assert not (net.overlaps(subnet) and route.get("dev") != "mgmt0"), (node, route)
    assert "mgmt0" not in lab.exec("p0e0", ["ip", "-br", "link"]).stdout  # switches have none


def test_two_labs_side_by_side(make_lab):
    a = make_lab("star,3", name="side-a", **{"servers.runtime": "netns"})
    b = make_lab("star,3", name="side-b", **{"servers.runtime": "netns"})
    assert a.plan.mgmt_subnet != b.plan.mgmt_subnet
    assert a.plan.mgmt_bridge != b.plan.mgmt_bridge
    assert unreachable_pairs(a) == [] and unreachable_pairs(b) == []
    b.down()
    assert unreachable_pairs(a) == []


def test_second_up_of_a_live_lab_is_refused(make_lab):
    lab = make_lab("star,2", **{"servers.runtime": "netns"})
    with pytest.raises(LabExists, match="already live"):
        Lab.up(lab.spec)
    assert unreachable_pairs(lab) == []  # and the live one is untouched


def test_unknown_node_is_a_clear_error(make_lab):
    lab = make_lab("star,2", **{"servers.runtime": "netns"})
    with pytest.raises(NodeNotFound, match="no node 'h9'"):
        lab.exec("h9", "true")


@pytest.mark.parametrize("asked,feature", [
    ({"links.delay": "5ms"}, "netem"),
    ({"links.loss": 1}, "netem"),
    ({"links.overrides": [{"link": "h0-sw", "delay": "2ms"}]}, "netem"),  # one link's own delay
    ({"rdma": "softroce"}, "rdma_rxe"),
    ({"links.queue": {"discipline": "red", "min": 20, "max": 20}}, "red"),
    ({"links.queue": {"discipline": "codel", "ce_threshold": "1ms"}}, "codel"),
    ({"links.queue": {"packets": 100, "discipline": "fq_codel"}}, "fq_codel"),
])
def test_lab_needing_a_missing_kernel_feature_is_refused_before_building(asked, feature):
    if features.kernel_features()[feature]:
        pytest.skip(f"this kernel has {feature}; the refusal path cannot be exercised here")
    spec = lab_from_argument("star,2", name="refused", **{"servers.runtime": "netns", **asked})
    with pytest.raises(MissingFeature) as raised:
        Lab.up(spec)
    message = str(raised.value)
    assert "\n" not in message and ("sch_netem" in message or "rdma_rxe" in message
                                     or f"CONFIG_NET_SCH_{feature.upper()}" in message)
    assert not LabState("refused").exists()
    assert kernel.list_namespaces("testbed-refused-") == []


def test_dctcp_on_a_kernel_without_it_is_refused_naming_the_kernel_option():
    if features.tcp_congestion_available("dctcp"):
        pytest.skip("this kernel has dctcp; the refusal path cannot be exercised here (the vm tier runs dctcp)")
    spec = lab_from_argument("star,2", name="refused", **{"servers.runtime": "netns", "servers.tcp_congestion": "dctcp"})
    with pytest.raises(MissingFeature, match="CONFIG_TCP_CONG_DCTCP") as raised:
        Lab.up(spec)
    assert "\n" not in str(raised.value)
    assert not LabState("refused").exists()
    assert kernel.list_namespaces("testbed-refused-") == []


def test_unavailable_tcp_congestion_control_is_refused_before_building():
    spec = lab_from_argument("star,2", name="refused", **{"servers.runtime": "netns", "servers.tcp_congestion": "nosuchcc"})
    with pytest.raises(MissingFeature, match=r"^servers\.tcp_congestion: 'nosuchcc' is not available") as raised:
        Lab.up(spec)
    assert "\n" not in str(raised.value)
    assert not LabState("refused").exists()
    assert kernel.list_namespaces("testbed-refused-") == []


def test_clean_removes_the_namespace_of_a_killed_feature_probe_only():
    """A probe killed between creating and deleting its namespace leaves it behind; clean
    removes it, and never the namespace of a probe still running."""
    probe = subprocess.run(
        [sys.executable, "-c", "import os, signal; from orchestrator.emulation import features; "
         "features.kernel.delete_namespace = lambda ns: os.kill(os.getpid(), signal.SIGKILL); features.kernel_features()"],
    )
    assert probe.returncode == -9
    orphans = kernel.list_namespaces(features.PROBE_PREFIX)
    assert orphans, "the killed probe left no namespace to clean"
    live = f"{features.PROBE_PREFIX}{os.getpid()}"
    kernel.create_namespaces([live])
    try:
        cleanup.clean_lab("no-such-lab")
        assert kernel.list_namespaces(features.PROBE_PREFIX) == [live]
    finally:
        kernel.delete_namespace(live)


def _df_ping_passes(lab, src: str, dst: str, payload: int) -> bool:
    """One ping with `payload` bytes (+28 of headers) that must not be fragmented."""
    address = str(lab.topology.address_of(dst))
    return lab.exec(src, ["ping", "-M", "do", "-c", "1", "-W", "2", "-s", str(payload), address]).returncode == 0


@pytest.mark.parametrize(("shorthand", "mtu"), [("fattree,4", 9000), ("bcube,2,1", 4200), ("star,3", None)])
def test_links_carry_the_labs_mtu_end_to_end(make_lab, shorthand, mtu):
    """Across routers (Fat-Tree), relaying servers and bridges (BCube): a packet of exactly
    the MTU crosses the farthest path unfragmented, one byte more is refused."""
    overrides = {"servers.runtime": "netns"} | ({"links.mtu": mtu} if mtu else {})
    lab = make_lab(shorthand, **overrides)
    expected = mtu or 1500
    assert {l["mtu"] for l in lab.status()["links"]} == {expected}
    servers = [s.name for s in lab.topology.servers]
    src, dst = servers[0], servers[-1]
    assert _df_ping_passes(lab, src, dst, expected - 28)
    assert not _df_ping_passes(lab, src, dst, expected - 27)


def test_both_ends_of_every_fabric_link_take_big_tcp_super_packets(make_lab):
    """Where the kernel has IPv4 BIG TCP, both ends of a link must carry the same limit: an
    end with a smaller one makes the kernel cut every super-packet up in software (it cost a
    ring ~20 % of its busbw)."""
    release = os.uname().release
    if tuple(int(x) for x in re.findall(r"\d+", release)[:2]) < (6, 3):
        pytest.skip(f"kernel {release} has no IPv4 BIG TCP (Linux 6.3+)")
    assert features.kernel_features()["big_tcp"]  # the probe finds it on both ends of a veth
    lab = make_lab("bcube,2,1", **{"servers.runtime": "netns"})
    with kernel.Netlink() as nl:
        ends = {node: kernel.links_in(nl, lab.plan.namespaces[node]) for node in lab.topology.nodes}
    for link in lab.topology.links:
        sizes = {ends[e.node][e.interface]["gso_ipv4_bytes"] for e in (link.a, link.b)}
        assert sizes == {kernel.BIG_GSO_BYTES}, (link, sizes)


def test_a_run_of_small_transfers_gets_smaller_super_packets_from_the_servers_nics(make_lab):
    """A super-packet leaves whole, so transfers of few of them sharing a link end up to one
    apart: a run sizes its servers' NICs for its smallest transfer (at least 8 each, never
    below 64 KiB or above what the lab was built with); the switches' ends keep theirs."""
    lab = make_lab("bcube,2,1", **{"servers.runtime": "netns"})
    built = largest_super_packet()

    def sizes() -> dict[tuple[str, str], int]:
        with kernel.Netlink() as nl:
            ends = {node: kernel.links_in(nl, lab.plan.namespaces[node]) for node in lab.topology.nodes}
        return {(e.node, e.interface): ends[e.node][e.interface]["gso_ipv4_bytes"]
                for link in lab.topology.links for e in (link.a, link.b)}

    servers = {s.name for s in lab.topology.servers}
    assert set(sizes().values()) == {built}
    assert lab.fit_super_packets(512 * 1024) == 64 * 1024
    now = sizes()
    assert {v for (node, _), v in now.items() if node in servers} == {64 * 1024}
    assert {v for (node, _), v in now.items() if node not in servers} == {built}
    assert lab.fit_super_packets(8 * 2**20) == built and set(sizes().values()) == {built}
    one = sorted(servers)[0]  # a job's servers alone: the others' keep what they have
    assert lab.fit_super_packets(512 * 1024, {one}) == 64 * 1024
    assert {node for (node, _), v in sizes().items() if v == 64 * 1024} == {one}


def test_a_slow_links_servers_get_super_packets_of_a_few_milliseconds_of_its_line_time(make_lab):
    """A super-packet crosses a link whole, so it is the link's unit of time: at most 5.5 ms of
    line time however large the transfers, by each NIC's own link (links.overrides): 32 KiB at
    the lab's 50 Mbit, 16 KiB on a 20 Mbit link."""
    lab = make_lab("bcube,2,1", **{"servers.runtime": "netns", "links.bandwidth": "50Mbit",
                                   "links.overrides": [{"link": "l0s0-h00", "bandwidth": "20Mbit"}]})
    assert lab.fit_super_packets(64 * 2**20) == 32 * 1024
    with kernel.Netlink() as nl:
        sizes = {(s.name, nic.name): kernel.links_in(nl, lab.plan.namespaces[s.name])[nic.name]["gso_ipv4_bytes"]
                 for s in lab.topology.servers for nic in s.data_nics()}
    [slow] = [(end.node, end.interface) for link in lab.topology.links for end in (link.a, link.b)
              if end.node == "h00" and link.other("h00").node == "l0s0"]
    assert sizes.pop(slow) == 16 * 1024 and set(sizes.values()) == {32 * 1024}, sizes


def test_fabric_interfaces_steer_each_flow_to_one_cpu(make_lab):
    """Receive Packet Steering on every CPU, so a veth cannot reorder a flow's packets."""
    if not Path("/proc/sys/net/core/rps_default_mask").exists():
        pytest.skip(f"kernel {os.uname().release} has no net.core.rps_default_mask (Linux 6.2+)")
    lab = make_lab("fattree,4", **{"servers.runtime": "netns"})
    expected = int("1" * os.cpu_count(), 2)
    for node in ("p0e0h0", "p0e0", "c0"):  # a server, an edge switch, a core switch
        for iface in (l.a.interface if l.a.node == node else l.b.interface for l in lab.topology.links_of(node)):
            # `ip netns exec` mounts the namespace's own /sys (a lab's exec only enters the netns)
            masks = subprocess.run(["ip", "netns", "exec", lab.plan.namespaces[node], "sh", "-c",
                                    f"cat /sys/class/net/{iface}/queues/rx-*/rps_cpus"],
                                   capture_output=True, text=True).stdout.split()
            assert masks and all(int(m.replace(",", ""), 16) == expected for m in masks), (node, iface, masks)


@pytest.mark.parametrize("congestion, initcwnd, after_idle", [(None, "default", None), ("reno", 20, True),
                                                              (None, None, False)])
def test_servers_connections_use_the_labs_tcp_settings_after_a_link_flap_too(make_lab, tmp_path, congestion,
                                                                              initcwnd, after_idle):
    servers = {"runtime": "netns"} | ({"tcp_congestion": congestion} if congestion else {})
    servers |= {} if initcwnd == "default" else {"initcwnd": initcwnd}  # None: the kernel's own
    servers |= {} if after_idle is None else {"tcp_slow_start_after_idle": after_idle}
    lab_file = tmp_path / "lab.yaml"
    lab_file.write_text(json.dumps({"name": "tcp-settings", "topology": {"kind": "bcube", "n": 2, "k": 1},
                                    "servers": servers}))
    lab = make_lab(str(lab_file))
    expected = congestion or "cubic"  # pinned by default, whatever the host's default is
    sysctl = ["sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle"]
    assert [lab.exec(n, sysctl).stdout.strip() for n in ("h00", "h11")] == ["1" if after_idle else "0"] * 2
    lab.set_link("h00", "l0s0", False)
    lab.set_link("h00", "l0s0", True)
    window = 100 if initcwnd == "default" else initcwnd
    routes = [line for line in lab.exec("h00", ["ip", "-4", "route", "show"]).stdout.splitlines() if "mgmt0" not in line]
    assert routes and all(f"initcwnd {window} initrwnd {window}" in line if window else "initcwnd" not in line
                          for line in routes), routes
    for target in ("h01", "h11"):  # a neighbour on a link's subnet, and one through a relaying server
        address = str(lab.topology.address_of(target))
        listener = lab.popen(target, ["iperf3", "-s", "-1"], stdout=-1, stderr=-1)
        client = None
        try:
            until(lambda: "LISTEN" in lab.exec(target, ["ss", "-ltn", "sport = :5201"]).stdout, "iperf3 listening")
            client = lab.popen("h00", ["iperf3", "-c", address, "-t", "20"], stdout=-1, stderr=-1)

            def both_open() -> str:  # iperf3's control connection and its test's, as ss shows them
                shown = lab.exec("h00", ["ss", "-tin", "dst", address]).stdout
                return shown if len(_ALGORITHM.findall(shown)) >= 2 else ""
            sockets = until(both_open, f"iperf3's connections to {target}")
        finally:
            for process in (client, listener):
                if process is not None:
                    process.kill()
                    process.wait(timeout=30)
        assert set(_ALGORITHM.findall(sockets)) == {expected}, sockets


_ALGORITHM = re.compile(r"^\s+(cubic|reno|bbr|dctcp|htcp|vegas)\b", re.M)


def test_cli_up_status_exec_down(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    testbed = [sys.executable, "-m", "orchestrator.cli"]
    run = lambda *args: subprocess.run(testbed + list(args), capture_output=True, text=True, env=env, timeout=120)
    up = run("up", "bcube,3,1", "--runtime", "netns", "--name", "cli-lab")
    try:
        assert up.returncode == 0, up.stderr
        status = json.loads(run("status", "cli-lab", "--json").stdout)
        assert len(status["nodes"]) == 15 and all(n["alive"] for n in status["nodes"])
        assert run("exec", "cli-lab", "h00", "--", "ping", "-c1", "-W1", "10.1.2.1").returncode == 0
        assert run("exec", "cli-lab", "h00", "--", "sh", "-c", "exit 7").returncode == 7
        listed = json.loads(run("ls", "--json").stdout)
        assert [l["name"] for l in listed if l["name"] == "cli-lab"] == ["cli-lab"]
        missing = run("status", "no-such-lab")
        assert missing.returncode == 1 and "no lab named 'no-such-lab'" in missing.stderr
    finally:
        down = run("down", "cli-lab")
    assert down.returncode == 0, down.stderr
    assert run("clean", "cli-lab").stdout.strip() == "nothing to clean"


def test_mininet_cli_pingall_on_a_live_lab(make_lab):
    lab = make_lab("bcube,3,1", **{"servers.runtime": "netns"})
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "cli", lab.name],
        input="pingall\nexit\n", capture_output=True, text=True, timeout=120,
    )
    assert "Results: 0% dropped (72/72 received)" in proc.stdout + proc.stderr
    # the Mininet nodes were attached, never created: the lab is unchanged
    assert unreachable_pairs(lab, sources=["h00"]) == []


def test_python_api_hands_out_mininet_nodes():
    spec = lab_from_argument("star,3", name="api-lab", **{"servers.runtime": "netns"})
    with Lab.up(spec) as lab:
        h0 = lab.net["h0"]
        assert "10.0.0.1/24" in h0.cmd("ip -br addr show dev h0-eth0")
        assert "1 received" in h0.cmd("ping -c1 -W1", lab.net["h2"].IP())
    assert not LabState("api-lab").exists()
    assert kernel.list_namespaces("testbed-api-lab-") == []
