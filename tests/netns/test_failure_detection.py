"""Failure detection on a live lab (star,4 in bare namespaces, agents forked into them): a cut
link or a frozen agent fails a ring run within its stall timeout, naming the rank, node and
link; a frozen and thawed agent does not fail the next run."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.collectives.context import Context
from orchestrator.cost import Network
from orchestrator.emulation import cleanup
from orchestrator.faults import Injector
from orchestrator.deploy import lab_agents

from orchestrator.control import driver, workloads

STALL = 5.0
MARGIN = 20.0  # generous: two busy cores, the driver's Stop calls, the thread's join
TENSORS = [4_000_000]  # 16 MB: a ring iteration lasts a fraction of a second at 1 Gbit


@pytest.fixture(scope="module")
def star():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    lab = Lab.up(lab_from_argument("star,4", name="fd-star", **{"servers.runtime": "netns"}))
    try:
        yield lab, lab_agents.start(lab, via="exec")
    finally:
        Injector(lab).heal()
        cleanup.clean_lab(lab.name)


def run_in_thread(lab, endpoints) -> tuple[threading.Thread, dict]:
    """A long ring run in a thread; `outcome` gets its error (or result) and when it ended."""
    outcome: dict = {}
    ctx = Context(4, lab.topology, tuple(e.node for e in endpoints))

    def go() -> None:
        try:
            outcome["result"] = driver.run(endpoints, "ring", TENSORS, workloads.emulated(TENSORS), iterations=2000,
                                           ctx=ctx, network=Network.from_links(lab.spec.links), timeout=600,
                                           stall_timeout=STALL, link_state=lab.link_up)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, outcome


def until_running(endpoints, outcome: dict, iterations: int = 2) -> None:
    """Until every agent is past its first iterations (the run is moving data)."""
    with driver.control_stubs(endpoints) as stubs:
        deadline = time.monotonic() + 60
        while True:
            assert "ended" not in outcome, outcome
            states = [stubs[e.control].Status(driver.pb.Empty(), timeout=5) for e in endpoints]
            if all(s.state == "running" and s.iteration >= iterations for s in states):
                return
            assert time.monotonic() < deadline, states
            time.sleep(0.2)


def test_a_cut_link_fails_the_run_within_the_stall_timeout_naming_node_and_link(star):
    lab, endpoints = star
    thread, outcome = run_in_thread(lab, endpoints)
    until_running(endpoints, outcome)
    injector = Injector(lab)
    cut = injector.inject("link-down", "h1-sw")
    cut_at = time.monotonic()
    try:
        thread.join(STALL + MARGIN)
        assert "ended" in outcome, "the run did not fail within the stall timeout"
        error = outcome.get("error")
        assert isinstance(error, driver.RunError), outcome
        message = str(error)
        print(f"detected in {outcome['ended'] - cut_at:.1f} s: {message}")
        assert outcome["ended"] - cut_at < STALL + MARGIN
        assert "\n" not in message and "(h1)" in message and "h1-sw" in message, message
    finally:
        injector.undo(cut.fault.id)
        thread.join(60)


def test_a_frozen_agent_is_named_and_once_thawed_the_next_run_needs_no_stop(star):
    lab, endpoints = star
    thread, outcome = run_in_thread(lab, endpoints)
    until_running(endpoints, outcome)
    injector = Injector(lab)
    pause = injector.inject("server-pause", "h2")  # SIGSTOP to the processes of h2's namespace
    paused_at = time.monotonic()
    try:
        thread.join(STALL + MARGIN)
        assert "ended" in outcome, "the run did not fail within the stall timeout"
        message = str(outcome.get("error"))
        print(f"detected in {outcome['ended'] - paused_at:.1f} s: {message}")
        assert isinstance(outcome.get("error"), driver.RunError), outcome
        assert "rank 2 (h2) has not answered" in message and "\n" not in message, message
    finally:
        injector.undo(pause.fault.id)  # SIGCONT
        thread.join(60)
    ctx = Context(4, lab.topology, tuple(e.node for e in endpoints))
    again = driver.run(endpoints, "ring", [100_000], workloads.emulated([100_000]), iterations=2, ctx=ctx)
    assert all(r["verified"] for r in again.records())
