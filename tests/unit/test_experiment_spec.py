"""Experiment files: one-line errors naming the file and field, sweeps expanded as written,
the plan's predictions equal to `testbed predict`'s, and `testbed run --dry-run` without root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.cost.report import predict_lab
from orchestrator.errors import SpecError
from orchestrator.experiment.plan import make_plan
from orchestrator.experiment.sweep import expand, variants
from orchestrator.spec.experiment import load_experiment
from orchestrator.spec.lab import LabSpec

ROOT = Path(__file__).resolve().parents[2]
BASE = """
name: ex-unit
lab: {name: ex-unit, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit}, servers: {runtime: netns}}
agents:
  algorithms: [ring, {name: ps, label: ps-h3, options: {shards: 1}, ps: [h3]}]
  workload: {kind: back-to-back, size: 1MB}
iterations: 3
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(SpecError) as caught:
        make_plan(load_experiment(path), str(path))
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("change, expected", [
    ("iterations: 0", "exp.yaml: iterations: must lie between 1 and 100000"),
    ("iteratons: 3", "exp.yaml: iteratons: unknown key; did you mean 'iterations'?"),
    ("agents: {algorithms: [rign], workload: {kind: back-to-back, size: 1MB}}",
     "exp.yaml: agents.algorithms.0.name: 'rign' is no algorithm"),
    ("agents: {algorithms: [ring], workload: {kind: backtoback, size: 1MB}}",
     "exp.yaml: agents.workload.kind: unknown kind 'backtoback'"),
    ("agents: {algorithms: [ring], workload: {kind: model, model: vgg19}}",
     "exp.yaml: agents.workload: give exactly one of scale (e.g. 0.1) and size"),
    ("agents: {algorithms: [ring, ring], workload: {kind: back-to-back, size: 1MB}}",
     "ring is listed twice: give each a distinct label"),
    ("agents: {algorithms: [ring], workload: {kind: digits}}\nsweep: {sizes: [1MB]}",
     "exp.yaml: sweep.sizes: the digits workload has a fixed size"),
    ("sweep: {link_rates: [5bit]}", "exp.yaml: sweep.link_rates"),
    ("sweep: {topologies: [star]}", "star takes 1 numbers: star,SERVERS (in a [...] list, quote it"),
    ("sweep: {topologies: [{kind: bcube, n: 1, k: 1}]}", "n: input should be greater than or equal to 2"),
    ("warmup: 3", "warmup (3) must be less than iterations (3)"),
    ("agents: {algorithms: [{name: ps, ps: [h9]}], workload: {kind: back-to-back, size: 1MB}}",
     "exp.yaml: agents.algorithms: ps: ps: h9 is no server of star-4"),
    ("agents: {algorithms: [hips], workload: {kind: back-to-back, size: 1MB}}",
     "exp.yaml: run 000-star-4-100mbit-1mib-hips: hips cannot run on star-4"),
    ("faults: {events: [{action: link-down, target: h0-h1, at: 1s}]}", "exp.yaml: faults.events.0"),
    ("faults: {events: [{action: explode, target: h0, at: 1s}]}", "exp.yaml: faults.events.0.action: 'explode' is no fault action"),
])
def test_a_bad_experiment_is_one_line_naming_file_and_field(tmp_path, change, expected):
    key = change.split(":")[0]
    text = "\n".join(line for line in BASE.splitlines() if not line.startswith(key + ":")
                     and not (key == "agents" and line.startswith("  "))) + "\n" + change + "\n"
    assert expected.lower() in error_of(write(tmp_path, text)).lower()


def test_a_lab_file_is_read_relative_to_the_experiment_and_its_errors_name_it(tmp_path):
    (tmp_path / "labs").mkdir()
    write(tmp_path, "name: ex-file\ntopology: {kind: star, servers: 3}\n", "labs/lab.yaml")
    spec = load_experiment(write(tmp_path, BASE.replace(BASE.splitlines()[2], "lab: labs/lab.yaml")))
    assert spec.lab.name == "ex-file" and spec.lab.topology.servers == 3
    write(tmp_path, "name: ex-file\ntopology: {kind: star, servers: 0}\n", "labs/lab.yaml")
    assert "labs/lab.yaml: topology.servers: must lie between 1 and 4000" in error_of(tmp_path / "exp.yaml")


