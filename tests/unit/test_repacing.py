"""Re-pacing a running run when its links change (control/repacing.py) and an agent taking
the new shares mid-run (Engine.replan). The run through real agents, a real degrade and the
kernel's pacing limits is tests/netns/test_python_api.py's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.agent import plan as plan_format
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.control import repacing
from orchestrator.control.endpoints import Endpoint
from orchestrator.cost import Network
from orchestrator.cost.compiled import over_servers
from orchestrator.cost.routes import Routes
from tests.unit.conftest import make_topology


class _Future:
    def __init__(self, reply: pb.Ack | Exception) -> None:
        self.reply = reply

    def result(self):
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    def add_done_callback(self, callback) -> None:
        callback(self)


class _Stub:
    def __init__(self, sent: list, replies: list) -> None:
        self.Repace = self
        self.sent, self.replies = sent, replies

    def future(self, request: pb.RepaceRequest, timeout: float) -> _Future:
        self.sent.append(request)
        return _Future(self.replies.pop(0) if len(self.replies) > 1 else self.replies[0])


def _repacer(links_now, *replies: pb.Ack | Exception):
    """A mesh of 4 on star,4 at 100 Mbit, paced: every connection a third of its links.
    `replies`: each agent's answers in turn (the last one from then on; default ok)."""
    topology = make_topology("star", servers=4)
    network = Network(100e6)
    compiled = over_servers(topology, "mesh", 4_000_000)
    compiled = compiled.predicted(network, topology, Routes(topology))
    plans = plan_format.build_rank_plans(compiled.schedules, compiled.ranks, compiled.shares(), network.payload_rate)
    endpoints = [Endpoint(rank, node, f"mgmt{rank}:1", f"{node}:2") for rank, node in enumerate(compiled.nodes)]
    sent: list[pb.RepaceRequest] = []
    stubs = {e.control: _Stub(sent, list(replies or [pb.Ack(ok=True)])) for e in endpoints}
    repacer = repacing.Repacer(links_now, topology.rates, plans, compiled, "run1", endpoints, stubs)
    repacer.next = 0.0  # due now
    return repacer, topology, network, sent


def _shares_of(request: pb.RepaceRequest) -> dict[int, set[float]]:
    """Destination rank → the shares of the sends to it in this rank's plan."""
    out: dict[int, set[float]] = {}
    for part in plan_format.parse(request.plan_json):
        for step in part.steps:
            for send in step.sends:
                out.setdefault(send.dst, set()).add(round(send.share, 6))
    return out


def test_links_as_they_were_send_nothing():
    repacer, topology, _, sent = _repacer(lambda: topology_now[0])
    topology_now = [topology]
    repacer.poll()
    assert sent == [] and repacer.changes == []


def test_a_degraded_uplink_repaces_every_agent_at_the_shares_it_leaves_and_its_undo_again():
    now = []
    repacer, topology, network, sent = _repacer(lambda: now[-1])
    now.append(topology.with_rates({("h0", "sw"): 50e6, ("sw", "h0"): 50e6}))
    repacer.poll()
    assert [r.run_id for r in sent] == ["run1"] * 4 and len(repacer.changes) == 1  # sent in rank order
    assert [r.sequence for r in sent] == [1] * 4
    assert [plan_format.link_rate(r.plan_json) for r in sent] == [pytest.approx(network.payload_rate)] * 4  # shares are of it
    # h0's three connections share its halved uplink; the others' to h0 its halved downlink,
    # and theirs to each other what is left of their uplinks: (1 − 1/6) / 2
    assert _shares_of(sent[0]) == {1: {round(1 / 6, 6)}, 2: {round(1 / 6, 6)}, 3: {round(1 / 6, 6)}}
    assert _shares_of(sent[1]) == {0: {round(1 / 6, 6)}, 2: {round(5 / 12, 6)}, 3: {round(5 / 12, 6)}}

    sent.clear()
    repacer.next = 0.0
    repacer.poll()  # the same links again: nothing
    assert sent == []

    now.append(topology)  # undone
    repacer.next = 0.0
    repacer.poll()
    assert len(sent) == 4 and all(shares == {round(1 / 3, 6)} for r in sent for shares in _shares_of(r).values())
    assert [r.sequence for r in sent] == [2] * 4  # an agent takes none older than the last it took
    assert [change["rates"] for change in repacer.changes] == [{"h0→sw": 50e6, "sw→h0": 50e6}, {}]


def test_links_are_read_at_most_every_poll_interval():
    reads = []
    repacer, topology, _, sent = _repacer(lambda: reads.append(1) or topology)
    repacer.poll()
    repacer.poll()
    assert reads == [1]


