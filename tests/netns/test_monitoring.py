"""A real Prometheus run by the orchestrator for a live lab (star,2 in bare namespaces): its
targets come from file_sd with the lab's and node's labels, it sees the agents' byte
counters rise during a run, a killed agent's target goes down and comes back when the
agent is deployed again, and `testbed clean` stops it after a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from orchestrator.emulation import cleanup
from orchestrator.monitoring import monitor_down, monitor_status, monitor_up
from orchestrator.runner import driver, lab_agents, workloads

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
    return {t["labels"]["node"]: t["health"] for t in monitor.active_targets()}


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
        assert until(lambda: health(monitor) == {"h0": "up", "h1": "up"}), health(monitor)
        labels = {t["labels"]["node"]: t["labels"] for t in monitor.active_targets()}
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

        lab_agents.stop(endpoints[:1])  # unsupervised (exec): h0's agent is gone
        assert until(lambda: health(monitor)["h0"] == "down", timeout=10), health(monitor)
        lab_agents.start(lab, ["h0"], via="exec")
        assert until(lambda: health(monitor)["h0"] == "up", timeout=10), health(monitor)
    finally:
        lab_agents.stop(endpoints)
        stopped = monitor_down(lab)
    assert stopped and not alive(monitor.pid)
    assert monitor_status(lab) is None and not monitor_down(lab)


def test_clean_stops_the_prometheus_of_a_crashed_run(make_lab):
    lab = make_lab("star,2", name="moncrash", **{"servers.runtime": "netns"})
    monitor = monitor_up(lab)
    assert alive(monitor.pid)
    cleanup.clean_lab(lab.name)  # as after the orchestrator died: only the journal is left
    assert until(lambda: not alive(monitor.pid), timeout=5)
    try:
        os.waitpid(monitor.pid, os.WNOHANG)  # reap it: this test started it
    except ChildProcessError:
        pass
