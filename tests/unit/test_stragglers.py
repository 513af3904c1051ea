"""Stragglers (issue 32 item 2): a workload's compute as a distribution or a per-rank list,
drawn per worker and iteration, handed to the agents, recorded and predicted with."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.agent import workload as agent_workload
from orchestrator.experiment import workloads
from orchestrator.spec.compute import ComputeSpec
from orchestrator.spec.experiment import TensorsWorkload


def tensors(compute) -> TensorsWorkload:
    return TensorsWorkload.model_validate({"kind": "tensors", "tensors": [1000], "compute": compute})


def test_a_duration_is_every_ranks_compute_as_before():
    spec = tensors("50ms")
    assert spec.compute.seconds == 0.05 and not spec.compute.varies
    drawn = workloads.drawn_compute(spec, 4, 3)
    assert workloads.build(spec, [1000], 4, drawn) == {"kind": "emulated", "tensors": [1000], "compute_seconds": 0.05}
    assert workloads.drawn_compute(spec, 4, 3) is None
    assert tensors({"per_rank": ["20ms"] * 3}).compute.varies is False  # all alike: no skew


@pytest.mark.parametrize("compute", [
    "50ms", {"distribution": "lognormal", "mean": "50ms", "sd": "20ms", "seed": 3},
    {"per_rank": ["10ms", "30ms"], "distribution": "normal", "sd": "1ms"}])
def test_a_dump_reads_back_the_same(compute):
    spec = tensors(compute)
    again = TensorsWorkload.model_validate(spec.model_dump(mode="json"))
    assert again == spec


def test_draws_are_seeded_per_worker_and_iteration_and_have_the_asked_mean_and_sd():
    spec = ComputeSpec.model_validate({"distribution": "lognormal", "mean": "50ms", "sd": "20ms", "seed": 7})
    table = np.array(spec.draw(8, 4000))
    assert table.shape == (4000, 8) and (table > 0).all()
    assert table.mean() == pytest.approx(0.05, rel=0.02) and table.std() == pytest.approx(0.02, rel=0.05)
    assert spec.draw(8, 4000) == table.tolist()  # the same file draws the same times
    other = ComputeSpec.model_validate({"distribution": "lognormal", "mean": "50ms", "sd": "20ms", "seed": 8})
    assert other.draw(8, 4000) != table.tolist()
    assert len({tuple(row) for row in table[:10]}) == 10 and len(set(table[0])) == 8  # per iteration, per rank
    normal = np.array(ComputeSpec.model_validate({"distribution": "normal", "mean": "1ms", "sd": "2ms"}).draw(4, 1000))
    assert normal.min() == 0.0 and (normal >= 0).all()  # below 0 counts as 0


def test_per_rank_means_with_noise_around_each():
    spec = ComputeSpec.model_validate({"per_rank": ["10ms", "80ms"], "distribution": "normal", "sd": "1ms"})
    table = np.array(spec.draw(2, 2000))
    assert table[:, 0].mean() == pytest.approx(0.010, abs=2e-4) and table[:, 1].mean() == pytest.approx(0.080, abs=2e-4)
    assert spec.seconds == pytest.approx(0.045)
    with pytest.raises(ValueError, match="per_rank lists 2 times for 3 workers"):
        spec.draw(3, 1)


@pytest.mark.parametrize("compute,message", [
    ({"mean": "50ms", "sd": "5ms"}, "sd needs distribution"),
    ({"mean": "50ms", "per_rank": ["1ms"]}, "give mean or per_rank"),
    ({"distribution": "gamma", "mean": "5ms"}, "distribution"),
    ({"mean": "-5ms"}, "not a number with a unit"),
    ({"mean": "7200s"}, "out of range"),
    ({"mean": "2h"}, "unknown time unit"),
    ({"mean": "5ms", "speed": 2}, "speed"),
    ({"per_rank": []}, "per_rank"),
])
def test_bad_compute_is_one_clear_error(compute, message):
    with pytest.raises(ValidationError, match=message):
        tensors(compute)


def test_the_workers_get_their_own_draws_and_the_agent_waits_each_iterations():
    spec = tensors({"per_rank": ["10ms", "20ms", "30ms"]})
    built = workloads.build(spec, [1000], 3, workloads.drawn_compute(spec, 3, 4))
    assert [w["compute_seconds"] for w in built] == [[0.01] * 4, [0.02] * 4, [0.03] * 4]
    lognormal = tensors({"distribution": "lognormal", "mean": "50ms", "sd": "20ms"})
    drawn = workloads.drawn_compute(lognormal, 3, 4)
    built = workloads.build(lognormal, [1000], 3, drawn)
    assert [[w["compute_seconds"][i] for w in built] for i in range(4)] == drawn
    assert [agent_workload.compute_seconds(built[1], i) for i in range(4)] == [row[1] for row in drawn]
    assert agent_workload.compute_seconds({"compute_seconds": 0.25}, 9) == 0.25
    assert agent_workload.compute_seconds({}, 0) == 0.0


def test_too_many_draws_are_refused_before_drawing():
    spec = ComputeSpec.model_validate({"distribution": "normal", "mean": "5ms", "sd": "1ms"})
    with pytest.raises(ValueError, match="more compute times"):
        spec.draw(4096, 100_000)


def test_median_of_a_row_is_what_results_subtract():
    # the prediction subtracts each iteration's median worker compute, as results.sync_times does
    row = ComputeSpec.model_validate({"per_rank": ["10ms", "20ms", "90ms"]}).draw(3, 1)[0]
    assert statistics.median(row) == 0.02


# -- predicted with the draws --------------------------------------------------------------------
def plan_of(compute, servers: int = 2, iterations: int = 6, warmup: int = 1):
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "skew", "lab": {"name": "skew", "topology": {"kind": "star", "servers": servers},
                                "links": {"bandwidth": "100Mbit"}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring"], "workload": {"kind": "tensors", "tensors": [25_000], "compute": compute}},
        "iterations": iterations, "warmup": warmup})
    return make_plan(spec, "skew.yaml")


def test_one_slow_worker_costs_its_extra_compute_over_the_median():
    assert plan_of({"per_rank": ["0ms", "100ms"]}).points[0].compute == [[0.0, 0.1]] * 6  # drawn once, kept
    even = plan_of("50ms").points[0].prediction
    assert "skew" not in even.parts  # no stragglers: the prediction as it always was
    # 2 workers, 0 and 100 ms: each iteration waits for the slow one's 100 ms, and results
    # subtract the median worker's 50 ms, so 50 ms per synchronisation is the skew's
    skewed = plan_of({"per_rank": ["0ms", "100ms"]}).points[0].prediction
    alone = plan_of("0ms").points[0].prediction
    assert skewed.parts["skew"] == pytest.approx(0.05, abs=0.1 * alone.per_run)
    assert skewed.per_run == pytest.approx(alone.per_run + skewed.parts["skew"])
    assert sum(skewed.parts.values()) == pytest.approx(skewed.per_run)
    # every worker as slow: no skew, whatever the compute
    assert plan_of({"per_rank": ["100ms", "100ms"]}).points[0].prediction.per_run == pytest.approx(even.per_run)


def test_a_lognormal_skew_costs_the_expected_maximum_less_the_median():
    spec = {"distribution": "lognormal", "mean": "50ms", "sd": "25ms", "seed": 2}
    prediction = plan_of(spec, servers=4, iterations=30, warmup=2).points[0].prediction
    table = ComputeSpec.model_validate(spec).draw(4, 30)[2:]
    expected = statistics.fmean(max(row) - statistics.median(row) for row in table)
    # the allreduce is short beside the compute: the skew is what the slowest adds each time
    assert prediction.parts["skew"] == pytest.approx(expected, rel=0.15)


def test_per_rank_of_the_wrong_length_is_one_line_naming_the_field():
    from orchestrator.errors import SpecError

    with pytest.raises(SpecError, match=r"skew.yaml: agents.workload.compute: per_rank lists 3 times for 2 workers"):
        plan_of({"per_rank": ["1ms", "2ms", "3ms"]})


def test_server_slow_needs_a_share_of_a_core():
    from orchestrator.errors import FaultError
    from orchestrator.faults.actions import action, parse_params

    slow = action("server-slow")
    assert parse_params(slow, {"cpus": "0.25"}) == {"cpus": 0.25}
    with pytest.raises(FaultError, match=r"server-slow needs --cpus"):
        parse_params(slow, {})
    with pytest.raises(FaultError, match=r"server-slow --cpus: cpus is a share of one core from 0.01"):
        parse_params(slow, {"cpus": "0"})
    with pytest.raises(FaultError, match=r"server-slow does not take --rate"):
        parse_params(slow, {"cpus": "0.5", "rate": "1Mbit"})


def test_the_dry_run_says_what_the_skew_adds(tmp_path):
    import os
    import subprocess
    import sys

    import yaml

    path = tmp_path / "skew.yaml"
    path.write_text(yaml.safe_dump({
        "name": "skew", "lab": {"name": "skew", "topology": {"kind": "star", "servers": 4},
                                "links": {"bandwidth": "100Mbit"}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring"], "workload": {"kind": "tensors", "tensors": [250_000], "compute": {
            "per_rank": ["10ms", "10ms", "10ms", "60ms"]}}}, "iterations": 4}))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--dry-run"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("stragglers:"))
    added = float(line.split("the skew adds ")[1].split(" ms")[0])
    assert 45 <= added <= 55, line  # the slow worker's 60 ms over the median's 10 ms
