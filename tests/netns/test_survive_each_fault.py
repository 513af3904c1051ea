"""Each fault kind during a running surviving job (driver.run(survive=True), ring of 16
workers unless said), on bcube,4,1 (two NICs a server, servers relay) and fattree,4 (one NIC
a server, a multi-path fabric); the history checker is clean after every run.

- Fabric faults — link-down, link-flap, link-degrade, switch-down of a level-0 and of a
  level-1 BCube switch, link-down and a core switch down on the Fat-Tree: BCube has k+1 = 2 disjoint paths between
  any two servers and the Fat-Tree several, so the run goes on while the fault holds and
  nobody is dropped (at most a retry over fresh connections, which take the rerouted paths).
- server-crash, then server-restart and a redeploy (ring and BML on BCube, ring on the
  Fat-Tree): the crashed server is dropped, the run re-forms over the 15 survivors, and the
  restarted server rejoins at an iteration boundary with the current parameters.
- server-pause, then its undo: the frozen agent stops answering, so it is named ("has not
  answered") and dropped within seconds like a crashed one; thawed, the very same agent
  process (nothing redeployed) rejoins through the rejoin hook.
- partition of one server from all the others, both directions: its agent still answers on
  the management network, but no data moves to or from it; once fresh connections have not
  helped (the driver's retries), the survivors drop it as cut off; the partition undone, the
  same agent rejoins through the rejoin hook.

Two pure tests (no lab) pin the driver's evidence for "cut off": which paths a stall or a
failed send names, and that nobody is dropped on a guess.
"""

from __future__ import annotations

import time

import pytest

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.deploy import deploy
from orchestrator.deploy.agents import endpoints
from orchestrator.emulation import cleanup
from orchestrator.faults import Injector
from orchestrator.control import driver
from orchestrator.control.stalls import RankView, Stall, _dead_edges
from tests.netns import test_survive as survive
from tests.netns.test_survive import Job, agents, clean, iteration_of, make_lab

ITERATIONS = 30  # test_survive's star runs 50; here 16 agents share the 2 cores (~0.5 s an iteration)
FABRIC_ITERATIONS = 22
NAMED_WITHIN = 25.0  # seconds from a pause to the survivors two iterations on: stall, Results wait, re-form


@pytest.fixture(autouse=True)
def iterations(monkeypatch):
    """Job and clean() read test_survive.ITERATIONS: this file's runs are shorter."""
    monkeypatch.setattr(survive, "ITERATIONS", ITERATIONS)


def _lab(argument: str, name: str):
    lab = make_lab(argument, name)
    try:
        yield lab
    finally:
        Injector(lab).heal()
        cleanup.clean_lab(lab.name)


@pytest.fixture(scope="module")
def bcube():
    yield from _lab("bcube,4,1", "ek-bcube")


@pytest.fixture(scope="module")
def fattree():
    yield from _lab("fattree,4", "ek-fat")


def health(endpoint: driver.Endpoint):
    with driver.control_channel(endpoint) as channel:
        return driver.pb_grpc.ControlStub(channel).Health(pb.Empty(), timeout=5)


# -- fabric faults: nobody dropped ------------------------------------------------------------
FABRIC = [  # (lab, action, target, options)
    ("bcube", "link-down", "h12-l1s2", {}),
    ("bcube", "link-flap", "h21-l0s2", {"period": "1s", "count": "3"}),
    ("bcube", "link-degrade", "h30-l1s0", {"rate": "20Mbit"}),
    ("bcube", "switch-down", "l0s1", {}),  # h10..h13 lose their level-0 NIC
    ("bcube", "switch-down", "l1s3", {}),  # h03, h13, h23, h33 lose their level-1 NIC
    ("fattree", "link-down", "p2e1-p2a0", {}),
    ("fattree", "switch-down", "c1", {}),  # a core switch: every pod's flows through it go round
]


