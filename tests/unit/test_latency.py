"""α, the per-message latency: priced by the model as worked by hand, fitted from a
measurement, kept per lab and transport (latency.json, read back as untrusted input), and
used by plans, dry runs and `testbed predict`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network, predict, predict_schedules
from orchestrator.cost.latency import fit_alpha
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate
from orchestrator.errors import BadUsage
from orchestrator.experiment import calibrate
from orchestrator.experiment.plan import make_plan
from orchestrator.spec import lab_from_argument
from orchestrator.spec.experiment import load_experiment
from tests.unit.conftest import make_topology

MEASURED = {"alpha_s": 0.0015, "pingpong_s": 0.001, "allreduce_s": 0.009, "peer_s": 0.0002, "mesh_s": 0.02,
            "cores": 2}


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_rank_writes_a_steps_messages_one_after_another():
    # by hand: h0 sends 4000 B to h1 and 4000 B to h2 in one step over its one uplink
    # (1000 B/s payload), α = 0.1 s. The first waits α and runs alone till 2α = 0.2 s (100 B);
    # then both share the uplink at 500 B/s: the first's 3900 B end at 0.2 + 7.8 = 8.0 s, the
    # second has 100 B left and the link to itself: 8.1 s. One sender: cores change nothing
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 2000)
    schedule.add_step([Transfer(0, 1, 0, 1000, "reduce"), Transfer(0, 2, 1000, 1000, "reduce")])
    for cores in (None, 2, 1):
        run = simulate(Routes(star), [(Partition(0, 2000, 0), schedule)], [s.name for s in star.servers],
                       Network(8000, efficiency=1.0, latency=0.1, cores=cores), 2**30)
        first, second = run.flows
        assert (first.lead, second.lead) == pytest.approx((0.1, 0.2)), cores
        assert first.finished == pytest.approx(8.0) and run.seconds == pytest.approx(8.1), cores


def test_more_senders_than_cores_stretch_alpha_where_their_cpu_cannot_hide_behind_their_bytes():
    # h0 → h1 and h2 → h3 at once, α = 0.1 s, 1000 B/s, one core: the step takes at least
    # both messages' CPU, 2α, and the CPU work overlaps the bytes. With 4 B each (0.004 s on
    # the wire) α stretches by 2 − 0.004/0.1; with 40 B, by 2 − 0.4; with 4000 B, not at all
    star = make_topology("star", servers=4)
    for elements, one_core in ((1, (2 - 0.04) * 0.1), (10, (2 - 0.4) * 0.1), (1000, 0.1)):
        schedule = Schedule("by-hand", 4, 2 * elements)
        schedule.add_step([Transfer(0, 1, 0, elements, "reduce"), Transfer(2, 3, elements, elements, "reduce")])
        for cores, lead in ((None, 0.1), (2, 0.1), (1, one_core)):
            run = simulate(Routes(star), [(Partition(0, 2 * elements, 0), schedule)], [s.name for s in star.servers],
                           Network(8000, efficiency=1.0, latency=0.1, cores=cores), 2**30)
            assert [f.lead for f in run.flows] == pytest.approx([lead, lead]), (elements, cores)
            assert run.seconds == pytest.approx(elements * 4 / 1000 + lead), (elements, cores)


def test_senders_of_several_messages_each_on_too_few_cores_end_when_their_cpu_does():
    # by hand: 3 senders, 2 messages of 40 B each to ranks of their own, α = 0.1 s, one core,
    # 1000 B/s. The CPU bounds the step: S·m·α / C = 0.6 s (beside m·α + w = 0.28). α
    # stretches by 3 − 0.08 / (2²·0.1) = 2.8: the second message leaves at 0.56 and its 40 B
    # end at 0.60. (Stretching by 3 − w / (m·α) = 2.6 ended it at 0.56, taking the first
    # message's bytes off a step they do not shorten.)
    star = make_topology("star", servers=9)
    schedule = Schedule("by-hand", 9, 60)
    schedule.add_step([Transfer(src, dst, 10 * i, 10, "reduce")
                       for i, (src, dst) in enumerate(((0, 1), (0, 2), (3, 4), (3, 5), (6, 7), (6, 8)))])
    run = simulate(Routes(star), [(Partition(0, 60, 0), schedule)], [s.name for s in star.servers],
                   Network(8000, efficiency=1.0, latency=0.1, cores=1), 2**30)
    assert sorted({round(f.lead, 9) for f in run.flows}) == pytest.approx([0.28, 0.56])
    assert run.seconds == pytest.approx(0.6)


def test_a_zero_byte_ring_of_n_on_c_cores_pays_n_over_c_alpha_a_step():
    # every rank sends one message a step: n messages over c cores; with a core each, α
    star = make_topology("star", servers=8)
    for cores, per_step in ((None, 1), (8, 1), (2, 4), (1, 8)):
        seconds = predict(star, "ring", 64, Network(1e12, latency=0.001, cores=cores)).seconds
        assert seconds == pytest.approx(2 * 7 * per_step * 0.001, rel=1e-3), cores
    # a bulk ring's CPU hides behind its bytes: α a step, whatever the cores
    bulk = [predict(star, "ring", 4 * 2**20, Network(100e6, latency=0.001, cores=cores)).seconds for cores in (None, 2)]
    assert bulk[1] == pytest.approx(bulk[0], rel=0.02)
    with pytest.raises(ValueError, match="cores"):
        Network(1e9, cores=0)


def test_fit_alpha_finds_the_alpha_a_measurement_was_made_with():
    star = make_topology("star", servers=4)

    def model(alpha: float) -> float:
        return predict(star, "ring", 256, Network(50e6, latency=alpha)).per_run

    measured = model(0.0015)
    assert fit_alpha(model, measured) == pytest.approx(0.0015, rel=2e-3)
    assert fit_alpha(model, model(0.0) * 0.5) == 0.0  # already as slow as measured: no latency to add
    with pytest.raises(ValueError, match="not latency-bound"):
        fit_alpha(model, 3600.0)
    with pytest.raises(ValueError, match="positive"):
        fit_alpha(model, 0.0)


def test_alpha_kept_per_lab_and_transport_is_what_plans_and_dry_runs_use(state):
    spec = load_experiment(Path(__file__).parents[2] / "experiments" / "digits.yaml")
    lab = spec.lab
    without = make_plan(spec).points
    assert all(p.prediction.network.latency == 0 for p in without)
    where = calibrate.save_latency(lab, "tcp", MEASURED)
    assert where == state / "latency.json"
    assert calibrate.latency_for(lab, "tcp") == (0.0015, 2, 0.0002) and calibrate.latency_for(lab, "grpc") is None
    docker = lab.model_copy(update={"servers": lab.servers.model_copy(update={"runtime": "docker"})})
    assert calibrate.latency_for(docker, "tcp") == (0.0015, 2, 0.0002)  # the same topology under the other runtime
    other = lab_from_argument("star,4", **{"servers.runtime": "netns"})
    assert calibrate.latency_for(other, "tcp") is None
    with_alpha = make_plan(spec).points
    for before, after in zip(without, with_alpha):
        assert after.prediction.network.latency == 0.0015 and after.prediction.network.cores == 2
        assert after.prediction.per_run > before.prediction.per_run + 2 * 0.0015  # every step pays it
    calibrate.save_latency(lab, "grpc", {**MEASURED, "alpha_s": 0.003})  # beside, not instead
    assert calibrate.latency_for(lab, "tcp").alpha == 0.0015 and calibrate.latency_for(lab, "grpc").alpha == 0.003


def test_an_alpha_measured_on_a_busy_machine_is_measured_again(state):
    """A kept α measured while the CPU had less than the verdict's idle share (the agents
    waiting for a core, fitted as latency), or while a hypervisor held more of its time than
    the verdict's MAX_STEAL, is not used: the run measures it again. One measured quiet is
    used, and so is one kept before the share was recorded."""
    netns = lab_from_argument("bcube,2,1", **{"servers.runtime": "netns"})
    docker = netns.model_copy(update={"servers": netns.servers.model_copy(update={"runtime": "docker"})})
    calibrate.save_latency(netns, "tcp", {**MEASURED, "cpu_idle_share": 0.05})
    assert calibrate.latency_for(netns, "tcp") is None
    assert calibrate.latency_for(docker, "tcp") is None  # nor borrowed by the other runtime
    assert "too busy" in calibrate.describe_latency({**MEASURED, "cpu_idle_share": 0.05})
    calibrate.save_latency(docker, "tcp", {**MEASURED, "alpha_s": 0.0004, "cpu_idle_share": 0.6})
    assert calibrate.latency_for(netns, "tcp") == (0.0004, 2, 0.0002)  # the quiet one, borrowed
    calibrate.save_latency(netns, "tcp", {**MEASURED, "cpu_idle_share": 0.2})
    assert calibrate.latency_for(netns, "tcp") == (0.0015, 2, 0.0002)
    calibrate.save_latency(netns, "tcp", MEASURED)  # kept before the share was recorded
    assert calibrate.latency_for(netns, "tcp") == (0.0015, 2, 0.0002)
    assert "busy" not in calibrate.describe_latency({**MEASURED, "cpu_idle_share": 0.6})
    # idle, yet a hypervisor held the CPU a while: what the agents waited for is not latency
    calibrate.save_latency(netns, "tcp", {**MEASURED, "cpu_idle_share": 0.6, "cpu_steal_share": 0.2})
    assert calibrate.latency_for(netns, "tcp") == (0.0004, 2, 0.0002)  # the docker one, borrowed
    assert "20% held by the hypervisor: too busy" in calibrate.describe_latency(
        {**MEASURED, "cpu_idle_share": 0.6, "cpu_steal_share": 0.2})
    calibrate.save_latency(netns, "tcp", {**MEASURED, "cpu_idle_share": 0.6, "cpu_steal_share": 0.01})
    assert calibrate.latency_for(netns, "tcp") == (0.0015, 2, 0.0002)



def test_a_dry_run_says_why_a_kept_alpha_is_measured_again(state):
    """What `testbed run --dry-run` prints of a lab's α: as measured; not measured yet; or
    kept but measured on a busy machine, by other agents or without its per-peer cost, and
    so measured again by the run, with that reason (it said "not measured yet" of one
    measured while a hypervisor held 6 % of the CPU)."""
    from orchestrator import cli

    spec = load_experiment(Path(__file__).parents[2] / "experiments" / "digits.yaml")

    def said() -> str:
        (line,) = cli._latency_lines(make_plan(spec))
        return line

    assert "not measured yet, so left out here: the run measures it before its first point" in said()
    for kept, why in (({**MEASURED, "cpu_idle_share": 0.6, "cpu_steal_share": 0.06},
                       "measured while a hypervisor held 6% of the CPU (> 5%)"),
                      ({**MEASURED, "cpu_idle_share": 0.1}, "measured with the CPU 10% idle (< 20%)"),
                      ({**MEASURED, "agents": "0123456789abcdef"}, "measured by other agents than these"),
                      ({k: v for k, v in MEASURED.items() if k != "peer_s"}, "kept without its per-peer cost")):
        calibrate.save_latency(spec.lab, "tcp", kept)
        if "agents" in kept:  # save_latency stamps these agents' own: put the other one back
            path = state / "latency.json"
            data = json.loads(path.read_text())
            data["labs"]["bcube-2-1 netns"]["tcp"]["agents"] = kept["agents"]
            path.write_text(json.dumps(data))
        assert calibrate.distrust(json.loads((state / "latency.json").read_text())["labs"]["bcube-2-1 netns"]["tcp"]) == why
        assert f"{why}, so not trusted, so left out here: the run measures it before its first point" in said(), why
    calibrate.save_latency(spec.lab, "tcp", {**MEASURED, "cpu_idle_share": 0.6, "cpu_steal_share": 0.01})
    assert said().endswith("1,500 µs per message and 200 µs more per further peer, the agents sharing 2 cores, "
                           "as measured on it")

@pytest.mark.parametrize("content, field", [
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": -1, "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": "1", "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 1e308, "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0.001, "allreduce_s": 0}}}}', "pingpong_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "cores": 0}}}}', "cores"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "cores": 2.5}}}}',
     "cores"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "cores": 2, '
     '"cpu_idle_share": 1.5}}}}', "cpu_idle_share"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "cores": 2, '
     '"cpu_idle_share": "0.5"}}}}', "cpu_idle_share"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "cores": 2, '
     '"cpu_steal_share": -0.1}}}}', "cpu_steal_share"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "peer_s": -0.1, '
     '"cores": 2}}}}', "peer_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0, "pingpong_s": 0, "allreduce_s": 0, "mesh_s": true, '
     '"cores": 2}}}}', "mesh_s"),
    ('{"labs": {"star-4 netns": {"tcp": 3}}}', "star-4 netns.tcp"),
    ('{"labs": []}', "labs"),
    ("[1, 2", "unreadable"),
])
def test_a_broken_latency_file_is_one_line_naming_its_field(state, content, field):
    state.mkdir()
    (state / "latency.json").write_text(content)
    with pytest.raises(calibrate.NotCalibrated, match=field) as caught:
        calibrate.load_latency()
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_an_oversized_latency_file_is_refused_before_it_is_read(state):
    state.mkdir()
    (state / "latency.json").write_bytes(b" " * (calibrate._MAX_LATENCY_FILE + 1))  # noqa: SLF001
    with pytest.raises(calibrate.NotCalibrated, match="larger than"):
        calibrate.load_latency()


def test_keeping_alpha_never_writes_through_a_symlink(state, tmp_path):
    state.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text("mine")
    (state / "latency.json").symlink_to(outside)
    lab = lab_from_argument("star,4", **{"servers.runtime": "netns"})
    with pytest.raises(BadUsage, match="symlink"):
        calibrate.save_latency(lab, "tcp", MEASURED)
    assert outside.read_text() == "mine"


def test_testbed_predict_uses_the_alpha_measured_on_its_lab(state):
    calibrate.save_latency(lab_from_argument("bcube,2,1", **{"servers.runtime": "netns"}), "tcp", MEASURED)

    def predicted(*extra: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "predict", "bcube,2,1", "-a", "ring",
                               "--size", "19240B", "--bandwidth", "50Mbit", "--json", *extra],
                              capture_output=True, text=True, env=os.environ | {"TESTBED_STATE": str(state)},
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    measured, given = predicted(), predicted("--latency", "0us")
    assert measured["network"]["latency"] == 0.0015 and measured["network"]["cores"] == 2
    assert given["network"]["latency"] == 0
    assert measured["seconds"] > given["seconds"] + 6 * 0.0015 * 0.9


def test_a_prediction_splits_its_time_into_bandwidth_latency_and_waiting():
    # by hand: one transfer of 4000 B at 1000 B/s after α = 0.1 s, back to back: 4.1 s each,
    # 4.0 of them the link's, 0.1 α's, nothing waited
    star = make_topology("star", servers=2)
    schedule = Schedule("by-hand", 2, 1000)
    schedule.add_step([Transfer(0, 1, 0, 1000, "reduce")])
    nodes = [s.name for s in star.servers]
    one = predict_schedules(star, [(Partition(0, 1000, 0), schedule)], nodes, Network(8000, efficiency=1.0, latency=0.1),
                            2**30, attribute=True)
    assert one.per_run == pytest.approx(4.1)
    assert one.parts == pytest.approx({"bandwidth": 4.0, "latency": 0.1, "waiting": 0.0})
    # a ring on star,4: the parts add up to the time; without α, none of it is latency
    for alpha in (0.0, 0.002):
        ring = predict_schedules(*_ring(4, 4_000_000), Network(50e6, latency=alpha), attribute=True)
        assert sum(ring.parts.values()) == pytest.approx(ring.per_run)
        assert ring.parts["bandwidth"] == pytest.approx(ring.links[0].bytes / ring.network.payload_rate)
        assert (ring.parts["latency"] > 0) == (alpha > 0) and ring.parts["waiting"] >= 0
    assert predict_schedules(*_ring(4, 4000), Network(50e6)).parts is None  # only when asked


def _ring(n: int, size: int):
    from orchestrator.cost.compiled import build_schedules

    star = make_topology("star", servers=n)
    schedules, nodes = build_schedules(star, "ring", size)
    return star, schedules, nodes


def test_the_report_shows_where_the_model_puts_each_points_time():
    from orchestrator.experiment.report import COLUMNS, _attribution_lines

    point = {"id": "000-ring", "predicted": {"seconds": 0.02, "latency_s": 0.0015,
                                             "parts": {"bandwidth": 0.005, "latency": 0.012, "waiting": 0.003}}}
    lines = _attribution_lines({"points": [point, {"id": "001-old", "predicted": {"seconds": 1.0}}]})
    [row] = [line for line in lines if line.startswith("| 000-ring")]
    assert "(25%)" in row and "(60%)" in row and "(15%)" in row and "1,500" in row
    assert not any("001-old" in line for line in lines)  # results from before the split: no row
    assert COLUMNS["predicted_latency_s"](point) == 0.012 and COLUMNS["predicted_waiting_s"]({"id": "x"}) is None
    assert row.endswith("| – | – | 1,500 |")  # no skew: no compute table

    trained = {"id": "002-digits", "predicted": {"seconds": 0.02, "latency_s": 0.0015, "compute": "measured",
                                                 "parts": {"bandwidth": 0.005, "latency": 0.010, "waiting": 0.001,
                                                           "skew": 0.004}}}
    [row] = [line for line in _attribution_lines({"points": [trained]}) if line.startswith("| 002-digits")]
    assert "(20%) | measured | – | 1,500 |" in row
    assert COLUMNS["predicted_skew_s"](trained) == 0.004 and COLUMNS["predicted_compute"](trained) == "measured"

    hashed = {"id": "003-bigraph", "predicted": {"seconds": 2.4, "planned_seconds": 1.2, "routes": "hashed",
                                                 "parts": {"bandwidth": 2.4, "latency": 0.0, "waiting": 0.0}}}
    [row] = [line for line in _attribution_lines({"points": [hashed]}) if line.startswith("| 003-bigraph")]
    assert row.endswith("| – | hashed | – |")  # over the paths its connections took
    assert COLUMNS["predicted_routes"](hashed) == "hashed" and COLUMNS["planned_s"](hashed) == 1.2


@pytest.mark.parametrize("content, says", [
    (b'{"labs": {"bcube-2-1 netns": {"tcp": {"alpha_s": -1, "pingpong_s": 0, "allreduce_s": 0, "cores": 2}}}}',
     "alpha_s: expected seconds"),
    (b"[" * 5_000_000, "larger than"),
])
def test_testbed_predict_reads_a_hostile_latency_file_in_bounded_memory_and_says_so_in_one_line(state, content, says):
    import resource

    state.mkdir()
    (state / "latency.json").write_bytes(content)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))

    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "predict", "bcube,2,1", "-a", "ring", "--size",
                           "19240B"], capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          env=os.environ | {"TESTBED_STATE": str(state), "COLUMNS": "400"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("warning: α left out: ") and says in line, line
    assert "α 0 µs" in done.stdout  # left out, and said so: not a guess
    assert sorted(p.name for p in state.iterdir()) == ["latency.json"]


def test_real_training_is_predicted_again_with_the_compute_its_workers_measured(state):
    """The digits MLP computes for real: the plan cannot know how long, so a run predicts its
    points again with each worker's measured compute. One worker computes 3 ms every
    iteration, the others 1 ms (the median): every synchronisation waits 2 ms more for it,
    and the model counts that as skew; the plan's figure is kept beside. A table with a worker's iteration missing
    leaves the plan's prediction as it was."""
    from orchestrator.experiment.runner import _predict_as_run, point_entry

    spec = load_experiment(Path(__file__).resolve().parents[2] / "experiments/digits.yaml")
    planned = make_plan(spec, "digits.yaml").points[0]  # ring on four workers
    workers = len(planned.layout.workers)
    records = [_record(rank, i, 0.003 if rank == 0 else 0.001, 100.0 + i) for i in range(spec.iterations)
               for rank in range(workers)]
    entry = point_entry(spec, planned)
    planned_s = entry["predicted"]["seconds"]
    _predict_as_run(spec, planned, records, entry, workers)
    predicted = entry["predicted"]
    assert predicted["compute"] == "measured" and predicted["entry"] == "measured"
    assert predicted["planned_seconds"] == planned_s
    assert predicted["parts"]["skew"] == pytest.approx(0.002, abs=2e-4)  # 3 ms against the median 1 ms
    assert predicted["seconds"] == pytest.approx(planned_s + predicted["parts"]["skew"], rel=1e-6)

    untouched = point_entry(spec, planned)
    _predict_as_run(spec, planned, records[1:], untouched, workers)
    assert untouched["predicted"] == point_entry(spec, planned)["predicted"]
    for bad in ("soon", float("nan"), None):  # a framework's records are read back: not trusted
        untouched = point_entry(spec, planned)
        _predict_as_run(spec, planned, [records[0] | {"start_time": bad}, *records[1:]], untouched, workers)
        assert untouched["predicted"] == point_entry(spec, planned)["predicted"], bad


