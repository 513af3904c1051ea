"""Surviving faults on live labs (bare namespaces, agents forked in): a server crashed
mid-run under ring and under ps with a server of its own (star,4): the run finishes over the
survivors; restarted and redeployed, the server rejoins at an iteration boundary with the
current parameters. The history checker finds nothing lost or counted twice in every run.

Here too: Job, agents() and clean(), which test_survive_each_fault.py (every fault kind, ring
and bml on bcube,4,1 and fattree,4: crashes, pauses, partitions, cut links and switches) runs
its jobs with."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.collectives.context import Context
from orchestrator.cost import Network
from orchestrator.deploy import deploy
from orchestrator.emulation import cleanup
from orchestrator.faults import Injector
from orchestrator.deploy import lab_agents

from orchestrator.control import checker, driver, workloads

STALL = 5.0
TENSORS = [500_000]
# ~0.22 s each (0.2 s of compute): the crash at 3, ~5 s of stall, two iterations re-formed and
# a redeploy of ~1-3 s leave the rejoin near 20 and ~30 iterations to spare
ITERATIONS = 50


def make_lab(argument: str, name: str):
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    return Lab.up(lab_from_argument(argument, name=name, **{"servers.runtime": "netns"}))


@pytest.fixture(scope="module")
def star():
    lab = make_lab("star,4", "sv-star")
    try:
        yield lab
    finally:
        Injector(lab).heal()
        cleanup.clean_lab(lab.name)


def agents(lab, roles: dict[str, str] | None = None) -> list[driver.Endpoint]:
    """Fresh agents on every server (after a crash, the crashed one's too)."""
    Injector(lab).heal()
    return deploy(lab, roles=roles, via="exec").endpoints


class Job:
    """A surviving run in a thread, with a rejoin hook the test feeds."""

    def __init__(self, lab, eps, algorithm: str, options: dict | None = None, workload=None) -> None:
        self.lab, self.eps, self.outcome, self.back = lab, eps, {}, []
        workers = [e for e in eps if e.role == "worker"]
        self.ctx = Context(len(workers), lab.topology, tuple(e.node for e in eps), options or {})
        self.workload = workload or workloads.emulated(TENSORS, compute_seconds=0.2)
        self.algorithm = algorithm
        self.thread = threading.Thread(target=self._go, daemon=True)
        self.thread.start()

    def _go(self) -> None:
        try:
            self.outcome["result"] = driver.run(
                self.eps, self.algorithm, TENSORS, self.workload, iterations=ITERATIONS, ctx=self.ctx,
                network=Network.from_links(self.lab.spec.links), timeout=400, stall_timeout=STALL,
                link_state=self.lab.link_up, survive=True, rejoin=lambda dead: [e for e in self.back if e.node in dead])
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            self.outcome["error"] = exc

    def until_iteration(self, iteration: int, eps=None) -> None:
        with driver.control_stubs(eps or self.eps) as stubs:
            deadline = time.monotonic() + 90
            while True:
                assert self.thread.is_alive(), self.outcome
                states = [stubs[e.control].Status(driver.pb.Empty(), timeout=5) for e in eps or self.eps]
                if all(s.state == "running" and s.iteration >= iteration for s in states):
                    return
                assert time.monotonic() < deadline, states
                time.sleep(0.1)

    def result(self) -> driver.RunResult:
        self.thread.join(400)
        assert "result" in self.outcome, self.outcome
        return self.outcome["result"]


def iteration_of(eps) -> int:
    """The iteration the slowest of these agents is at."""
    with driver.control_stubs(eps) as stubs:
        return min(stubs[e.control].Status(driver.pb.Empty(), timeout=5).iteration for e in eps)


def clean(result: driver.RunResult) -> checker.Report:
    report = checker.check_run(result)
    print(result.history, report)
    assert report.clean and not report.lost and not report.duplicated and not report.unverified, report
    assert report.iterations == ITERATIONS
    return report


# ring and bml on bcube: test_survive_each_fault.py, on bcube,4,1
CRASHES = [("ring", {}, None), ("ps", {"shards": 1}, {"h3": "ps"})]


@pytest.mark.parametrize("algorithm,options,roles", CRASHES, ids=[f"{a}-star" for a, _, _ in CRASHES])
def test_a_crashed_server_is_dropped_and_restarted_it_rejoins(star, algorithm, options, roles):
    victim, lab = "h2", star
    eps = agents(lab, roles)
    job = Job(lab, eps, algorithm, options)
    job.until_iteration(3)
    injector = Injector(lab)
    injector.inject("server-crash", victim)
    survivors = [e for e in eps if e.node != victim]
    # re-formed and under way without h2 (neither the old ring nor the old ps finishes an
    # iteration without it); then h2 comes back
    job.until_iteration(iteration_of(survivors) + 2, survivors)
    injector.inject("server-restart", victim)
    job.back = deploy(lab, [victim], roles=roles, via="exec").endpoints
    result = job.result()
    reasons = [e.reason for e in result.history]
    assert len(result.history) == 3 and f"{victim} lost" in reasons[1] and reasons[2] == f"{victim} rejoined", \
        result.history
    assert victim not in result.history[1].nodes and victim in result.history[2].nodes
    h2 = next(r for r in result.results if r.node == victim)
    rejoined_at = result.history[2].first
    assert [rec.iteration for rec in h2.records][-1] == ITERATIONS - 1
    assert all(rec.iteration < result.history[1].first or rec.iteration >= rejoined_at for rec in h2.records)
    report = clean(result)
    assert [m for _, m in report.membership] == [e.members for e in result.history]
