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
from orchestrator.cost import Network, predict
from orchestrator.cost.latency import fit_alpha
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate
from orchestrator.errors import BadUsage
from orchestrator.experiment import calibrate
from orchestrator.experiment.plan import make_plan
from orchestrator.spec import lab_from_argument
from orchestrator.spec.experiment import load_experiment
from tests.unit.conftest import make_topology

MEASURED = {"alpha_s": 0.0015, "pingpong_s": 0.001, "allreduce_s": 0.009}


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_ranks_messages_of_one_step_wait_alpha_each_in_turn():
    # by hand: h0 sends 4000 B to h1 and 4000 B to h2 in one step over its one uplink
    # (1000 B/s payload), α = 0.1 s. The first waits α and runs alone till 2α = 0.2 s (100 B);
    # then both share the uplink at 500 B/s: the first's 3900 B end at 0.2 + 7.8 = 8.0 s, the
    # second has 100 B left and the link to itself: 8.1 s
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 2000)
    schedule.add_step([Transfer(0, 1, 0, 1000, "reduce"), Transfer(0, 2, 1000, 1000, "reduce")])
    run = simulate(Routes(star), [(Partition(0, 2000, 0), schedule)], [s.name for s in star.servers],
                   Network(8000, efficiency=1.0, latency=0.1), 2**30)
    first, second = run.flows
    assert first.lead == pytest.approx(0.1) and second.lead == pytest.approx(0.2)
    assert first.finished == pytest.approx(8.0)
    assert run.seconds == pytest.approx(8.1)


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
    assert calibrate.latency_for(lab, "tcp") == 0.0015 and calibrate.latency_for(lab, "grpc") is None
    docker = lab.model_copy(update={"servers": lab.servers.model_copy(update={"runtime": "docker"})})
    assert calibrate.latency_for(docker, "tcp") == 0.0015  # the same topology under the other runtime
    other = lab_from_argument("star,4", **{"servers.runtime": "netns"})
    assert calibrate.latency_for(other, "tcp") is None
    with_alpha = make_plan(spec).points
    for before, after in zip(without, with_alpha):
        assert after.prediction.network.latency == 0.0015
        assert after.prediction.per_run > before.prediction.per_run + 2 * 0.0015  # every step pays it
    calibrate.save_latency(lab, "grpc", {**MEASURED, "alpha_s": 0.003})  # beside, not instead
    assert calibrate.latency_for(lab, "tcp") == 0.0015 and calibrate.latency_for(lab, "grpc") == 0.003


@pytest.mark.parametrize("content, field", [
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": -1, "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": "1", "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 1e308, "pingpong_s": 0, "allreduce_s": 0}}}}', "alpha_s"),
    ('{"labs": {"star-4 netns": {"tcp": {"alpha_s": 0.001, "allreduce_s": 0}}}}', "pingpong_s"),
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
    assert measured["network"]["latency"] == 0.0015
    assert given["network"]["latency"] == 0
    assert measured["seconds"] > given["seconds"] + 6 * 0.0015 * 0.9
