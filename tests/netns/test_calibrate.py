"""`testbed calibrate` for real: a star,4 netns lab, iperf3 and the agents' ring measured,
the result kept where `predict` reads it (this test's own state directory); then an
experiment with `links.bandwidth: auto` run on a lab at the rate that calibration picks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.units import parse_rate


def _testbed(*args: str, state) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=os.environ | {"TESTBED_STATE": str(state)}, timeout=600)


def test_calibrate_then_predict_knows_the_cpu_a_run_needs_and_bandwidth_auto_runs_at_its_rate(tmp_path):
    done = _testbed("calibrate", "--transports", "tcp,grpc", state=tmp_path)
    assert done.returncode == 0, done.stderr
    kept = json.loads((tmp_path / "calibration.json").read_text())
    assert kept["cores"] == os.cpu_count()
    assert 0 < kept["hop_core_s_per_gb"] < 100
    agent = kept["agent_core_s_per_gb"]
    assert set(agent) == {"tcp", "grpc"} and all(0 <= v < 100 for v in agent.values())
    # α per transport on the calibration lab, kept where runs and predictions read it
    alpha = json.loads((tmp_path / "latency.json").read_text())["labs"]["star-4 netns"]
    assert set(alpha) == {"tcp", "grpc"} and all(0 < a["alpha_s"] < 0.1 and a["pingpong_s"] > 0 for a in alpha.values())
    assert all(0 < a["cpu_idle_share"] <= 1 for a in alpha.values())  # how busy the machine was meanwhile
    assert "α on star-4 netns over tcp" in done.stdout
    predicted = _testbed("predict", "star,8", "-a", "ring", "--bandwidth", "100Mbit", "--json", state=tmp_path)
    assert predicted.returncode == 0, predicted.stderr
    cpu = json.loads(predicted.stdout)["cpu"]
    assert cpu["available_cores"] == os.cpu_count() * 0.8 and cpu["cores"] > 0
    faster = json.loads(_testbed("predict", "star,8", "-a", "ring", "--bandwidth", "1Gbit", "--json",
                                 state=tmp_path).stdout)["cpu"]
    assert faster["cores"] > 5 * cpu["cores"]
    assert abs(faster["max_rate_bit_s"] / cpu["max_rate_bit_s"] - 1) < 0.05

    # `links.bandwidth: auto` on a lab: the run picks the highest rate the calibration says
    # this machine carries, says so, and the lab's links carry that rate (a ring's busbw is
    # bounded by it, and shaped far below it the bound would be far from met)
    experiment = tmp_path / "auto.yaml"
    experiment.write_text("name: auto\nlab: {name: ex-auto, topology: {kind: star, servers: 4}, links: {bandwidth: auto}, "
                          "servers: {runtime: netns}}\niterations: 4\nwarmup: 1\n"
                          "agents: {via: nsenter, algorithms: [ring], workload: {kind: back-to-back, size: 16MB}}\n")
    try:
        run = _testbed("run", str(experiment), "--out", str(tmp_path / "out"), state=tmp_path)
    finally:  # a run killed by the timeout leaves its lab: its journal is in this state directory
        _testbed("clean", "ex-auto", state=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    point, = json.loads((tmp_path / "out" / "results.json").read_text())["points"]
    assert point["status"] == "done" and point["verified"]
    rate = parse_rate(point["link_rate"])
    assert f"links.bandwidth: auto → {point['link_rate']}" in run.stderr, run.stderr[-2000:]
    busbw = point["busbw_bytes_per_s"] * 8
    print(f"bandwidth auto: {point['link_rate']}, ring busbw {busbw / 1e6:.0f} Mbit/s, ratio {point['ratio']:.3f}, "
          f"verdict {point['fidelity']['verdict']}, CPU idle {point['fidelity'].get('cpu_idle_share')}")
    assert 10e6 < rate <= 100e9
    assert 0.5 * rate < busbw <= 1.0 * rate