def test_an_unreadable_lab_or_a_model_that_fails_leaves_the_run_going(caplog, monkeypatch):
    def broken():
        raise OSError("faults.jsonl: cut short")

    repacer, topology, _, sent = _repacer(broken)
    with caplog.at_level("WARNING", logger="testbed.driver"):
        repacer.poll()  # does not raise
    assert sent == [] and "faults.jsonl: cut short" in caplog.text
    degraded = topology.with_rates({("h1", "sw"): 10e6})
    repacer, _, _, sent = _repacer(lambda: degraded)
    monkeypatch.setattr(type(repacer.compiled), "shares", lambda *_: (_ for _ in ()).throw(ValueError("no routes")))
    repacer.poll()
    assert sent == [] and repacer.changes == []
    monkeypatch.undo()
    repacer.next = 0.0
    repacer.poll()  # tried again at the next poll
    assert len(sent) == 4 and len(repacer.changes) == 1


def test_an_agent_that_did_not_take_the_shares_is_sent_them_again_at_the_next_poll():
    degraded = make_topology("star", servers=4).with_rates({("h1", "sw"): 10e6})
    repacer, _, _, sent = _repacer(lambda: degraded, pb.Ack(ok=False, error="RuntimeError: busy"), pb.Ack(ok=True))
    repacer.poll()
    assert len(sent) == 4 and repacer.unsent == {0, 1, 2, 3}  # each agent's first answer: refused
    sent.clear()
    repacer.next = 0.0
    repacer.poll()
    assert [(r.sequence, r.plan_json) for r in sent] == [(1, plan) for plan in repacer.plans] and not repacer.unsent
    assert len(repacer.changes) == 1


def test_an_agent_whose_run_ended_or_whose_channel_closed_is_not_asked_again():
    degraded = make_topology("star", servers=4).with_rates({("h1", "sw"): 10e6})
    repacer, _, _, sent = _repacer(lambda: degraded, pb.Ack(ok=False, error="RuntimeError: cannot repace a run that is done"))
    repacer.poll()
    assert len(sent) == 4 and not repacer.unsent


def test_a_change_that_leaves_every_share_as_it_was_sends_nothing():
    # h0's uplink faster than the rest: its connections still get a third each, as their
    # receivers' downlinks share among three senders
    faster = make_topology("star", servers=4).with_rates({("h0", "sw"): 400e6})
    repacer, _, _, sent = _repacer(lambda: faster)
    repacer.poll()
    assert sent == [] and repacer.changes == [] and repacer.rates == {("h0", "sw"): 400e6}


def test_an_agent_takes_a_repace_only_newer_than_the_last():
    from orchestrator.agent.server import Agent

    taken = []
    agent = object.__new__(Agent)
    agent.config, agent.state, agent.repaced = pb.RunConfig(run_id="run1"), "running", 0
    agent.engine = SimpleNamespace(replan=lambda plans, rate: taken.append(rate))
    plan = '{"partitions":[],"link_bytes_per_second":%d}'
    agent.repace("run1", plan % 2, 2)
    agent.repace("run1", plan % 1, 1)  # arrived late: passed over
    agent.repace("run1", plan % 3, 3)
    assert taken == [2, 3]
    with pytest.raises(RuntimeError, match="not the configured one"):
        agent.repace("run0", plan % 4, 4)
    agent.state = "done"
    with pytest.raises(RuntimeError, match="cannot repace a run that is done"):
        agent.repace("run1", plan % 5, 5)


def _engine(share: float):
    from orchestrator.agent.engine import Engine

    steps = [plan_format.Step(0, [plan_format.Send(1, 0, 4, False, -1, share)], [plan_format.Recv(1, 0, 4)])]
    return Engine("run", 0, [plan_format.PartitionPlan(0, 0, 4, 0, steps)], np.ones(4, np.float32),
                  {1: {"node": "h1", "address": "-", "by_nic": {}}}, chunk_bytes=8, credit_bytes=0,
                  counters=lambda *_: None, link_rate=1e6, transport="grpc")


def test_an_engine_takes_new_shares_while_its_run_goes_on_and_keeps_its_pacer():
    engine = _engine(0.5)
    pacer = engine.pacer
    engine.iteration = 3  # running
    steps = [plan_format.Step(0, [plan_format.Send(1, 0, 4, False, -1, 0.25)], [plan_format.Recv(1, 0, 4)])]
    engine.replan([plan_format.PartitionPlan(0, 0, 4, 0, steps)], 2e6)
    assert engine.plans[0].steps[0].sends[0].share == 0.25
    assert engine.pacer is pacer and pacer.link_rate == 2e6


def test_an_engine_refuses_a_plan_whose_transfers_differ():
    engine = _engine(0.5)
    steps = [plan_format.Step(0, [plan_format.Send(1, 0, 3, False, -1, 0.5)], [plan_format.Recv(1, 0, 4)])]
    with pytest.raises(ValueError, match="transfers differ"):
        engine.replan([plan_format.PartitionPlan(0, 0, 4, 0, steps)], 1e6)
    assert engine.plans[0].steps[0].sends[0].count == 4