def _record(rank: int, iteration: int, compute_s: float, start_time: float) -> dict:
    """An agent's record as the runner reads it: it entered the allreduce at `start_time`
    (Unix seconds) after computing for `compute_s`."""
    return {"rank": rank, "iteration": iteration, "compute_s": compute_s, "start_time": start_time}


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "rendezvous"])
def test_a_run_is_predicted_from_when_its_workers_entered(state, monkeypatch, eager):
    """Sending eagerly, halving-doubling keeps its ranks in step only by symmetry: started
    together, HDRM on bigraph 4×2 (1 MB, 50 Mbit) takes the busiest link's time; entered
    apart, as a run's agents do, a late rank's sends still cross while its partners' next
    steps start, and the skew grows. So a run is predicted again from when each worker
    entered its first iteration (no compute here: back to back). With the tcp transport's
    rendezvous a step waits for its receiver, and the ranks fall back in step. A ring on the
    same lab absorbs the same entries; and workers entering together change neither."""
    import dataclasses

    from orchestrator.agent import transports
    from orchestrator.experiment.runner import _predict_as_run, point_entry

    tcp = transports.get("tcp")
    monkeypatch.setitem(transports.TRANSPORTS, "tcp", dataclasses.replace(tcp, rendezvous=not eager))

    spec = load_experiment(Path(__file__).resolve().parents[2] / "experiments/bigraph-hdrm.yaml")
    plan = make_plan(spec, "bigraph-hdrm.yaml")
    hdrm, ring = (next(p for p in plan.points if p.point.algorithm.name == name and p.point.size_bytes == 2**20)
                  for name in ("hdrm", "ring"))
    late = [0.0, 0.040, 0.010, 0.0, 0.030, 0.005, 0.035, 0.020]  # seconds after the first, as measured: 0-40 ms

    def predicted(planned, offsets) -> dict:
        workers = len(planned.layout.workers)
        records = [_record(rank, i, 0.0, 100.0 + i + (offsets[rank] if i == 0 else 0.0))
                   for i in range(spec.iterations) for rank in range(workers)]
        entry = point_entry(spec, planned)
        _predict_as_run(spec, planned, records, entry, workers)
        return entry["predicted"]

    skewed, together = predicted(hdrm, late), predicted(hdrm, [0.0] * 8)
    assert skewed["entry"] == "measured" and skewed["planned_seconds"] == hdrm.prediction.per_run
    assert together["seconds"] == pytest.approx(hdrm.prediction.per_run, rel=0.01)
    if eager:
        assert skewed["seconds"] > 1.15 * hdrm.prediction.per_run, skewed  # the skew grew: 0.41 s against 0.31 s
        assert skewed["parts"]["skew"] == pytest.approx(skewed["seconds"] - hdrm.prediction.per_run, rel=0.05)
    else:
        assert skewed["seconds"] == pytest.approx(hdrm.prediction.per_run, rel=0.02), skewed
    assert predicted(ring, late)["seconds"] == pytest.approx(ring.prediction.per_run, rel=0.02)


