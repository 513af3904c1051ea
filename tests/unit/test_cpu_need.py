"""Capacity planning: the CPU an allreduce needs of this machine (cost/cpu.py) from a
calibration, and how `testbed predict` and `run --dry-run` show it. The calibration here
is written by the test (in its own state directory); `testbed calibrate` measuring a real
one is tested in tests/netns/test_calibrate.py."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.cost.cpu import Calibration, cpu_need
from orchestrator.cost.report import predict_lab
from orchestrator.spec import lab_from_argument
from orchestrator.topology import build

GB = 1e9


def _calibration(hop: float = 0.5, agent: float = 1.0, cores: int = 2) -> Calibration:
    return Calibration(cores, hop / GB, {"tcp": agent / GB, "grpc": 2 * agent / GB}, 1e9)


def _prediction(argument: str, rate: str, algorithm: str = "ring", size: int = 50 * 2**20):
    spec = lab_from_argument(argument, **{"links.bandwidth": rate})
    return spec, predict_lab(spec, algorithm, size).prediction


def test_the_need_is_the_bytes_on_links_and_from_servers_over_the_time():
    spec, prediction = _prediction("star,8", "1Gbit")
    servers = {s.name for s in build(spec.topology).servers}
    need = cpu_need(prediction, _calibration(), "tcp", servers, 0.2)
    hops = sum(link.bytes for link in prediction.links)
    sent = sum(link.bytes for link in prediction.links if link.link.split("→")[0] in servers)
    assert sent == pytest.approx(hops / 2)  # a star: every byte goes up to the switch and down again
    assert need.cores == pytest.approx((hops * 0.5 + sent * 1.0) / GB / prediction.seconds)
    assert need.available == pytest.approx(1.6)
    # a transport that costs more needs more
    assert cpu_need(prediction, _calibration(), "grpc", servers, 0.2).cores > need.cores


def test_the_highest_ok_rate_scales_with_the_link_and_is_where_the_need_meets_the_cores():
    spec, slow = _prediction("star,8", "100Mbit")
    _, fast = _prediction("star,8", "1Gbit")
    servers = {s.name for s in build(spec.topology).servers}
    at_slow = cpu_need(slow, _calibration(), "tcp", servers, 0.2)
    at_fast = cpu_need(fast, _calibration(), "tcp", servers, 0.2)
    assert at_fast.cores == pytest.approx(10 * at_slow.cores, rel=0.01)  # bandwidth-bound: t ∝ 1/rate
    assert at_slow.max_rate == pytest.approx(at_fast.max_rate, rel=0.01)  # one machine, one limit
    _, at_limit = _prediction("star,8", f"{int(at_slow.max_rate)}bit")
    assert cpu_need(at_limit, _calibration(), "tcp", servers, 0.2).share == pytest.approx(1.0, rel=0.01)
    assert at_slow.fits and not at_fast.fits or at_slow.max_rate > 1e9


def test_an_uncalibrated_transport_is_named():
    spec, prediction = _prediction("star,4", "1Gbit")
    with pytest.raises(KeyError, match="rdma was not calibrated"):
        cpu_need(prediction, _calibration(), "rdma", {"h0"}, 0.2)


@pytest.mark.parametrize("raw, field", [
    ([], "object"), ({"cores": 2}, "agent_core_s_per_gb"),
    ({"cores": 0, "hop_core_s_per_gb": 1, "agent_core_s_per_gb": {"tcp": 1}, "rate_bit_s": 1e9}, "cores"),
    ({"cores": 2, "hop_core_s_per_gb": float("nan"), "agent_core_s_per_gb": {"tcp": 1}, "rate_bit_s": 1e9}, "hop"),
    ({"cores": 2, "hop_core_s_per_gb": 1, "agent_core_s_per_gb": {"tcp": -1}, "rate_bit_s": 1e9}, "agent_core_s_per_gb.tcp"),
    ({"cores": 2, "hop_core_s_per_gb": 1, "agent_core_s_per_gb": {"tcp": "1"}, "rate_bit_s": 1e9}, "agent_core_s_per_gb.tcp"),
])
def test_a_calibration_file_read_back_is_checked_field_by_field(raw, field):
    with pytest.raises(ValueError, match=field):
        Calibration.from_json(raw)


def test_a_calibration_round_trips():
    calibration = _calibration()
    again = Calibration.from_json(json.loads(json.dumps(calibration.to_json())))
    assert again.cores == 2 and math.isclose(again.hop, calibration.hop) and again.agent.keys() == {"tcp", "grpc"}


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path))
    return tmp_path


def test_predict_says_the_machine_is_not_calibrated_and_how_to_fix_it(state):
    result = CliRunner().invoke(app, ["predict", "star,8", "-a", "ring", "--bandwidth", "1Gbit"])
    assert result.exit_code == 0, result.output
    assert "CPU: not known: this machine has not been calibrated: run `testbed calibrate`" in result.output


def test_predict_and_the_dry_run_show_the_need_and_the_rate_that_stays_ok(state, tmp_path):
    (state / "calibration.json").write_text(json.dumps(_calibration().to_json()))
    result = CliRunner().invoke(app, ["predict", "star,8", "-a", "ring", "--bandwidth", "10Gbit"])
    assert result.exit_code == 0, result.output
    assert "too much for this machine" in result.output and "ok up to" in result.output
    result = CliRunner().invoke(app, ["predict", "star,8", "-a", "ring", "--bandwidth", "10Mbit", "--json"])
    cpu = json.loads(result.output)["cpu"]
    assert cpu["fits"] and cpu["cores"] < cpu["available_cores"] and cpu["max_rate_bit_s"] > 10e6
    experiment = tmp_path / "e.yaml"
    experiment.write_text("name: e\nlab: {name: e, topology: {kind: star, servers: 4}, links: {bandwidth: 10Gbit}, "
                          "servers: {runtime: netns}}\niterations: 2\n"
                          "agents: {algorithms: [ring], workload: {kind: back-to-back, size: 32MB}}\n")
    result = CliRunner().invoke(app, ["run", str(experiment), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "ok up to" in result.output and "(too much)" in result.output


def test_an_unknown_transport_is_one_line():
    result = CliRunner().invoke(app, ["predict", "star,8", "-a", "ring", "--transport", "pigeon"])
    assert result.exit_code != 0
    assert str(result.exception) == "--transport: unknown transport 'pigeon': one of grpc, rdma, tcp"


AUTO = ("name: e\nlab: {name: e, topology: {kind: bcube, n: 4, k: 1}, links: {bandwidth: auto}, "
        "servers: {runtime: netns}}\niterations: 2\n"
        "agents: {algorithms: [ring, hips], workload: {kind: back-to-back, size: 32MB}}\n")


def test_bandwidth_auto_picks_the_highest_rate_every_point_carries(state, tmp_path):
    from orchestrator.experiment.plan import make_plan
    from orchestrator.experiment import calibrate
    from orchestrator.spec.experiment import load_experiment

    (state / "calibration.json").write_text(json.dumps(_calibration().to_json()))
    experiment = tmp_path / "auto.yaml"
    experiment.write_text(AUTO)
    plan = make_plan(load_experiment(experiment), str(experiment))
    needs = calibrate.plan_needs(plan)
    assert plan.auto_rate == plan.spec.lab.links.bandwidth
    assert all(cpu.fits for cpu in needs.values())
    assert max(cpu.share for cpu in needs.values()) > 0.9  # the highest such rate (2 figures, rounded down)
    result = CliRunner().invoke(app, ["run", str(experiment), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "links.bandwidth: auto →" in result.output


def test_bandwidth_auto_without_a_calibration_is_one_line(state, tmp_path):
    from orchestrator.errors import SpecError
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import load_experiment

    experiment = tmp_path / "auto.yaml"
    experiment.write_text(AUTO)
    with pytest.raises(SpecError, match=r"lab.links.bandwidth: auto needs this machine's calibration: .*testbed calibrate"):
        make_plan(load_experiment(experiment), str(experiment))
