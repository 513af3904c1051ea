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
    # one plan for both; each predicted again from when its own workers entered
    assert theirs["predicted"]["planned_seconds"] == pytest.approx(ours["predicted"]["planned_seconds"])
    assert theirs["predicted"]["entry"] == ours["predicted"]["entry"] == "measured"
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
    # judged as the agents' points are: with the super-packets its servers' NICs were sized to
    fidelity = point["fidelity"]
    assert 0 < fidelity["smallest_transfer_bytes"] <= fidelity["super_packet_bytes"], fidelity


def _bytes(lab, node: str, nic: str) -> tuple[int, int]:
    """(sent, received) bytes of a NIC of `node`, from /proc/net/dev as the node's own network sees it."""
    read = lab.exec(node, ["cat", "/proc/net/dev"])
    for line in read.stdout.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == nic:
            fields = counters.split()
            return int(fields[8]), int(fields[0])
    raise AssertionError(f"{node} has no NIC {nic}: {read.stdout}")


def test_torch_moves_its_bytes_on_the_fabric_and_none_on_the_management_network(make_lab):
    """The workers bind to the fabric NICs and meet over the fabric: after an all_reduce of
    4 MB on three servers each fabric NIC has sent at least its share of the ring, and no
    server has sent a byte on the management network (no agents are deployed on this lab)."""
    from types import SimpleNamespace

    from orchestrator import frameworks

    lab = make_lab("star,3", name="tbytes", **{"servers.runtime": "netns", "links.bandwidth": "100Mbit"})
    nodes = ["h0", "h1", "h2"]
    fabric = {n: lab.topology.nodes[n].data_nics()[0].name for n in nodes}
    before = {n: (_bytes(lab, n, fabric[n]), _bytes(lab, n, "mgmt0")) for n in nodes}
    job = frameworks.Job(lab, nodes, [1_000_000], SimpleNamespace(kind="back-to-back"), None, 3, timeout=120)
    result = torch_gloo.run(job)
    assert result.checker["clean"] is True
    for n in nodes:
        (ftx, frx), (mtx, mrx) = _bytes(lab, n, fabric[n]), _bytes(lab, n, "mgmt0")
        sent = ftx - before[n][0][0]
        assert sent >= 3 * 2 * 2 / 3 * 4_000_000, (n, sent)  # 3 allreduces of 2(n-1)/n of 4 MB each
        # the server sent nothing there; what it heard is the bridge's own chatter (a few
        # hundred bytes of broadcasts), not a gradient
        assert mtx - before[n][1][0] == 0 and mrx - before[n][1][1] < 4096, (n, mtx, mrx, before[n])
