"""A traced run's steps beside the model's (experiment/timeline.py), worked by hand: the
model's step ends from a simulation of a two-step schedule, the run's from records and
traced receives, both counted from each allreduce's first entry."""

from __future__ import annotations

import pytest

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network
from orchestrator.cost.compiled import compile_run
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
    predicted = compiled.predicted(NETWORK, star)
    sim = predicted.timeline(4)
    # the same model the prediction ran: its allreduces in a row take the time per run it gave
    assert sim.period == pytest.approx(predicted.prediction.per_run, rel=1e-9)


def _ctx(topology):
    from orchestrator.collectives.context import Context

    return Context(len(topology.servers), topology, tuple(s.name for s in topology.servers), {})
