"""A real Prometheus run by the orchestrator for a live lab (star,2 in bare namespaces): its
targets come from file_sd with the lab's and node's labels, it sees the agents' byte
counters rise during a run, a killed agent's target goes down and comes back when the
agent is deployed again, the fabric exporter's link counters and states follow the traffic
and a cut link, and `testbed clean` stops them all after a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from orchestrator.emulation import cleanup
from orchestrator.monitoring import monitor_down, monitor_status, monitor_up
from orchestrator.runner import driver, lab_agents, workloads
from tests.netns.probes import command_lines

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus is not installed (./setup.sh installs it)")


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
        check = subprocess.run(["promtool", "check", "config", str(monitor.config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        assert monitor_up(lab).pid == monitor.pid  # a second `up` keeps the running one
        assert monitor_status(lab).url == monitor.url

        elements = 1_000_000
        driver.run(endpoints, "ring", [elements], workloads.back_to_back([elements]), iterations=2)
        sent = lambda: monitor.query('sum(testbed_bytes_sent_total{lab="mon"})')  # noqa: E731
        # each of 2 ranks sends half the gradient twice per allreduce (reduce-scatter + allgather)
        assert until(lambda: sent() and float(sent()[0]["value"][1]) >= 2 * 2 * elements * 4 / 2), sent()
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
        lab.set_link("h0", "sw", up=False)
        assert until(lambda: state().get("h0→sw") == 0 and state().get("sw→h0") == 0, timeout=2.5), state()
        assert state()["h1→sw"] == 1
        lab.set_link("h0", "sw", up=True)
        assert until(lambda: state().get("h0→sw") == 1, timeout=3), state()

        lab_agents.stop(endpoints[:1])  # unsupervised (exec): h0's agent is gone
        assert until(lambda: health(monitor)["h0"] == "down", timeout=10), health(monitor)
        lab_agents.start(lab, ["h0"], via="exec")
        assert until(lambda: health(monitor)["h0"] == "up", timeout=10), health(monitor)
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