def test_sweeps_expand_as_written(tmp_path):
    path = write(tmp_path, BASE + textwrap.dedent("""
        sweep:
          topologies: ["star,4", {kind: star, servers: 5}]
          link_rates: [100Mbit, 1Gbit]
          sizes: [1MB, 3MB]
        """))
    spec = load_experiment(path)
    points = expand(spec)
    # topologies, then rates, then sizes, then algorithms: the order written
    expected = [(t, r, s, a) for t in ("star-4", "star-5") for r in ("100Mbit", "1Gbit")
                for s in (1 << 20, 3 << 20) for a in ("ring", "ps-h3")]
    assert [(p.variant.topology, p.variant.link_rate, p.size_bytes, p.algorithm.key) for p in points] == expected
    assert len({p.id for p in points}) == len(points)
    assert points[0].id == "000-star-4-100mbit-1mib-ring" and points[-1].id == "015-star-5-1gbit-3mib-ps-h3"
    labs = variants(spec)
    assert [v.lab.name for v in labs] == ["ex-unit-v0", "ex-unit-v1", "ex-unit-v2", "ex-unit-v3"]
    assert [v.lab.links.bandwidth for v in labs] == [100_000_000, 1_000_000_000] * 2
    assert all(isinstance(v.lab, LabSpec) and v.lab.servers.runtime == "netns" for v in labs)
    assert expand(spec) == points  # deterministic


def test_the_plan_predicts_what_testbed_predict_does(tmp_path):
    path = write(tmp_path, BASE + "sweep: {sizes: [1MB, 4MB]}\n")
    plan = make_plan(load_experiment(path), str(path))
    ring = [p for p in plan.points if p.point.algorithm.key == "ring"]
    for planned in ring:
        report = predict_lab(planned.point.lab, "ring", planned.size_bytes, chunk_bytes=lambda s, c: __import__(
            "orchestrator.agent.plan", fromlist=["chunk_bytes"]).chunk_bytes(s, c))
        assert planned.prediction.seconds == pytest.approx(report.prediction.seconds)
    assert ring[1].prediction.seconds > 3 * ring[0].prediction.seconds  # 4× the bytes
    ps = [p for p in plan.points if p.point.algorithm.key == "ps-h3"][0]
    assert ps.layout.workers == ("h0", "h1", "h2") and ps.layout.servers == ("h3",)


def test_a_model_size_picks_its_scale(tmp_path):
    path = write(tmp_path, BASE.replace("{kind: back-to-back, size: 1MB}", "{kind: model, model: vgg19, size: 8MB}"))
    plan = make_plan(load_experiment(path), str(path))
    assert plan.points[0].size_bytes == pytest.approx(8 << 20, rel=0.001)
    assert len(plan.points[0].tensors) == 38  # vgg19's layout kept


@pytest.fixture
def shared_dir():
    """A fresh directory an unprivileged user can read (pytest's tmp_path is root's alone)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="testbed-dry-run-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_dry_run_needs_no_root(shared_dir):
    """As an unprivileged user (nobody), the plan and its predictions print and nothing is built."""
    tmp_path = shared_dir
    if os.geteuid() != 0:
        command = []
    else:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    path = write(tmp_path, BASE + "sweep: {link_rates: [100Mbit, 200Mbit]}\n")
    path.chmod(0o644)
    done = subprocess.run(command + [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "4 runs on 2 lab(s)" in done.stdout
    for point in ("000-star-4-100mbit-1mib-ring", "003-star-4-200mbit-1mib-ps-h3"):
        assert point in done.stdout
    assert "0.1316" in done.stdout  # ring, 1 MiB at 100 Mbit: 1.5 MiB per link at 95.6 % payload
    assert not (tmp_path / "results").exists()
    without_dry = subprocess.run(command + [sys.executable, "-m", "orchestrator.cli", "run", str(path)],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=120,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
    if command:
        assert without_dry.returncode == 2 and "needs root" in without_dry.stderr


def test_report_refuses_a_directory_without_results(tmp_path):
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "no results.json here" in done.stderr


# the shipped experiments plan (every point predicted): test_experiment_report's
# test_every_ready_experiment_plans_without_root and test_every_ready_experiment_dry_runs_from_the_command_line
