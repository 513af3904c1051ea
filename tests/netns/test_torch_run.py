"""PyTorch's collectives on the lab through `testbed run` (issue 32 item 4): gloo's allreduce
beside the project's ring on an odd star, both priced by the model, in one results table;
DistributedDataParallel training the digits MLP on BCube(2,1), whose servers have two fabric
NICs. Nothing of torch outlives the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.emulation import cleanup
from orchestrator.frameworks import torch_gloo

ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "orchestrator.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

pytestmark = pytest.mark.skipif(torch_gloo.missing() is not None, reason=f"{torch_gloo.missing()}")


def _run(tmp_path: Path, experiment: dict) -> dict:
    path = tmp_path / f"{experiment['name']}.yaml"
    path.write_text(yaml.safe_dump(experiment))
    out = tmp_path / "out"
    try:
        done = subprocess.run(TESTBED + ["run", str(path), "--out", str(out)], capture_output=True, text=True, env=ENV,
                              timeout=900)
    finally:
        cleanup.clean_lab(experiment["lab"]["name"])
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    left = subprocess.run(["pgrep", "-f", "orchestrator.frameworks.torch_worker"], capture_output=True, text=True)
    assert left.stdout == "", f"torch workers left running: {left.stdout}"
    return json.loads((out / "results.json").read_text())


def test_gloo_beside_our_ring_on_an_odd_star(tmp_path):
    results = _run(tmp_path, {
        "name": "torch-star",
        "lab": {"name": "ex-torch5", "topology": {"kind": "star", "servers": 5}, "links": {"bandwidth": "100Mbit"},
                "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring", {"name": "ring", "framework": "torch"}],
                   "workload": {"kind": "back-to-back", "size": "2MB"}},
        "iterations": 5, "warmup": 1,
    })
    ours, theirs = results["points"]
    assert theirs["algorithm"] == "torch-ring" and theirs["framework"] == "torch"
    assert ours["status"] == theirs["status"] == "done", (ours.get("error"), theirs.get("error"))
    assert theirs["checker"]["clean"] is True, theirs["checker"]
    assert theirs["predicted"]["seconds"] == pytest.approx(ours["predicted"]["seconds"])
    assert {r["rank"] for r in theirs["records"]} == set(range(5)) and len(theirs["records"]) == 25
    # the gradient crossed the fabric: each server sent about 2 (n-1)/n of it per allreduce
    moved = sum(theirs["bytes_per_link"]["measured"].values())
    assert moved >= 0.9 * 5 * 2 * 4 / 5 * 2_000_000 * 5, moved
    print("gloo measured/predicted", theirs["ratio"], "ours", ours["ratio"])
    assert 0.85 <= theirs["ratio"] <= 1.25, theirs["ratio"]


def test_ddp_trains_the_digits_mlp_over_two_nics_per_server(tmp_path):
    results = _run(tmp_path, {
        "name": "torch-digits",
        "lab": {"name": "ex-torchd", "topology": {"kind": "bcube", "n": 2, "k": 1}, "links": {"bandwidth": "50Mbit"},
                "servers": {"runtime": "netns"}},
        "agents": {"algorithms": [{"name": "ring", "framework": "torch", "label": "ddp"}],
                   "workload": {"kind": "digits", "hidden": 32, "batch": 32}},
        "iterations": 15, "warmup": 1,
    })
    (point,) = results["points"]
    assert point["status"] == "done", point.get("error")
    assert point["checker"]["clean"] is True and "identical parameters after each of 15" in point["checker"]["summary"]
    losses = [r["loss"] for r in point["records"] if r["rank"] == 0]
    assert losses[-1] < 0.8 * losses[0], losses
