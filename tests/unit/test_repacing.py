"""Re-pacing a running run when its links change (control/repacing.py) and an agent taking
the new shares mid-run (Engine.replan). The run through real agents, a real degrade and the
kernel's pacing limits is tests/netns/test_python_api.py's."""

from __future__ import annotations

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
    def __init__(self, sent: list, reply: pb.Ack | Exception) -> None:
        self.Repace = self
        self.sent, self.reply = sent, reply

    def future(self, request: pb.RepaceRequest, timeout: float) -> _Future:
        self.sent.append(request)
        return _Future(self.reply)


def _repacer(links_now, reply: pb.Ack | Exception = pb.Ack(ok=True)):
    """A mesh of 4 on star,4 at 100 Mbit, paced: every connection a third of its links."""
    topology = make_topology("star", servers=4)
    network = Network(100e6)
    compiled = over_servers(topology, "mesh", 4_000_000)
    compiled = compiled.predicted(network, topology, Routes(topology))
    endpoints = [Endpoint(rank, node, f"mgmt{rank}:1", f"{node}:2") for rank, node in enumerate(compiled.nodes)]
    sent: list[pb.RepaceRequest] = []
    stubs = {e.control: _Stub(sent, reply) for e in endpoints}
    repacer = repacing.Repacer(links_now, topology.rates, compiled, "run1", endpoints, stubs)
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
    assert [change["rates"] for change in repacer.changes] == [{"h0→sw": 50e6, "sw→h0": 50e6}, {}]


def test_links_are_read_at_most_every_poll_interval():
    reads = []
    repacer, topology, _, sent = _repacer(lambda: reads.append(1) or topology)
    repacer.poll()
    repacer.poll()
    assert reads == [1]


def test_an_unreadable_lab_or_an_agent_that_refuses_leaves_the_run_going(caplog):
    def broken():
        raise OSError("faults.jsonl: cut short")

    repacer, topology, _, sent = _repacer(broken)
    repacer.poll()
    assert sent == []
    degraded = topology.with_rates({("h1", "sw"): 10e6})
    repacer, _, _, sent = _repacer(lambda: degraded, pb.Ack(ok=False, error="ValueError: the new plan's transfers differ"))
    with caplog.at_level("WARNING", logger="testbed.driver"):
        repacer.poll()
    assert len(sent) == 4 and "re-pacing rank 0 (h0): ValueError: the new plan's transfers differ" in caplog.text


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