@pytest.mark.parametrize("labname,action,target,options", FABRIC, ids=[f"{f[0]}-{f[1]}-{f[2]}" for f in FABRIC])
def test_a_fabric_fault_mid_run_drops_nobody(request, monkeypatch, labname, action, target, options):
    # nobody leaves or comes back: the fault from iteration 3 and 4 iterations under it fit 22
    # with room to spare; a flap's 3 s are up to ~14 more iterations on a fast host: it keeps 30
    if action != "link-flap":
        monkeypatch.setattr(survive, "ITERATIONS", FABRIC_ITERATIONS)
    lab = request.getfixturevalue(labname)
    eps = agents(lab)
    job = Job(lab, eps, "ring")
    job.until_iteration(3)
    injector = Injector(lab)
    fault = injector.inject(action, target, options).fault  # a flap is over when this returns
    try:
        if action in ("link-down", "switch-down"):
            assert all(lab.link_up(link.a.node, link.b.node) is False for link in fault.target.links)
        # while a lasting fault holds, every agent goes on over the detours (or the slow link)
        job.until_iteration(iteration_of(eps) + 4)
        assert fault.id in {f.id for f in injector.active()} or action == "link-flap"
    finally:
        if fault.id in {f.id for f in injector.active()}:
            injector.undo(fault.id)
    result = job.result()
    everyone = tuple(range(len(eps)))
    assert all(e.members == everyone for e in result.history), result.history
    assert all(e.reason == "start" or e.reason.startswith("retried") for e in result.history), result.history
    clean(result)


# -- servers lost and back --------------------------------------------------------------------
def rejoined(result: driver.RunResult, victim: str, lost_because: str = "") -> None:
    """Three memberships: everyone, all but the victim, everyone again; the victim's records
    stop where it was lost and go on from where it rejoined to the end; the checker is clean."""
    reasons = [e.reason for e in result.history]
    assert len(result.history) == 3, result.history
    assert reasons[1].startswith(f"{victim} lost") and lost_because in reasons[1], reasons
    assert reasons[2] == f"{victim} rejoined", reasons
    everyone = result.history[0].members
    assert victim in result.history[0].nodes and victim not in result.history[1].nodes
    assert victim in result.history[2].nodes and result.history[2].members == everyone
    assert result.history[1].members == tuple(m for m in everyone if m != result.identities[victim])
    mine = next(r for r in result.results if r.node == victim)
    assert [rec.iteration for rec in mine.records][-1] == ITERATIONS - 1
    assert all(rec.iteration < result.history[1].first or rec.iteration >= result.history[2].first
               for rec in mine.records)
    report = clean(result)
    assert [m for _, m in report.membership] == [e.members for e in result.history]


CRASHES = [("bcube", "ring", "h21"), ("bcube", "bml", "h21"), ("fattree", "ring", "p1e0h1")]


@pytest.mark.parametrize("labname,algorithm,victim", CRASHES, ids=[f"{l}-{a}" for l, a, _ in CRASHES])
def test_a_crashed_server_is_dropped_and_restarted_it_rejoins(request, labname, algorithm, victim):
    lab = request.getfixturevalue(labname)
    eps = agents(lab)
    job = Job(lab, eps, algorithm)
    job.until_iteration(3)
    injector = Injector(lab)
    injector.inject("server-crash", victim)
    survivors = [e for e in eps if e.node != victim]
    # re-formed and under way without it (the old ring cannot finish an iteration without it)
    job.until_iteration(iteration_of(survivors) + 2, survivors)
    injector.inject("server-restart", victim)
    job.back = deploy(lab, [victim], via="exec").endpoints
    rejoined(job.result(), victim)


PAUSES = [("bcube", "h22"), ("fattree", "p2e1h0")]


@pytest.mark.parametrize("labname,victim", PAUSES, ids=[p[0] for p in PAUSES])
def test_a_paused_server_is_dropped_within_seconds_and_thawed_it_rejoins(request, labname, victim):
    lab = request.getfixturevalue(labname)
    eps = agents(lab)
    mine = next(e for e in eps if e.node == victim)
    pid = health(mine).pid
    job = Job(lab, eps, "ring")
    job.until_iteration(3)
    injector = Injector(lab)
    survivors = [e for e in eps if e.node != victim]
    paused = injector.inject("server-pause", victim).fault
    frozen_at = time.monotonic()
    try:
        job.until_iteration(iteration_of(survivors) + 2, survivors)
        assert time.monotonic() - frozen_at < NAMED_WITHIN
        assert job.thread.is_alive()  # still running over the survivors while it is frozen
    finally:
        injector.undo(paused.id)
    # thawed: the very same agent answers again, and the hook hands it back
    driver.wait_healthy([mine], timeout=30)
    assert health(mine).pid == pid
    job.back = endpoints(lab, [victim])
    rejoined(job.result(), victim, "has not answered")


