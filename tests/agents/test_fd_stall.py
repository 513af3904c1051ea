"""Failure detection: the stall diagnosis as a pure function of the agents' statuses, then
real agents on loopback: a frozen agent fails a run within its stall timeout, named, and
once thawed (or left running by a driver that went away) does not fail the next run."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time


from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.collectives import registry
from orchestrator.control import driver, workloads
from orchestrator.control.stalls import RankView, _dead_edges, stall_message
from orchestrator.control.local import local_agents

NODES = ["h0", "h1", "h2", "h3"]


def running(iteration: int, *pending: pb.Pending, stalled: float = 5.0) -> pb.AgentStatus:
    return pb.AgentStatus(state="running", iteration=iteration, stalled_seconds=stalled, pending=pending)


def receive(peer: int, step: int, done: int = 0, ready: bool = True) -> pb.Pending:
    return pb.Pending(kind="receive", peer=peer, step=step, offset=0, end=100, done=done, ready=ready)


def send(peer: int, step: int, done: int = 0, ready: bool = True) -> pb.Pending:
    return pb.Pending(kind="send", peer=peer, step=step, offset=0, end=100, done=done, ready=ready)


def views(*statuses: pb.AgentStatus, silent: dict[int, float] | None = None) -> list[RankView]:
    silent = silent or {}
    return [RankView(rank, NODES[rank], status, silent.get(rank, 0.2), status.stalled_seconds + silent.get(rank, 0.2))
            for rank, status in enumerate(statuses)]


def star_path(src: str, dst: str) -> list[str]:
    return [src, "sw", dst]


# a ring 0→1→2→3→0 whose h1-sw link died at step 2: rank 0 wrote data rank 1 never got,
# and rank 1 is blocked writing to rank 2; ranks 3 and 0 only wait on their own inputs
CUT = views(
    running(3, send(1, 2, done=60, ready=False), receive(3, 3, ready=True)),
    running(3, receive(0, 2, done=40), send(2, 2, done=40, ready=True)),
    running(3, receive(1, 2, done=40), send(3, 3, done=0, ready=False)),
    running(3, receive(2, 3, done=0), send(0, 3, done=0, ready=False)),
)


def test_a_dead_path_names_both_ranks_their_nodes_and_the_shared_link():
    message = stall_message("ring", CUT, 5.0, star_path)
    assert message == ("ring stalled at iteration 3 step 2: rank 1 (h1) waits for rank 0 (h0) since 5.2 s; "
                       "path h0→sw→h1; rank 2 (h2) waits for rank 1 (h1) since 5.2 s; path h1→sw→h2 "
                       "(link h1-sw down?): check it and run again")


def test_a_link_state_callback_names_the_link_that_is_down():
    down = {frozenset(("h1", "sw"))}
    message = stall_message("ring", CUT, 5.0, star_path, lambda a, b: frozenset((a, b)) not in down)
    assert message.endswith("(link h1-sw down): heal it and run again")


def test_without_a_topology_the_ranks_and_nodes_are_still_named():
    message = stall_message("ring", CUT, 5.0)
    assert "rank 1 (h1) waits for rank 0 (h0) since 5.2 s" in message and "path" not in message


def test_a_silent_rank_is_named_before_those_that_wait_for_it():
    statuses = views(running(1, receive(3, 1)), running(1, receive(0, 1)), running(1, stalled=0.0),
                     running(1, receive(2, 1)), silent={2: 6.0})
    message = stall_message("ring", statuses, 5.0, star_path)
    assert message.startswith("ring stalled at iteration 1 step 1: rank 2 (h2) has not answered for 6.0 s "
                              "(rank 3 waits for it) (frozen")
    assert "\n" not in message


def test_a_receiver_held_back_by_its_own_earlier_step_is_not_blamed():
    # rank 1 waits for rank 0, which has not the data yet: it waits for rank 3, which has not
    # it either; no path is blamed, each rank says what it waits for
    statuses = views(running(0, send(1, 1, ready=False), receive(3, 0, ready=True)),
                     running(0, receive(0, 1)), running(0), running(0, send(0, 0, ready=False)))
    assert _dead_edges(statuses, set()) == []
    assert stall_message("ring", statuses, 5.0).startswith(
        "ring stalled at iteration 0 step 0: no data moved for 5.0 s; rank 0 (h0) waits for rank 3 (h3); "
        "rank 1 (h1) waits for rank 0 (h0); rank 2 (h2) waits for nothing it can name")
    # with no path to blame, a link the lab says is down between ranks that wait for each
    # other is named: rank 1 waits for rank 0 over h0→sw→h1; none when every link is up
    down = {frozenset(("h1", "sw"))}
    assert stall_message("ring", statuses, 5.0, star_path, lambda a, b: frozenset((a, b)) not in down).endswith(
        "rank 2 (h2) waits for nothing it can name; rank 3 (h3) waits for nothing it can name (link h1-sw down "
        "between ranks that wait for each other): heal it and run again")
    assert "down" not in stall_message("ring", statuses, 5.0, star_path, lambda a, b: True)
    # once rank 3 has written it all (nothing pending to rank 0), the path 3→0 is to blame
    statuses[3] = views(running(0), running(0), running(0), running(0, send(2, 1, ready=False)))[3]
    assert _dead_edges(statuses, set()) == [(3, 0, 0)]


def test_ranks_that_cannot_say_why_are_listed():
    message = stall_message("mesh", views(running(0), running(0)), 5.0)
    assert message == "mesh stalled at iteration 0: no data moved for 5.0 s; rank 0 (h0) waits for nothing it " \
                      "can name; rank 1 (h1) waits for nothing it can name"


# -- real agents on loopback ------------------------------------------------------------------
STALL = 4.0
MARGIN = 20.0


def agent_pid(endpoint) -> int:
    found = subprocess.run(["pgrep", "-f", "--", f"--control {endpoint.control}"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def test_a_frozen_agent_fails_the_run_within_the_stall_timeout_and_thawed_is_reused(caplog):
    tensors = [1_000_000]
    with local_agents(4) as eps:
        outcome: dict = {}

        def go() -> None:
            try:
                driver.run(eps, "ring", tensors, workloads.emulated(tensors), iterations=5000, timeout=300,
                           stall_timeout=STALL)
            except driver.RunError as exc:
                outcome["error"] = exc
            outcome["ended"] = time.monotonic()

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        time.sleep(3.0)  # configured, started, reducing
        pid = agent_pid(eps[2])
        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            thread.join(STALL + MARGIN)
            assert "ended" in outcome and "error" in outcome, outcome
            message = str(outcome["error"])
            print(f"detected in {outcome['ended'] - frozen:.1f} s: {message}")
            assert "rank 2 (local2) has not answered" in message and "\n" not in message, message
        finally:
            os.kill(pid, signal.SIGCONT)
        with caplog.at_level(logging.WARNING, logger="testbed.driver"):
            again = driver.run(eps, "ring", [1000], workloads.emulated([1000]), iterations=1)
        assert all(r["verified"] for r in again.records())


def test_a_run_its_driver_left_behind_is_stopped_before_the_next_one(caplog):
    tensors = [100_000]
    with local_agents(3) as eps:
        with driver.control_stubs(eps) as stubs:  # a driver that starts a long run, then is gone
            plans = driver.build_rank_plans(registry.schedules("ring", driver.Context(3), tensors[0],
                                                                      driver.partitions(tensors, None)), 3)
            peers = [pb.Peer(rank=e.rank, node=e.node, address=e.data) for e in eps]
            for e in eps:
                assert stubs[e.control].Configure(pb.RunConfig(
                    run_id="orphan", rank=e.rank, role="worker", peers=peers, algorithm="ring",
                    plan_json=plans[e.rank], size=tensors[0], iterations=1000000, workers=3,
                    workload_json='{"kind": "emulated", "compute_seconds": 0.5}'), timeout=30).ok
            for e in eps:
                assert stubs[e.control].Start(pb.StartRequest(run_id="orphan"), timeout=30).ok
        with caplog.at_level(logging.WARNING, logger="testbed.driver"):
            result = driver.run(eps, "ring", tensors, workloads.emulated(tensors), iterations=1)
        assert all(r["verified"] for r in result.records())
        stopped = [r.getMessage() for r in caplog.records if "still ran run orphan" in r.getMessage()]
        assert len(stopped) == 3 and stopped[0].startswith("rank 0 (local0) still ran run orphan, unwatched for")
