"""Faults on live netns labs: each action and its undo, the network rerouting around dead
links, partitions by nftables inside the namespaces, the CLI (one-line errors, --for,
heal, Mininet's `link`), and a SIGKILLed injector cleaned up by `testbed clean` or `heal`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.emulation import Lab, kernel
from orchestrator.emulation.journal import LabState
from orchestrator.errors import FaultError, MissingFeature
from orchestrator.emulation import features
from orchestrator.faults import Injector
from tests.netns.probes import unreachable_pairs

NETNS = {"servers.runtime": "netns"}
TESTBED = [sys.executable, "-m", "orchestrator.cli"]


def run_testbed(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(TESTBED + list(args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def routing_tables(lab: Lab) -> dict[str, str]:
    return {node: lab.exec(node, "ip route show table main").stdout for node in lab.topology.nodes
            if lab.topology.nodes[node].data_nics()}


def live_addresses(lab: Lab, dead_nodes_ifaces: set[tuple[str, str]] = frozenset()) -> dict[str, str]:
    """server → an address on a NIC whose link is alive."""
    found = {}
    for server in lab.topology.servers:
        for nic in server.data_nics():
            if (server.name, nic.name) not in dead_nodes_ifaces:
                found[server.name] = str(nic.address.ip)
                break
    return found


def unreachable(lab: Lab, targets: dict[str, str], sources: list[str] | None = None) -> set[tuple[str, str]]:
    """(src, dst) server pairs whose ping to `targets[dst]` fails (fping, all at once)."""
    sources = sources or [s.name for s in lab.topology.servers]
    by_address = {address: name for name, address in targets.items()}
    procs = {src: lab.popen(src, ["fping", "-a", "-r", "2", "-t", "300", "-i", "1",
                                  *(a for d, a in targets.items() if d != src)], stdout=-1, stderr=-1, text=True)
             for src in sources}
    failed = set()
    for src, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        alive = {by_address[line.strip()] for line in out.splitlines() if line.strip() in by_address}
        failed |= {(src, d) for d in targets if d != src and d not in alive}
    return failed


def ecmp_devices(lab: Lab, node: str, prefix: str) -> set[str]:
    text = lab.exec(node, f"ip route show {prefix}").stdout
    return {word for line in text.splitlines() for i, word in enumerate(line.split()) if i and line.split()[i - 1] == "dev"}


# -- links and rerouting --------------------------------------------------------------------
def test_fattree_reroutes_around_dead_core_and_edge_links_and_heal_restores_every_table(make_lab):
    lab = make_lab("fattree,4", name="ftreroute", **NETNS)
    injector = Injector(lab)
    tables = routing_tables(lab)
    assert ecmp_devices(lab, "p0a0", "10.0.0.0/8") == {"p0a0-eth2", "p0a0-eth3"}
    core = injector.inject("link-down", "p0a0-c0")
    (link,) = lab.links_between("p0a0", "c0")
    agg_if = link.a.interface if link.a.node == "p0a0" else link.b.interface
    # the dead next hop left p0a0's ECMP group, and remote aggregation switches no longer
    # send pod 0's traffic towards c0
    assert agg_if not in ecmp_devices(lab, "p0a0", "10.0.0.0/8")
    c0_if = next(e.interface for l in lab.links_between("p1a0", "c0") for e in (l.a, l.b) if e.node == "p1a0")
    assert c0_if not in ecmp_devices(lab, "p1a0", "10.0.0.2")
    assert unreachable_pairs(lab) == []
    injector.inject("link-down", "p0e0-p0a1")  # two dead links, one of them under the hosts
    assert unreachable_pairs(lab) == []
    injector.undo(core.fault.id)
    assert agg_if in ecmp_devices(lab, "p0a0", "10.0.0.0/8")  # back in the group
    assert unreachable_pairs(lab) == []
    injector.heal()
    assert routing_tables(lab) == tables
    assert unreachable_pairs(lab) == []
    events = lab.state.fault_events()
    assert [e["action"] for e in events] == ["link-down", "link-down"]
    assert all(e["planned"] <= e["applied"] <= e["undone"] for e in events)


def test_switch_down_on_fattree_keeps_every_pair_connected_then_comes_back(make_lab):
    lab = make_lab("fattree,4", name="ftswitch", **NETNS)
    injector = Injector(lab)
    tables = routing_tables(lab)
    injector.inject("switch-down", "c0")
    with kernel.Netlink() as nl:
        states = kernel.links_in(nl, lab.namespace("c0"))
    assert not any(info["up"] for name, info in states.items() if name.startswith("c0-"))
    assert unreachable_pairs(lab) == []
    injector.heal()
    assert routing_tables(lab) == tables


def test_bcube_server_link_down_detours_over_parallel_paths_and_link_up_restores(make_lab):
    lab = make_lab("bcube,4,1", name="ftbcube", **NETNS)
    injector = Injector(lab)
    tables = routing_tables(lab)
    injector.inject("link-down", "h00-l0s0")
    targets = live_addresses(lab, {("h00", "h00-eth0")})
    assert targets["h00"] == str(lab.topology.nodes["h00"].interfaces["h00-eth1"].address.ip)
    assert unreachable(lab, targets) == set()
    done = injector.inject("link-up", "h00-l0s0")  # undoes the link-down on it
    assert not done.fault.target.links[0] in injector.held()
    assert injector.active() == []
    assert routing_tables(lab) == tables
    assert unreachable_pairs(lab) == []


def test_link_flap_ends_up_and_records_one_event(make_lab):
    lab = make_lab("bcube,2,1", name="ftflap", **NETNS)
    injector = Injector(lab)
    tables = routing_tables(lab)
    started = time.monotonic()
    injector.inject("link-flap", "h00-l0s0", {"period": "200ms", "count": "2"})
    assert time.monotonic() - started >= 0.3
    assert routing_tables(lab) == tables
    (event,) = lab.state.fault_events()
    assert event["action"] == "link-flap" and event["undone"] is not None


def test_a_heal_during_a_flap_acts_at_once_and_stops_the_flap(make_lab):
    lab = make_lab("bcube,2,1", name="ftflap2", **NETNS)
    injector = Injector(lab)
    tables = routing_tables(lab)
    flapping = injector.inject("link-flap", "h00-l0s0", {"period": "2s", "count": "5"}, wait=False)
    time.sleep(0.3)
    assert not lab.link_up("h00", "l0s0")  # in its first down half
    started = time.monotonic()
    assert [f.id for f in Injector(lab).heal()] == [flapping.fault.id]
    assert time.monotonic() - started < 1.0, "heal waited for the flap (its lock was held)"
    flapping.steps.join(3)
    assert not flapping.steps.is_alive(), "the flap went on after the heal"
    assert routing_tables(lab) == tables and injector.active() == []


def test_link_degrade_changes_both_ends_rate_and_undo_restores_it(make_lab):
    lab = make_lab("bcube,2,1", name="ftdegrade", **NETNS, **{"links.bandwidth": "100Mbit"})
    injector = Injector(lab)
    (link,) = lab.links_between("h00", "l0s0")

    def rates() -> set[int]:
        with kernel.Netlink() as nl:
            return {kernel.read_rate(nl, lab.namespace(e.node), e.interface) for e in (link.a, link.b)}

    done = injector.inject("link-degrade", "h00-l0s0", {"rate": "10Mbit"})
    assert rates() == {10_000_000}
    injector.undo(done.fault.id)
    assert rates() == {100_000_000}
    if not features.kernel_features()["netem"]:
        with pytest.raises(MissingFeature, match="sch_netem"):
            injector.inject("link-degrade", "h00-l0s0", {"delay": "5ms"})
        assert len(lab.state.fault_events()) == 1  # the refused one left nothing


# -- servers -------------------------------------------------------------------------------
def process_state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_server_pause_freezes_its_processes_and_undo_thaws_them(make_lab):
    lab = make_lab("bcube,2,1", name="ftpause", **NETNS)
    sleeper = lab.popen("h01", ["sleep", "300"])
    try:
        time.sleep(0.2)
        injector = Injector(lab)
        done = injector.inject("server-pause", "h01")
        assert process_state(sleeper.pid) == "T"
        assert any(p["pid"] == sleeper.pid for p in done.fault.saved["processes"])
        injector.undo(done.fault.id)
        assert process_state(sleeper.pid) in "SR"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_server_crash_kills_and_cuts_the_server_and_restart_brings_its_links_back(make_lab):
    lab = make_lab("bcube,2,1", name="ftcrash", **NETNS)
    sleeper = lab.popen("h01", ["sleep", "300"])
    time.sleep(0.2)
    injector = Injector(lab)
    tables = routing_tables(lab)
    injector.inject("server-crash", "h01")
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    others = {k: v for k, v in live_addresses(lab).items() if k != "h01"}
    assert unreachable(lab, others, sources=list(others)) == set()  # h01 relays nothing, nobody needs it
    assert unreachable(lab, live_addresses(lab), sources=["h00"]) == {("h00", "h01")}
    injector.inject("server-restart", "h01")
    assert injector.active() == []
    assert routing_tables(lab) == tables
    assert unreachable_pairs(lab) == []


# -- partitions ----------------------------------------------------------------------------
def udp_arrives(lab: Lab, src: str, dst: str) -> bool:
    """Whether a UDP datagram from src reaches dst's data address."""
    address = str(lab.topology.address_of(dst))
    listener = lab.popen(dst, [sys.executable, "-c",
                               "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                               f"s.bind(('{address}',9999));s.settimeout(1.5);"
                               "print(s.recvfrom(100)[0].decode())"], stdout=-1, stderr=-1, text=True)
    time.sleep(0.3)
    lab.exec(src, [sys.executable, "-c", "import socket;"
                   f"socket.socket(socket.AF_INET,socket.SOCK_DGRAM).sendto(b'hi',('{address}',9999))"])
    out, _ = listener.communicate(timeout=10)
    return out.strip() == "hi"


