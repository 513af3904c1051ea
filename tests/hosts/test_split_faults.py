"""Faults on a lab split over two hosts (issue 31): the same injector and timeline as on one
host, each host acting on its own nodes. A link between hosts is cut at both ends (one per
host) and the network routes around it on both; a server crashed on the other host stops
answering and comes back; at the end everything is up and no fault is active."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator.emulation import kernel
from orchestrator.faults.timeline import TimelineRunner, plan
from orchestrator.hosts import split
from orchestrator.hosts.fake import engine_on_fake_hosts
from orchestrator.spec import lab_from_argument
from orchestrator.spec.loader import validate
from orchestrator.spec.timeline import Timeline
from orchestrator.topology.partition import Host
from tests.conftest import until


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("faults")
    with engine_on_fake_hosts(directory, ["x", "y"], own_state=True) as (engine, hosts, _, _):
        spec = lab_from_argument("fattree,4", name="spflt", **{"servers.runtime": "netns", "links.bandwidth": "100Mbit"})
        built = split.up(spec, engine, [Host(h, mtu=9000) for h in hosts.names], hosts.underlay)
        try:
            yield built, hosts, directory
        finally:
            split.down(built)


def host_fault_log(directory, host: str, name: str, monkeypatch) -> list[dict]:
    """The faults a host's share journals (what its fabric exporter counts), read from its
    own state directory (engine_on_fake_hosts' `state-<host>`)."""
    from orchestrator.emulation.journal import LabState

    with monkeypatch.context() as patch:
        patch.setenv("TESTBED_STATE", str(directory / f"state-{host}"))
        return LabState(name).fault_events()


def up(hosts, lab, node: str, interface: str) -> bool:
    host = lab.placement.host_of[node]
    shown = subprocess.run(kernel.in_netns(hosts.node_namespace(host, lab.name, node)) + [
        "ip", "-j", "link", "show", "dev", interface], capture_output=True, text=True).stdout
    return "UP" in json.loads(shown)[0]["flags"]


def answers(hosts, lab, src: str, dsts: list[str]) -> dict[str, bool]:
    """Which of `dsts` answer a ping from `src` over the fabric."""
    namespace = hosts.node_namespace(lab.placement.host_of[src], lab.name, src)
    done = subprocess.run(kernel.in_netns(namespace) + ["fping", "-r", "1", "-t", "300", *(
        str(lab.topology.address_of(d)) for d in dsts)], capture_output=True, text=True)
    alive = {line.split()[0] for line in done.stdout.splitlines() if "is alive" in line}
    return {d: str(lab.topology.address_of(d)) in alive for d in dsts}


def test_a_fault_timeline_whose_links_cross_hosts(lab, monkeypatch):
    built, hosts, directory = lab
    topology, host_of = built.topology, built.placement.host_of
    link = next(link for link in built.placement.crossing(topology)
                if not topology.nodes[link.a.node].is_server and not topology.nodes[link.b.node].is_server)
    a, b = link.nodes()
    servers = [s.name for s in topology.servers]
    crashed = next(s for s in servers if host_of[s] == "y")
    src = next(s for s in servers if host_of[s] == "x")
    others = [s for s in servers if s not in (src, crashed)]
    assert all(answers(hosts, built, src, others + [crashed]).values())
    timeline = validate(Timeline, {"events": [
        {"action": "link-down", "target": f"{a}-{b}", "at": 0.0, "for": 6.0},
        {"action": "server-crash", "target": crashed, "at": 0.0, "for": 6.0}]}, "exp.yaml")
    with TimelineRunner(built, plan(timeline, topology)) as run:
        until(lambda: len(built.state.active_faults()) == 2, "both faults applied")
        # cut at both ends, each on its own host
        assert host_of[a] != host_of[b]
        assert not up(hosts, built, a, link.a.interface) and not up(hosts, built, b, link.b.interface)
        # the fabric routes around the cut link on both hosts; the crashed server is gone
        reached = answers(hosts, built, src, others + [crashed])
        assert reached == {**{s: True for s in others}, crashed: False}, reached
        assert built.link_up(a, b) is False
    assert [r.undone is not None for r in run.events()] == [True, True]
    assert built.state.active_faults() == []
    # the lab's first host journals them too, so its exporter gives the faults' gauges and
    # counts (once: the other host's has none)
    first, other = built.placement.hosts[0].name, built.placement.hosts[1].name
    mirrored = host_fault_log(directory, first, built.name, monkeypatch)
    assert [(f["action"], f["applied"] is not None, f["undone"] is not None) for f in mirrored] == \
        [(f["action"], True, True) for f in built.state.fault_events()]
    assert host_fault_log(directory, other, built.name, monkeypatch) == []
    until(lambda: up(hosts, built, a, link.a.interface) and up(hosts, built, b, link.b.interface),
               "the cut link back at both ends")
    assert built.link_up(a, b) is True
    until(lambda: all(answers(hosts, built, src, others + [crashed]).values()), "every server answering again")
