"""A real Prometheus run by the orchestrator for a live lab (star,2 in bare namespaces): its
targets come from file_sd with the lab's and node's labels, it sees the agents' byte
counters rise during a run, a killed agent's target goes down and comes back when the
agent is deployed again, the fabric exporter's link counters and states follow the traffic
and a cut link, and `testbed clean` stops them all after a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from orchestrator.deploy import undeploy
from orchestrator.emulation import cleanup
from orchestrator.monitoring import monitor_down, monitor_status, monitor_up
from orchestrator.deploy import lab_agents
from orchestrator.control import driver, workloads
from tests.netns.probes import command_lines

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus is not installed (./setup.sh installs it)")


DATAGRAMS = """
import socket, sys, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
while True:
    try:
        udp.sendto(bytes(200), (sys.argv[1], 9))
    except OSError:
        pass
    time.sleep(0.02)
"""


def until(check, timeout: float = 20.0, every: float = 0.25):
    """The first truthy value of check() within `timeout` seconds, else the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def health(monitor) -> dict[str, str]:
    """Agents by node, the fabric exporter as "fabric"."""
    return {t["labels"].get("node", t["labels"]["job"]): t["health"] for t in monitor.active_targets()}


def values(monitor, expression: str) -> dict[str, float]:
    """An instant query's result by its `link` label (or its only series under "")."""
    return {r["metric"].get("link", ""): float(r["value"][1]) for r in monitor.query(expression)}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_prometheus_scrapes_the_labs_agents_with_their_labels(make_lab):
    lab = make_lab("star,2", name="mon", **{"servers.runtime": "netns"})
    endpoints = lab_agents.start(lab, via="exec")
    monitor = monitor_up(lab)
    try:
        assert monitor.url.startswith("http://127.0.0.1:")
        assert until(lambda: health(monitor) == {"h0": "up", "h1": "up", "fabric": "up"}), health(monitor)
        labels = {t["labels"]["node"]: t["labels"] for t in monitor.active_targets() if "node" in t["labels"]}
        assert labels["h1"]["lab"] == "mon" and labels["h1"]["switch"] == "sw" and labels["h1"]["index"] == "1"
        assert labels["h0"]["role"] == "worker"
        check = subprocess.run(["promtool", "check", "config", str(monitor.config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        assert monitor_up(lab).pid == monitor.pid  # a second `up` keeps the running one
        assert monitor_status(lab).url == monitor.url

        elements = 1_000_000
        result = driver.run(endpoints, "ring", [elements], workloads.back_to_back([elements]), iterations=2)
        sent = lambda: values(monitor, 'sum(testbed_bytes_sent_total{lab="mon"})').get("")  # noqa: E731
        # the counters agree to the byte with the agents' per-iteration records
        recorded = sum(record["bytes_sent"] for record in result.records())
        assert recorded >= 2 * 2 * elements * 4 / 2  # 2 ranks, half the gradient, reduce-scatter + allgather
        assert until(lambda: sent() == recorded), (sent(), recorded)
        # what each agent's own process uses, and its sends by NIC (star's servers have one: routed)
        assert values(monitor, 'count(process_resident_memory_bytes{job="agents",lab="mon"} > 0)')[""] == 2
        assert values(monitor, 'count(testbed_bytes_sent_total{lab="mon",nic="routed"})')[""] == 2
        # the exporter's view of the servers and of the host
        memory = {r["metric"]["node"]: float(r["value"][1])
                  for r in monitor.query('testbed_server_memory_bytes{lab="mon"}')}
        assert set(memory) == {"h0", "h1"} and min(memory.values()) > 10e6, memory  # an agent each
        assert until(lambda: values(monitor, 'sum(rate(testbed_server_cpu_seconds_total{lab="mon"}[5s]))').get("", 0) > 0)
        busy = values(monitor, 'testbed_host_cpu_seconds_total{lab="mon",mode="busy"}')
        assert busy and values(monitor, 'testbed_host_cpus{lab="mon"}')[""] == os.cpu_count()
        # the fabric saw those bytes on every direction of the ring's links: h0→sw→h1 and back
        wire = lambda: values(monitor, 'testbed_link_transmit_bytes_total{lab="mon"}')  # noqa: E731
        assert until(lambda: len(wire()) == 4 and min(wire().values()) >= 2 * elements * 4 / 2), wire()
        assert values(monitor, 'testbed_link_rate_bytes_per_second{link="h0→sw"}')["h0→sw"] == lab.spec.links.bandwidth / 8
        # the recording rules run: link utilisation for every direction, busbw for the lab
        assert until(lambda: len(values(monitor, 'testbed:link_utilisation:ratio5s{lab="mon"}')) == 4)
        assert values(monitor, 'max(testbed_gradient_bytes{lab="mon"})')[""] == elements * 4

        # a cut link shows in the link state series within 2 scrapes (1 s each), and heals
        state = lambda: values(monitor, 'testbed_link_up{lab="mon"}')  # noqa: E731
        assert until(lambda: state() == {"h0→sw": 1, "sw→h0": 1, "h1→sw": 1, "sw→h1": 1}), state()
        # and in the bytes series: a datagram stream from h0 (50 a second, sent whatever
        # happens: ping backs off after errors) stops at the cut and resumes after
        ping = lab.popen("h0", [sys.executable, "-c", DATAGRAMS, str(lab.topology.address_of("h1"))],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rising = lambda: values(monitor, 'rate(testbed_link_transmit_bytes_total{link="h0→sw"}[3s])')  # noqa: E731
            assert until(lambda: rising().get("h0→sw", 0) > 0), rising()
            lab.set_link("h0", "sw", up=False)
            assert until(lambda: state().get("h0→sw") == 0 and state().get("sw→h0") == 0, timeout=2.5), state()
            assert state()["h1→sw"] == 1
            assert until(lambda: rising().get("h0→sw") == 0, timeout=6), rising()
            lab.set_link("h0", "sw", up=True)
            assert until(lambda: state().get("h0→sw") == 1, timeout=3), state()
            assert until(lambda: rising().get("h0→sw", 0) > 0, timeout=6), rising()
        finally:
            ping.kill()
            ping.wait()

        lab_agents.stop(endpoints[:1])  # unsupervised (exec): h0's agent is gone
        assert until(lambda: health(monitor)["h0"] == "down", timeout=10), health(monitor)
        lab_agents.start(lab, ["h0"], via="exec")
        assert until(lambda: health(monitor)["h0"] == "up", timeout=10), health(monitor)
        # an undeployed agent is no target any more (the exporter rewrote file_sd)
        undeploy(lab, ["h1"], via="exec")
        assert until(lambda: "h1" not in health(monitor), timeout=10), health(monitor)
    finally:
        lab_agents.stop(endpoints)
        stopped = monitor_down(lab)
    assert stopped and not alive(monitor.pid)
    assert not command_lines(f"orchestrator.monitoring.exporter {lab.name} ", live_only=True)
    assert monitor_status(lab) is None and not monitor_down(lab)


def test_clean_stops_the_prometheus_of_a_crashed_run(make_lab):
    lab = make_lab("star,2", name="moncrash", **{"servers.runtime": "netns"})
    monitor = monitor_up(lab)
    assert alive(monitor.pid)
    cleanup.clean_lab(lab.name)  # as after the orchestrator died: only the journal is left
    assert until(lambda: not alive(monitor.pid), timeout=5)
    assert until(lambda: not command_lines(f"orchestrator.monitoring.exporter {lab.name} ", live_only=True),
                 timeout=5)
    try:
        os.waitpid(monitor.pid, os.WNOHANG)  # reap it: this test started it
    except ChildProcessError:
        pass


def test_the_exporters_own_text_says_what_the_library_would(make_lab):
    """exporter.exposition() writes the text itself (the library's is 3× too slow on
    fattree,8): same families, series and values as prometheus_client's rendering of the
    same collector, and promtool-clean."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from orchestrator.monitoring.exporter import FabricCollector

    lab = make_lab("bcube,2,1", name="montext", **{"servers.runtime": "netns"})
    collector = FabricCollector(lab)
    read = collector.snapshot()
    collector.snapshot = lambda: read  # both render one reading of the kernel
    registry = CollectorRegistry()
    registry.register(collector)

    def samples(text: str) -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    ours, theirs = samples(collector.exposition().decode()), samples(generate_latest(registry).decode())
    assert ours == theirs
    assert len([key for key in ours if key[0] == "testbed_link_up"]) == 2 * len(lab.topology.links)
    assert len([key for key in ours if key[0] == "testbed_link_transmit_bytes_total"]) == 2 * len(lab.topology.links)
    check = subprocess.run(["promtool", "check", "metrics"], input=collector.exposition(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