def test_an_alpha_kept_by_other_agents_is_measured_again(state, monkeypatch):
    """α is the agents' own per-message cost: one kept by other agents (before an upgrade, or
    with the native data path where it is now off) is not used, nor is one kept before that
    was recorded (star,8 kept 155 µs from the Python data path); what these agents save is."""
    import json as json_lib

    from orchestrator.agent import native

    lab = lab_from_argument("bcube,2,1", **{"servers.runtime": "netns"})
    calibrate.save_latency(lab, "tcp", MEASURED)
    kept = json_lib.loads((state / "latency.json").read_text())["labs"]["bcube-2-1 netns"]["tcp"]
    assert kept["agents"] == calibrate.agents_fingerprint() and calibrate.latency_for(lab, "tcp") == (0.0015, 2, 0.0002)
    prints = set()
    for native_in_use in (True, False):
        monkeypatch.setattr(native, "available", lambda: native_in_use)
        prints.add(calibrate.agents_fingerprint())
    monkeypatch.undo()
    assert len(prints) == 2  # the same code on the other data path: other agents
    calibrate.save_latency(lab, "tcp", {**MEASURED, "agents": "0123456789abcdef"})  # another build's
    assert calibrate.latency_for(lab, "tcp") is None
    (state / "latency.json").write_text(json_lib.dumps({"labs": {"bcube-2-1 netns": {"tcp": MEASURED}}}))
    assert calibrate.latency_for(lab, "tcp") is None  # kept before the agents were recorded
    without_peers = {k: v for k, v in MEASURED.items() if k not in ("peer_s", "mesh_s")}
    calibrate.save_latency(lab, "tcp", without_peers)
    assert calibrate.latency_for(lab, "tcp") is None  # kept before the per-peer cost was measured