# bcube only: the partition's mechanism is the lab's, whatever the kind, and each case takes
# ~85 s of CI (crash and pause run on both labs)
PARTITIONS = [("bcube", "h31")]


@pytest.mark.parametrize("labname,victim", PARTITIONS, ids=[p[0] for p in PARTITIONS])
def test_a_server_partitioned_off_is_dropped_and_healed_it_rejoins(request, monkeypatch, labname, victim):
    # one retry over fresh connections, not the driver's two: each costs a stall and the
    # agents' 10 s wait for a connection (~21 s of CI); one still shows that fresh
    # connections are tried before anybody is dropped as cut off
    monkeypatch.setattr(driver, "RETRIES", 1)
    lab = request.getfixturevalue(labname)
    eps = agents(lab)
    mine = next(e for e in eps if e.node == victim)
    pid = health(mine).pid
    job = Job(lab, eps, "ring")
    job.until_iteration(3)
    injector = Injector(lab)
    survivors = [e for e in eps if e.node != victim]
    cut = injector.inject("partition", victim, {"direction": "both"}).fault
    try:
        # the driver's retries over fresh connections fail, then it goes on without the victim
        job.until_iteration(iteration_of(survivors) + 2, survivors)
        assert health(mine).pid == pid  # its agent answered on the management network all along
    finally:
        injector.undo(cut.id)
    job.back = endpoints(lab, [victim])
    rejoined(job.result(), victim, "cut off (no data to or from it in 2 attempts in a row)")


# -- the driver's evidence of a cut-off server (pure: no lab needed) ------------------------
def _status(iteration: int, *pending: pb.Pending) -> pb.AgentStatus:
    return pb.AgentStatus(state="running", iteration=iteration, stalled_seconds=6.0, pending=pending)


def _receive(peer: int, step: int) -> pb.Pending:
    return pb.Pending(kind="receive", peer=peer, step=step, offset=0, end=100, done=0, ready=True)


def test_a_sender_still_in_the_last_iteration_is_not_a_dead_path():
    # a partition struck near the end of iteration 3: rank 1 finished it and waits in iteration
    # 4 for rank 0, still held up in iteration 3 by rank 2 (cut off): 0→1 is not dead, 2→0 is
    ranks = [_status(3, _receive(2, 14)), _status(4, _receive(0, 0)), _status(3)]
    views = [RankView(rank, f"h{rank}", status, 0.2, 6.2) for rank, status in enumerate(ranks)]
    assert _dead_edges(views, set()) == [(2, 0, 14)]
    assert Stall.cut(views) == {frozenset(("h0", "h2"))}


def test_a_server_is_dropped_as_cut_off_only_when_every_failed_attempt_names_it_alone():
    survivor = object.__new__(driver._Survivor)  # only its retries' evidence matters here
    live = [driver.Endpoint(rank, f"h{rank}", "", "") for rank in range(4)]
    pair = frozenset(("h1", "h2"))
    survivor.cuts = [frozenset({pair, frozenset(("h2", "h3"))}), frozenset({pair}), frozenset({pair})]
    assert survivor._cut_off(live) == {"h2"}
    survivor.cuts = [frozenset({pair})] * 3  # h1 or h2? nobody is dropped on a guess
    assert survivor._cut_off(live) == set()
    survivor.cuts = [frozenset({pair, frozenset(("h2", "h3"))}), frozenset(), frozenset({pair})]
    assert survivor._cut_off(live) == set()  # an attempt that named no path: no evidence
    assert driver._send_failed("h1", "RuntimeError: sending to rank 2 (h2): UNAVAILABLE: …") == {pair}
    assert driver._send_failed("h1", "RuntimeError: rank 2 (h2) refused a transfer: …") == frozenset()
