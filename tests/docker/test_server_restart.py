"""A crashed Docker server (`docker kill`) comes back: `server-restart`, or healing the
crash, starts its container again, and Docker gives a started container a fresh network
namespace, so the lab moves the server's interfaces into it and puts back addresses,
shaping, routes and the management side. Checked on bcube,2,1, whose servers relay: every
pair reaches every other again, the NICs are shaped at the lab's rate, the host reaches the
server over management, agents deploy on it, and the exporter follows the new namespace."""

from __future__ import annotations

import os
import subprocess
import time

from orchestrator.deploy import deploy, undeploy
from orchestrator.emulation import docker_engine, kernel
from orchestrator.faults import Injector
from orchestrator.monitoring.exporter import FabricCollector
from tests.netns.probes import unreachable_pairs

VICTIM = "h01"


def _link_up(collector: FabricCollector, node: str) -> list[float]:
    families = dict((family.name, samples) for family, samples in collector.link_families())
    return [value for labels, value in families["testbed_link_up"] if node in labels[1:3]]


def _transmitted(collector: FabricCollector, node: str) -> int:
    families = dict((family.name, samples) for family, samples in collector.link_families())
    return sum(int(value) for labels, value in families["testbed_link_transmit_bytes"] if labels[1] == node)


def _restored(lab, old_pid: int) -> None:
    container = lab.plan.container_name(VICTIM)
    pid = docker_engine.container_pid(container)
    assert pid is not None and pid != old_pid, "the container did not start again"
    # every pair within seconds (one lost ARP request is retried after a second)
    deadline = time.monotonic() + 5
    while (pairs := unreachable_pairs(lab)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pairs == []
    space = lab.plan.namespaces[VICTIM]
    with kernel.Netlink() as nl:
        for nic in lab.topology.nodes[VICTIM].data_nics():
            assert kernel.read_rate(nl, space, nic.name) == lab.spec.links.bandwidth, nic.name
    # the name holds the container's namespace now, not the old one
    assert kernel.netns_path(space).stat().st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    ping = subprocess.run(["ping", "-c", "1", "-W", "2", str(lab.mgmt_address(VICTIM))], capture_output=True)
    assert ping.returncode == 0, "the host does not reach the restarted server over management"


def test_a_killed_container_restarts_on_its_own_network(make_lab):
    lab = make_lab("bcube,2,1", name="rst", **{"servers.runtime": "docker"})
    container = lab.plan.container_name(VICTIM)
    collector = FabricCollector(lab)
    try:
        assert all(_link_up(collector, VICTIM))
        injector = Injector(lab)
        old_pid = docker_engine.container_pid(container)
        injector.inject("server-crash", VICTIM)
        assert docker_engine.container_pid(container) is None, "docker kill left the container running"
        assert not any(_link_up(collector, VICTIM))
        others = [s.name for s in lab.topology.servers if s.name != VICTIM]
        assert sorted(unreachable_pairs(lab, others)) == sorted((s, VICTIM) for s in others)

        injector.inject("server-restart", VICTIM)
        assert injector.active() == []
        _restored(lab, old_pid)
        assert all(_link_up(collector, VICTIM)), "the exporter still reads the old namespace"
        before = _transmitted(collector, VICTIM)
        unreachable_pairs(lab, [VICTIM])
        assert _transmitted(collector, VICTIM) > before

        # agents deploy on it and answer
        endpoints = deploy(lab, [VICTIM]).endpoints
        assert [e.node for e in endpoints] == [VICTIM]
        undeploy(lab, [VICTIM])

        # healing a crash starts the container too
        old_pid = docker_engine.container_pid(container)
        injector.inject("server-crash", VICTIM)
        assert [f.action for f in injector.heal()] == ["server-crash"]
        _restored(lab, old_pid)
    finally:
        collector.close()