def test_each_further_peer_adds_its_cost_to_a_ranks_messages():
    # by hand: a mesh of 3 (each rank sends to both others in one step), then rank 3 sends to
    # rank 0: rank 0 has 3 peers (1, 2, 3), ranks 1 and 2 have 2, rank 3 has 1. α (a ring's:
    # two peers) = 0.1 s and 0.05 s per further peer: rank 0's α is 0.15, the others' 0.1; a
    # rank's j-th message of a step waits (j + 1)·α
    star = make_topology("star", servers=4)
    schedule = Schedule("by-hand", 4, 40)
    schedule.add_step([Transfer(0, 1, 0, 10, "reduce"), Transfer(0, 2, 10, 10, "reduce"),
                       Transfer(1, 0, 20, 10, "reduce"), Transfer(1, 2, 30, 10, "reduce"),
                       Transfer(2, 0, 0, 10, "reduce"), Transfer(2, 1, 10, 10, "reduce")])
    schedule.add_step([Transfer(3, 0, 20, 10, "reduce")])
    nodes = [s.name for s in star.servers]
    parts = [(Partition(0, 40, 0), schedule)]
    run = simulate(Routes(star), parts, nodes, Network(8e6, efficiency=1.0, latency=0.1, peer_latency=0.05), 2**30)
    leads = {(f.src, f.dst): f.lead for f in run.flows}
    assert leads == pytest.approx({(0, 1): 0.15, (0, 2): 0.3, (1, 0): 0.1, (1, 2): 0.2, (2, 0): 0.1,
                                   (2, 1): 0.2, (3, 0): 0.1})
    flat = simulate(Routes(star), parts, nodes, Network(8e6, efficiency=1.0, latency=0.1), 2**30)
    assert {(f.src, f.dst): f.lead for f in flat.flows} == pytest.approx(
        {(0, 1): 0.1, (0, 2): 0.2, (1, 0): 0.1, (1, 2): 0.2, (2, 0): 0.1, (2, 1): 0.2, (3, 0): 0.1})
    # and the prediction's latency part holds both costs: without either, it is the bytes'
    with_peers = predict_schedules(star, parts, nodes, Network(8e6, efficiency=1.0, latency=0.1, peer_latency=0.05),
                                   2**30, attribute=True)
    assert with_peers.parts["latency"] > predict_schedules(star, parts, nodes, Network(8e6, efficiency=1.0,
                                                           latency=0.1), 2**30, attribute=True).parts["latency"]
