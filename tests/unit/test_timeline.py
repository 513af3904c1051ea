"""A traced run's steps beside the model's (experiment/timeline.py), worked by hand: the
model's step ends from a simulation of a two-step schedule, the run's from records and
traced receives, both counted from each allreduce's first entry."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network
from orchestrator.cost.compiled import compile_run
from orchestrator.cost.predict import BACK_TO_BACK
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate
from orchestrator.experiment import timeline
from tests.unit.conftest import make_topology

BYTES_PER_S = 1000.0  # every link of the star
NETWORK = Network(8 * BYTES_PER_S, efficiency=1.0)


def _two_steps() -> list[tuple[Partition, Schedule]]:
    """star,3: rank 0 sends 1000 B to rank 1, then rank 1 forwards them to rank 2 (4000 B
    messages: whole, so the second waits for the first to land): 1 s each, 2 s an allreduce."""
    schedule = Schedule("by-hand", 3, 250)
    schedule.add_step([Transfer(0, 1, 0, 250, "reduce")])
    schedule.add_step([Transfer(1, 2, 0, 250, "copy")])
    return [(Partition(0, 250, 0), schedule)]


def _model(iterations: int):
    star = make_topology("star", servers=3)
    nodes = [s.name for s in star.servers]
    return simulate(Routes(star), _two_steps(), nodes, NETWORK, 4000, send_buffer_bytes=0, iterations=iterations)


def test_the_models_steps_end_where_worked_by_hand_from_each_allreduces_first_entry():
    sim = _model(3)
    # back to back, rank 0 enters the next allreduce once its send is in (1 s): the second
    # allreduce's first entry is at 1 s, its step 0 ends at 2 s and its step 1 at 3 s; from
    # that entry, 1 s and 2 s, as in the first
    assert timeline.model_steps(sim, per_iteration=1, skip=0) == {0: pytest.approx(1.0), 1: pytest.approx(2.0)}
    assert timeline.model_steps(sim, per_iteration=1, skip=1) == {0: pytest.approx(1.0), 1: pytest.approx(2.0)}


def _records(starts: dict[int, list[float]]) -> list[dict]:
    return [{"rank": rank, "iteration": iteration, "start_time": start}
            for iteration, by_rank in starts.items() for rank, start in enumerate(by_rank)]


def _receive(iteration: int, step: int, rank: int, last: float) -> dict:
    return {"rank": rank, "iteration": iteration, "step": step, "kind": "receive", "last": last, "peer": 0,
            "partition": 0, "offset": 0, "count": 250, "begun": last - 1, "first": last - 1}


def test_a_runs_steps_end_from_each_allreduces_first_entry_median_and_slowest():
    # allreduce 1 begins at 100.0 (its earliest entry), allreduce 2 at 110.0 and 3 at 120.0;
    # step 1 ends 2.5, 2.0 and 4.0 s after those: median 2.5, slowest 4.0. The warm-up
    # (iteration 0) and a send are left out
    records = _records({0: [90.0, 90.2, 90.4], 1: [100.3, 100.0, 100.1], 2: [110.0, 110.5, 111.0],
                        3: [120.2, 120.0, 120.9]})
    transfers = [_receive(0, 0, 1, 99.0), _receive(0, 1, 2, 99.5),
                 _receive(1, 0, 1, 101.0), _receive(1, 1, 2, 102.5),
                 _receive(2, 0, 1, 111.2), _receive(2, 1, 2, 112.0),
                 _receive(3, 0, 1, 121.5), _receive(3, 1, 2, 124.0),
                 {**_receive(3, 1, 1, 130.0), "kind": "send"}]
    measured = timeline.measured_steps(records, transfers, skip=1)
    assert measured == {0: [pytest.approx(1.0), pytest.approx(1.2), pytest.approx(1.5)],
                        1: [pytest.approx(2.5), pytest.approx(2.0), pytest.approx(4.0)]}
    rows = timeline.compare(_model(4), _two_steps(), records, transfers, skip=1)
    assert [(r.step, r.transfers, r.bytes) for r in rows] == [(0, 1, 1000), (1, 1, 1000)]
    first, second = rows
    assert (first.model_end, first.measured_end, first.slowest_end) == (
        pytest.approx(1.0), pytest.approx(1.2), pytest.approx(1.5))
    assert (second.model_end, second.measured_end, second.slowest_end) == (
        pytest.approx(2.0), pytest.approx(2.5), pytest.approx(4.0))
    assert second.behind == pytest.approx(0.5)
    text = timeline.table(rows)
    # each step's row, and what the run lost in the step itself (0.2 s, then 0.3 s more)
    assert text.splitlines()[1].split()[:8] == ["0", "1", "1,000", "1,000.0", "1,200.0", "1,500.0", "200.0", "200.0"]
    assert text.splitlines()[2].split()[:8] == ["1", "1", "1,000", "2,000.0", "2,500.0", "4,000.0", "500.0", "300.0"]


def test_a_step_no_iteration_traced_shows_as_missing():
    rows = timeline.compare(_model(2), _two_steps(), _records({1: [5.0, 5.0, 5.0]}), [_receive(1, 0, 1, 6.0)])
    assert rows[1].measured_end is None and rows[1].behind is None and rows[1].model_end == pytest.approx(2.0)
    assert "–" in timeline.table(rows).splitlines()[2]


def test_a_runs_timeline_comes_from_its_prediction():
    star = make_topology("star", servers=3)
    compiled = compile_run("ring", _ctx(star), 3000, [Partition(0, 3000, 0)], nodes=[s.name for s in star.servers])
    with pytest.raises(ValueError, match="predicted"):
        compiled.timeline(2)
    # halving-doubling on star,8 at 4 MiB with the rendezvous (which the model takes there),
    # a small socket buffer and a credit window: the timeline is the model the prediction
    # ran, so its allreduces in a row take the time per run it gave; dropping any of these
    # from it changes that time
    star8 = make_topology("star", servers=8)
    elements = 2**20
    compiled = compile_run("halving-doubling", _ctx(star8), elements, [Partition(0, elements // 2, 0),
                                                                        Partition(elements // 2, elements // 2, 1)],
                           nodes=[s.name for s in star8.servers], chunk_bytes=256 * 1024, credit_bytes=2**20,
                           send_buffer_bytes=64 * 1024, rendezvous=True)
    predicted = compiled.predicted(Network(200e6, latency=1e-4), star8)
    assert predicted.prediction.rendezvous and predicted.prediction.back_to_back is not None
    sim = predicted.timeline(BACK_TO_BACK)
    assert sim.period == pytest.approx(predicted.prediction.per_run, rel=1e-9)
    eager = dataclasses.replace(predicted, prediction=dataclasses.replace(predicted.prediction, rendezvous=False))
    in_a_row = eager.timeline(BACK_TO_BACK).period  # the plans follow the prediction's choice (meets)
    assert in_a_row != pytest.approx(sim.period, rel=1e-6)
    for changed in (dict(send_buffer_bytes=3 * 2**20), dict(credit_bytes=0), dict(chunk_bytes=64 * 1024)):
        other = dataclasses.replace(eager, **changed)
        assert other.timeline(BACK_TO_BACK).period != pytest.approx(in_a_row, rel=1e-6), changed


def _ctx(topology):
    from orchestrator.collectives.context import Context

    return Context(len(topology.servers), topology, tuple(s.name for s in topology.servers), {})


# -- transfers of another step on the same link --------------------------------------------------

def _w(iteration: int, step: int, src: int, dst: int, start: float, end: float, partition: int = 0,
       elements: int = 0):
    return timeline.Wire(iteration, partition, step, src, dst, start, end, elements)


def _star3():
    star = make_topology("star", servers=3)
    return star, Routes(star), [s.name for s in star.servers]


def _fan_out() -> list[tuple[Partition, Schedule]]:
    """star,3: rank 0 sends to rank 1 in step 0 and to rank 2 in step 1 (both over h0→sw);
    rank 2 sends to rank 1 in step 1 (over h2→sw and sw→h1, which step 0's transfer crosses)."""
    schedule = Schedule("by-hand", 3, 300)
    schedule.add_step([Transfer(0, 1, 0, 100, "reduce")])
    schedule.add_step([Transfer(0, 2, 100, 200, "reduce"), Transfer(2, 1, 200, 300, "reduce")])
    return [(Partition(0, 300, 0), schedule)]


def test_a_transfer_sharing_a_link_with_another_steps_is_counted_with_the_longest_overlap():
    _, routes, nodes = _star3()
    wire = [_w(1, 0, 0, 1, 10.0, 12.0),
            _w(1, 1, 0, 2, 11.5, 13.0),  # on h0→sw with step 0's for 0.5 s
            _w(1, 1, 2, 1, 11.0, 11.6),  # on sw→h1 with step 0's for 0.6 s
            _w(0, 1, 2, 1, 9.0, 10.2),  # the allreduce before, on sw→h1 with step 0's for 0.2 s
            _w(2, 0, 0, 1, 13.5, 14.0)]  # the next one's step 0: alone
    first, second = timeline.crossings(routes, _fan_out(), nodes, wire, skip=1)
    assert (first.step, first.transfers, first.crossed) == (0, 2, 1)
    assert first.median_s == pytest.approx(0.6)
    assert first.longest == "h2→h1 of step 1 on sw→h1 while h0→h1 of step 0 was under way, 600 ms"
    assert (second.step, second.transfers, second.crossed) == (1, 2, 2)
    assert second.median_s == pytest.approx(0.55)
    assert second.longest == "h0→h1 of step 0 on sw→h1 while h2→h1 of step 1 was under way, 600 ms"
    # the allreduce before counts as another step; before `skip` a transfer is not counted itself
    only = timeline.crossings(routes, _fan_out(), nodes, [_w(1, 0, 0, 1, 10.0, 12.0), _w(0, 1, 2, 1, 9.0, 10.2)])
    assert only[0].crossed == 1 and only[0].longest.startswith("h2→h1 of step 1 of the allreduce before on sw→h1")
    assert only[1].transfers == 0


def test_what_does_not_share_a_link_at_once_is_not_a_crossing():
    _, routes, nodes = _star3()
    apart = [_w(1, 0, 0, 1, 10.0, 11.0), _w(1, 1, 0, 2, 11.0, 12.0)]  # one after the other
    same_connection = [_w(1, 0, 0, 1, 10.0, 11.0), _w(1, 1, 0, 1, 10.5, 12.0)]  # its stream queues in order
    same_step = [_w(1, 1, 0, 2, 10.0, 11.0), _w(1, 1, 2, 1, 10.0, 11.0)]
    brief = [_w(1, 0, 0, 1, 10.0, 11.0), _w(1, 1, 0, 2, 10.9995, 12.0)]  # a message boundary
    schedule = Schedule("by-hand", 3, 300)
    schedule.add_step([Transfer(0, 1, 0, 100, "reduce")])
    schedule.add_step([Transfer(0, 2, 100, 200, "reduce"), Transfer(2, 1, 200, 300, "reduce"),
                       Transfer(0, 1, 0, 100, "copy")])
    for wire in (apart, same_connection, same_step, brief):
        found = timeline.crossings(routes, [(Partition(0, 300, 0), schedule)], nodes, wire)
        assert [c.crossed for c in found] == [0, 0], wire


def test_the_model_crosses_where_a_socket_hands_a_step_over_early():
    # rank 0 sends 1000 B to 1 in step 0 and 1000 B to 2 in step 1 through a socket of 600 B
    # (tests/unit/test_cost_model.py): the second starts at 0.4 s and shares h0→sw with the
    # first until 1.6 s; with no buffer they go one after the other
    star, routes, nodes = _star3()
    schedule = Schedule("by-hand", 3, 500)
    schedule.add_step([Transfer(0, 1, 0, 250, "reduce")])
    schedule.add_step([Transfer(0, 2, 250, 250, "reduce")])
    schedules = [(Partition(0, 500, 0), schedule)]
    for buffer, crossed in ((600, 1.2), (0, None)):
        sim = simulate(routes, schedules, nodes, NETWORK, 2**30, send_buffer_bytes=buffer)
        found = timeline.crossings(routes, schedules, nodes, timeline.model_wire(sim, 1), skip=0)
        assert [c.median_s for c in found] == [pytest.approx(crossed) if crossed else None] * 2


def test_a_runs_wire_spans_each_transfer_from_its_sends_first_byte_to_its_receives_last():
    send = {"rank": 0, "peer": 1, "iteration": 1, "partition": 0, "step": 0, "kind": "send", "offset": 0,
            "count": 100, "first": 10.0, "last": 10.5, "begun": 9.0}
    receive = {**send, "rank": 1, "peer": 0, "kind": "receive", "first": 10.2, "last": 11.0}
    # a second range between the same two in the same step: a transfer of its own
    send2, receive2 = {**send, "offset": 100, "first": 10.5}, {**receive, "offset": 100, "last": 11.5}
    unmatched = {**receive, "step": 1}
    assert timeline.run_wire([send, receive, send2, receive2, unmatched]) == [
        (1, 0, 0, 0, 1, 10.0, 11.0, 100), (1, 0, 0, 0, 1, 10.5, 11.5, 100)]


def test_another_partitions_transfer_on_the_same_link_crosses_though_its_step_is_the_same():
    _, routes, nodes = _star3()
    schedule = Schedule("by-hand", 3, 100)
    schedule.add_step([Transfer(0, 1, 0, 100, "reduce")])
    other = Schedule("by-hand", 3, 100)
    other.add_step([Transfer(0, 2, 0, 100, "reduce")])
    schedules = [(Partition(0, 100, 0), schedule), (Partition(100, 100, 1), other)]
    wire = [_w(1, 0, 0, 1, 10.0, 11.0), _w(1, 0, 0, 2, 10.5, 12.0, partition=1)]  # both on h0→sw
    (only,) = timeline.crossings(routes, schedules, nodes, wire)
    assert (only.transfers, only.crossed) == (2, 2) and only.median_s == pytest.approx(0.5)


def test_transfers_alone_on_their_links_and_crossed_ones_are_paced_apart_against_the_line():
    # _fan_out on star,3 at 1000 B/s a link: 100 elements (400 B) each, 0.4 s on the line.
    # Allreduce 1: step 0's 0→1 (10.0-10.5) crosses nothing; step 1's 0→2 and 2→1 go after it
    # (11.0-11.6 and 11.0-11.8). Allreduce 2: 0→1 (20.0-21.0) meets step 1's 2→1 (20.5-21.0)
    # on sw→h1 for 0.5 s, so both are crossed; its 0→2 (21.0-21.4) begins as 0→1 ends: alone. The warm-up (allreduce 0) is left out, and so is a transfer of unknown size
    star, routes, nodes = _star3()
    capacities = routes.capacities(NETWORK)
    assert set(capacities) == {BYTES_PER_S}
    wire = [_w(0, 0, 0, 1, 1.0, 9.0, elements=100),
            _w(1, 0, 0, 1, 10.0, 10.5, elements=100), _w(1, 1, 0, 2, 11.0, 11.6, elements=100),
            _w(1, 1, 2, 1, 11.0, 11.8, elements=100),
            _w(2, 0, 0, 1, 20.0, 21.0, elements=100), _w(2, 1, 2, 1, 20.5, 21.0, elements=100),
            _w(2, 1, 0, 2, 21.0, 21.4, elements=100), _w(2, 1, 0, 2, 21.5, 22.0)]
    found = timeline.paces(routes, _fan_out(), nodes, wire, capacities, itemsize=4, skip=1)
    alone, crossed = found["alone"], found["crossed"]
    # alone: 0.5, 0.6, 0.8 and 0.4 s over 0.4 s of line: 1.25, 1.5, 2.0 and 1.0
    assert alone.count == 4 and (alone.p50, alone.largest) == (pytest.approx(1.375), pytest.approx(2.0))
    assert alone.p10 == pytest.approx(1.0) and alone.p90 == pytest.approx(2.0)
    # crossed: 1.0 and 0.5 s, 2.5 and 1.25
    assert crossed.count == 2 and crossed.p50 == pytest.approx(1.875) and crossed.largest == pytest.approx(2.5)
    text = timeline.pace_lines(found, {"alone": alone, "crossed": timeline.Pace(0, None, None, None, None)})
    assert "1.375 ×" in text[1] and "4)" in text[1] and text[2].endswith("model none")
    # a slower link sets a transfer's line: sw→h1 at half the rate makes 2→1's line 0.8 s
    slow = list(capacities)
    slow[next(i for i, d in enumerate(routes.directions) if (d.src, d.dst) == ("sw", nodes[1]))] = BYTES_PER_S / 2
    assert timeline.paces(routes, _fan_out(), nodes, wire, slow, skip=1)["alone"].largest == pytest.approx(1.5)
