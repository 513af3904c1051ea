"""A user's algorithm, written in the test's own temporary directory and named only by the
experiment file's `plugins:`, run by `testbed run` on a netns lab: predicted, its checker
clean, its results beside a built-in's. Labs are ex-…"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup
from tests.unit.test_plugins import GATHER

ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def state(tmp_path):
    yield tmp_path / "state"
    cleanup.clean_lab("ex-plugin")


def test_testbed_run_runs_a_plugin_algorithm_with_its_prediction(tmp_path, state):
    (tmp_path / "algs").mkdir()
    (tmp_path / "algs" / "gather.py").write_text(GATHER.replace("NAME", "gather-bcast").replace("COPY", "copy"))
    experiment = tmp_path / "plugin.yaml"
    experiment.write_text(
        "name: plugin\nplugins: [algs/gather.py]\n"
        "lab: {name: ex-plugin, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit},"
        " servers: {runtime: netns}}\n"
        "agents: {via: nsenter, algorithms: [gather-bcast, ring], workload: {kind: tensors, tensors: [200000, 3001, 7]}}\n"
        "iterations: 4\nwarmup: 1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "TESTBED_STATE": str(state)}
    out = tmp_path / "results"
    done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    points = {p["algorithm"]: p for p in json.loads((out / "results.json").read_text())["points"]}
    assert set(points) == {"gather-bcast", "ring"}
    for name, point in points.items():
        assert point["status"] == "done" and point["checker"]["clean"] is True, (name, point["checker"])
        assert point["predicted"]["seconds"] > 0 and point["ratio"] > 0
        assert point["fidelity"]["verdict"] in ("ok", "model off", "degraded"), point["fidelity"]
    # rank 0's NIC carries three gradients in and the sums out: the model says it is ~3/1.5 × ring
    assert points["gather-bcast"]["predicted"]["seconds"] > 1.5 * points["ring"]["predicted"]["seconds"]
    assert points["gather-bcast"]["sync_s"]["fault_free_mean"] > 1.5 * points["ring"]["sync_s"]["fault_free_mean"]
