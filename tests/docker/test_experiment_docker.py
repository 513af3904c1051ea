"""`testbed run` end to end with Docker containers as servers: a small experiment on star,4
leaves every file of the results directory (the Prometheus snapshot too), and no container,
lab or Prometheus behind. Lab ex-dock."""

from __future__ import annotations

import csv
import json
import subprocess
import time

import pytest

from orchestrator.emulation import cleanup, docker_engine, images
from tests.netns.test_experiment_run import ENV, MONITORED, PNG, TESTBED, live_labs, prometheus_of

EXPERIMENT = """
name: ex-dock
lab: {name: ex-dock, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit}, servers: {runtime: docker}}
agents: {via: nsenter, algorithms: [ring, mesh], workload: {kind: back-to-back, size: 2MB}}
iterations: 4
warmup: 1
faults:
  events:
    - {action: link-down, target: h1-sw, at_iteration: 2, for: 1s}
monitoring: true
"""


@pytest.fixture
def images_built():
    """Lab.up would build a missing image, from a debootstrap of minutes: a test does not."""
    if not (docker_engine.image_exists(images.SERVER) or docker_engine.image_exists(images.BASE)):
        reason = f"neither {images.SERVER} nor {images.BASE} is built: run `testbed images build` (or ./setup.sh)"
        print(f"SKIP: {reason}")
        pytest.skip(reason)


def test_a_docker_experiment_writes_every_file(tmp_path, images_built):
    experiment = tmp_path / "dock.yaml"
    experiment.write_text(EXPERIMENT)
    out = tmp_path / "out"
    started = time.monotonic()
    try:
        done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(out)], capture_output=True, text=True,
                              env=ENV, timeout=900)
    finally:
        cleanup.clean_lab("ex-dock")
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"docker experiment: {wall:.1f} s\n{done.stdout}")
    assert {p.name for p in out.iterdir()} == MONITORED
    assert "ex-dock" not in live_labs() and not prometheus_of("ex-dock")
    assert not docker_engine.lab_containers("ex-dock")

    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["labs"][0]["spec"]["servers"]["runtime"] == "docker"
    assert [p["algorithm"] for p in results["points"]] == ["ring", "mesh"]
    for point in results["points"]:
        assert point["status"] == "done" and point["verified"] is True, point.get("error")
        assert len(point["gst_s"]["per_iteration"]) == 4 and len(point["records"]) == 4 * 4
        assert 0.9 < point["ratio"] < 10 and min(point["faulted_iterations"]) >= 2
        assert {r["node"] for r in point["records"]} == {"h0", "h1", "h2", "h3"}
        [event] = point["fault_events"]
        assert event["applied"] is not None and event["undone"] >= event["applied"] and event["error"] is None
        assert sum(point["bytes_per_link"]["measured"].values()) >= 4 * 2 * 2**20  # 4 allreduces crossed the fabric
        # mesh on 4 containers sits near the band's edge on 2 cores: any verdict, with its reason
        fidelity = point["fidelity"]
        assert fidelity["verdict"] in ("ok", "degraded", "model off") and (fidelity["verdict"] == "ok") != bool(
            fidelity["reasons"]), fidelity

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["id"] for r in rows] == [p["id"] for p in results["points"]]
    assert len(list(csv.DictReader((out / "iterations.csv").open()))) == 2 * 4 * 4
    for png in ("gst.png", "iterations.png", "links.png"):
        assert (out / png).read_bytes().startswith(PNG)
    summary = (out / "summary.md").read_text()
    assert "status: **complete**" in summary and "docker" in summary and "link-down" in summary
    queries = json.loads((out / "prometheus/queries.json").read_text())["labs"]["ex-dock"]
    assert queries["dashboards"] and set(queries["points"]) == {p["id"] for p in results["points"]}
    snapshot = out / "prometheus/snapshot/ex-dock"
    assert any((p / "meta.json").is_file() for p in snapshot.iterdir()) or (snapshot / "chunks_head").is_dir()

    again = subprocess.run(TESTBED + ["report", str(out)], capture_output=True, text=True, env=ENV, timeout=120)
    assert again.returncode == 0 and (out / "summary.md").read_text() == summary, again.stderr


CRASH = """
name: ex-crash
lab: {name: ex-crash, topology: {kind: bcube, n: 2, k: 1}, links: {bandwidth: 100Mbit}, servers: {runtime: docker}}
agents: {via: nsenter, algorithms: [ring], workload: {kind: model, model: vgg19, scale: 0.01, compute: 50ms}}
iterations: 40
warmup: 1
faults:
  events:
    - {action: server-crash, target: h01, at_iteration: 5, for: 3s}
monitoring: false
"""


def test_a_crashed_container_rejoins_the_run_it_was_dropped_from(tmp_path, images_built):
    """docker kill mid-run: the survivors go on, the container restarts 3 s later, its agent
    is deployed again (a process of its own: experiment/rejoin.py) and rejoins at an
    iteration boundary; nothing lost or counted twice."""
    experiment = tmp_path / "crash.yaml"
    experiment.write_text(CRASH)
    out = tmp_path / "out"
    try:
        done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(out)], capture_output=True, text=True,
                              env=ENV, timeout=900)
    finally:
        cleanup.clean_lab("ex-crash")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "did not deploy" not in done.stderr + done.stdout, done.stderr[-2000:]
    [point] = json.loads((out / "results.json").read_text())["points"]
    assert point["status"] == "done", point.get("error")
    reasons = [epoch["reason"] for epoch in point["history"]]
    assert len(reasons) == 3, point["history"]
    assert reasons[1].startswith("h01 lost") and reasons[2] == "h01 rejoined", reasons
    assert point["checker"]["clean"] is True and point["checker"]["lost"] == 0, point["checker"]
    h01 = sorted(r["iteration"] for r in point["records"] if r["node"] == "h01")
    assert h01[-1] == 39 and point["history"][2]["first"] in h01
