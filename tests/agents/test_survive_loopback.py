"""Surviving failures on loopback agents: an agent killed mid-run (SIGKILL) under ps, ring,
tree and halving-doubling; the run finishes over the survivors, its history shows the
membership change, and the checker finds nothing lost or counted twice."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from orchestrator.control import checker, driver, workloads
from orchestrator.control.local import local_agents

STALL = 4.0
ITERATIONS = 14
TENSORS = [200_000]


def agent_pid(endpoint) -> int:
    found = subprocess.run(["pgrep", "-f", "--", f"--control {endpoint.control}"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def until_iteration(endpoints, iteration: int, outcome: dict) -> None:
    with driver.control_stubs(endpoints) as stubs:
        deadline = time.monotonic() + 60
        while True:
            assert "ended" not in outcome, outcome
            states = [stubs[e.control].Status(driver.pb.Empty(), timeout=5) for e in endpoints]
            if all(s.state == "running" and s.iteration >= iteration for s in states):
                return
            assert time.monotonic() < deadline, states
            time.sleep(0.05)


def run_and_kill(eps, algorithm: str, victim, specs, **kwargs) -> driver.RunResult:
    outcome: dict = {}

    def go() -> None:
        try:
            outcome["result"] = driver.run(eps, algorithm, TENSORS, specs, iterations=ITERATIONS, timeout=240,
                                           stall_timeout=STALL, survive=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc
        outcome["ended"] = True

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    until_iteration(eps, 3, outcome)
    os.kill(agent_pid(victim), signal.SIGKILL)
    thread.join(180)
    assert "result" in outcome, outcome
    return outcome["result"]


def assert_survived(result: driver.RunResult, victim: str, emulated: bool = True) -> checker.Report:
    assert [e.first for e in result.history][0] == 0 and len(result.history) == 2, result.history
    before, after = result.history
    assert victim in before.nodes and victim not in after.nodes and "lost" in after.reason
    assert len(after.members) == len(before.members) - (1 if victim in result.identities else 0)
    by_node = {r.node: [rec.iteration for rec in r.records] for r in result.results}
    survivors = [n for n in by_node if n != victim and n in result.identities]
    for node in survivors:  # every survivor ends the run; laggards adopt, they do not redo
        assert by_node[node][-1] == ITERATIONS - 1, by_node
    assert sorted({i for n in survivors for i in by_node[n]}) == list(range(ITERATIONS)), by_node
    report = checker.check_run(result, emulated=emulated)
    print(result.history, report)
    assert report.clean, report
    assert not report.lost and not report.duplicated and report.iterations == ITERATIONS
    assert report.membership[-1][1] == after.members
    return report


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving-doubling"])
def test_an_allreduce_re_forms_over_the_survivors_of_a_killed_worker(algorithm):
    spec = workloads.emulated(TENSORS, compute_seconds=0.15)
    with local_agents(4) as eps:
        result = run_and_kill(eps, algorithm, eps[2], spec)
    report = assert_survived(result, "local2")
    assert not report.unverified or all(identity == 2 for _, identity in report.unverified)


def test_ps_carries_on_with_the_surviving_workers_and_servers():
    spec = workloads.emulated(TENSORS, compute_seconds=0.15)
    with local_agents(4, servers=2) as eps:
        result = run_and_kill(eps, "ps", eps[1], spec)
        assert_survived(result, "local1")
    with local_agents(3, servers=2) as eps:  # a parameter server dies: its shard moves to the other
        result = run_and_kill(eps, "ps", eps[4], spec)
        assert_survived(result, "local4")


def test_the_digits_model_keeps_one_set_of_parameters_across_a_re_formed_ring():
    tensors = workloads.digits(4, 0)["tensors"]
    specs = [workloads.digits(4, rank) | {"compute_seconds": 0.15} for rank in range(4)]
    with local_agents(4) as eps:
        outcome: dict = {}

        def go() -> None:
            try:
                outcome["result"] = driver.run(eps, "ring", tensors, specs, iterations=ITERATIONS, timeout=240,
                                               stall_timeout=STALL, survive=True)
            except Exception as exc:  # noqa: BLE001
                outcome["error"] = exc
            outcome["ended"] = True

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        until_iteration(eps, 3, outcome)
        os.kill(agent_pid(eps[3]), signal.SIGKILL)
        thread.join(180)
    assert "result" in outcome, outcome
    result = outcome["result"]
    report = assert_survived(result, "local3", emulated=False)
    digests = {(rec.iteration, r.node): rec.param_digest for r in result.results for rec in r.records}
    last = {d for (i, _), d in digests.items() if i == ITERATIONS - 1}
    assert len(last) == 1 and "" not in last  # the survivors end with the same parameters
    assert len(report.unverified) <= 1  # at most the dead worker's gradient of the iteration it died in