def test_partition_reachability_matrix_before_during_and_after(make_lab):
    lab = make_lab("bcube,2,1", name="ftpart", **NETNS)
    injector = Injector(lab)
    servers = [s.name for s in lab.topology.servers]
    targets = live_addresses(lab)
    assert unreachable(lab, targets) == set()
    inside = {"h00", "h11"}
    done = injector.inject("partition", "h00,h11")
    expected = {(a, b) for a in servers for b in servers if a != b and (a in inside) != (b in inside)}
    assert unreachable(lab, targets) == expected
    # the rules live in the set's own namespaces, never the host's
    assert "testbed_fault_" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"testbed_fault_{done.fault.id}" in lab.exec("h00", "nft list tables").stdout
    injector.undo(done.fault.id)
    assert unreachable(lab, targets) == set()
    assert "testbed_fault_" not in lab.exec("h00", "nft list tables").stdout


def test_one_way_partition_drops_only_what_the_set_sends(make_lab):
    lab = make_lab("bcube,2,1", name="ftoneway", **NETNS)
    injector = Injector(lab)
    injector.inject("partition", "h00", {"direction": "out"})
    assert not udp_arrives(lab, "h00", "h10")
    assert udp_arrives(lab, "h10", "h00")
    injector.heal()
    assert udp_arrives(lab, "h00", "h10")


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["link-down", "h00-h99"], "has no node 'h99'"),
    (["link-down", "h00-h11"], "has no link between h00 and h11"),
    (["link-down", "h00"], "takes a link as NODE-NODE"),
    (["server-pause", "l0s0"], "acts on a server; l0s0 is a switch"),
    (["switch-down", "h00"], "acts on a switch; h00 is a server"),
    (["partition", "h00,l0s0"], "takes servers; l0s0 is a switch"),
    (["meltdown", "h00"], "no fault action 'meltdown'"),
    (["link-degrade", "h00-l0s0", "--rate", "fast"], "link-degrade --rate"),
    (["link-down", "h00-l0s0", "--rate", "1Mbit"], "does not take --rate"),
    (["partition", "h00", "--direction", "sideways"], "direction is one of"),
])
def test_bad_faults_are_one_line_errors_that_leave_nothing_behind(make_lab, args, message):
    lab = make_lab("bcube,2,1", name="fterrors", **NETNS)
    tables = routing_tables(lab)
    result = run_testbed("fault", lab.name, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert lab.state.fault_events() == []
    assert not [e for e in lab.state.journal() if e.kind == "fault"]
    assert routing_tables(lab) == tables


# -- CLI -------------------------------------------------------------------------------------
def test_cli_for_undoes_after_the_duration_and_list_shows_the_timeline(make_lab):
    lab = make_lab("bcube,2,1", name="ftfor", **NETNS)
    tables = routing_tables(lab)
    started = time.monotonic()
    result = run_testbed("fault", lab.name, "link-down", "h00-l0s0", "--for", "1s")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1.0
    assert "undone" in result.stdout
    assert routing_tables(lab) == tables
    (event,) = json.loads(run_testbed("fault", lab.name, "list", "--json").stdout)
    assert event["action"] == "link-down" and event["target"] == "h00-l0s0"
    assert 0.9 <= event["undone"] - event["applied"] <= 5


def test_cli_heal_undoes_every_active_fault(make_lab):
    lab = make_lab("bcube,2,1", name="ftheal", **NETNS)
    tables = routing_tables(lab)
    assert run_testbed("fault", lab.name, "link-down", "h00-l0s0").returncode == 0
    assert run_testbed("fault", lab.name, "partition", "h01").returncode == 0
    assert len(lab.state.active_faults()) == 2
    healed = run_testbed("fault", lab.name, "heal")
    assert healed.returncode == 0 and "undid 2 faults" in healed.stdout
    assert lab.state.active_faults() == []
    assert routing_tables(lab) == tables
    assert unreachable_pairs(lab) == []


def test_mininet_link_down_then_up_keeps_bcube_pingall_whole(make_lab):
    lab = make_lab("bcube,2,1", name="ftmnlink", **NETNS)
    proc = subprocess.run(TESTBED + ["cli", lab.name], input="link h00 l0s0 down\nlink h00 l0s0 up\npingall\nexit\n",
                          capture_output=True, text=True, timeout=120)
    assert "Results: 0% dropped (12/12 received)" in proc.stdout + proc.stderr
    assert [e["action"] for e in lab.state.fault_events()] == ["link-down", "link-up"]
    assert lab.state.active_faults() == []


# -- crashes ---------------------------------------------------------------------------------
def start_held_fault(lab: Lab, *args: str) -> subprocess.Popen:
    """`testbed fault … --for 60s` in the background, returned once its fault is applied."""
    proc = subprocess.Popen(TESTBED + ["fault", lab.name, *args, "--for", "60s"], stdout=-1, stderr=-1, text=True)
    deadline = time.monotonic() + 30
    while not any(e["applied"] for e in lab.state.fault_events() if e["action"] == args[0]):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_sigkilled_injector_then_heal_restores_links_rules_and_frozen_processes(make_lab):
    lab = make_lab("bcube,2,1", name="ftkillheal", **NETNS)
    tables = routing_tables(lab)
    sleeper = lab.popen("h01", ["sleep", "300"])
    try:
        time.sleep(0.2)
        holders = [start_held_fault(lab, "link-down", "h00-l0s0"), start_held_fault(lab, "partition", "h10"),
                   start_held_fault(lab, "server-pause", "h01")]
        for proc in holders:
            proc.kill()
            proc.wait()
        assert process_state(sleeper.pid) == "T" and len(lab.state.active_faults()) == 3
        assert run_testbed("fault", lab.name, "heal").returncode == 0
        assert process_state(sleeper.pid) in "SR"
        assert routing_tables(lab) == tables
        assert "testbed_fault_" not in lab.exec("h10", "nft list tables").stdout
        assert unreachable_pairs(lab) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_sigkilled_injector_then_clean_removes_the_lab_and_its_frozen_processes(make_lab):
    lab = make_lab("bcube,2,1", name="ftkillclean", **NETNS)
    sleeper = lab.popen("h01", ["sleep", "300"])
    time.sleep(0.2)
    holders = [start_held_fault(lab, "link-down", "h00-l0s0"), start_held_fault(lab, "partition", "h10"),
               start_held_fault(lab, "server-pause", "h01")]
    for proc in holders:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert process_state(sleeper.pid) == "T"
    assert run_testbed("clean", lab.name).returncode == 0
    assert sleeper.wait(timeout=5) == -signal.SIGKILL  # not left frozen
    assert not LabState(lab.name).exists()
    assert kernel.list_namespaces(f"testbed-{lab.name}-") == []
