"""`testbed run` end to end in bare namespaces: the smoke experiment leaves a complete results
directory (every file checked for content) and no lab; Ctrl-C mid-run leaves no lab, no
Prometheus, and a partial results directory. Labs are named ex-…"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.emulation import cleanup
from tests.netns.probes import command_lines

ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "orchestrator.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
FILES = {"experiment.yaml", "results.json", "results.csv", "iterations.csv", "gst.png", "iterations.png", "links.png",
         "summary.md"}
MONITORED = FILES | {"prometheus"}
PNG = b"\x89PNG\r\n\x1a\n"


def live_labs() -> list[str]:
    done = subprocess.run(TESTBED + ["ls", "--json"], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    return [lab["name"] for lab in json.loads(done.stdout)]


def prometheus_of(lab: str) -> list[str]:
    """Prometheus and exporter processes of `lab` (their files live under its state dir)."""
    return [c for c in command_lines(f"labs/{lab}/", live_only=True) if "prometheus" in c or "exporter" in c]


@pytest.fixture
def cleaned():
    names: list[str] = []
    yield names
    for name in names:
        cleanup.clean_lab(name)


def test_the_smoke_experiment_writes_every_file(tmp_path, cleaned):
    cleaned.append("ex-smoke")
    out = tmp_path / "smoke"
    started = time.monotonic()
    done = subprocess.run(TESTBED + ["run", str(ROOT / "experiments/smoke.yaml"), "--out", str(out)],
                          capture_output=True, text=True, env=ENV, timeout=600)
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"smoke experiment: {wall:.1f} s\n{done.stdout}")
    assert {p.name for p in out.iterdir()} == MONITORED
    assert "ex-smoke" not in live_labs() and not prometheus_of("ex-smoke")

    assert (out / "experiment.yaml").read_bytes() == (ROOT / "experiments/smoke.yaml").read_bytes()
    results = json.loads((out / "results.json").read_text())
    spec = yaml.safe_load((ROOT / "experiments/smoke.yaml").read_text())
    assert results["status"] == "complete" and results["partial"] is False and results["error"] is None
    assert results["versions"]["testbed"] and results["versions"]["kernel"] == os.uname().release
    assert [p["algorithm"] for p in results["points"]] == spec["agents"]["algorithms"]
    iterations = spec["iterations"]
    for point in results["points"]:
        assert point["status"] == "done" and point["verified"] is True
        gst = point["gst_s"]
        assert len(gst["per_iteration"]) == iterations
        timed = gst["per_iteration"][spec["warmup"]:]
        assert gst["mean"] == pytest.approx(sum(timed) / len(timed))
        assert min(timed) <= gst["p50"] <= gst["p95"] <= max(timed)
        predicted = point["predicted"]["seconds"]
        # the ratio leaves out what the fault touched: iteration 2 (degraded) and what overlapped it
        assert point["faulted_iterations"] and min(point["faulted_iterations"]) >= 2  # applied once all entered 2
        clean = [t for i, t in enumerate(gst["per_iteration"]) if i >= spec["warmup"] and i not in point["faulted_iterations"]]
        assert gst["fault_free_mean"] == pytest.approx(sum(clean) / len(clean))
        # the ratio is the time per synchronisation's: no more than the slowest agent's GST
        sync = point["sync_s"]
        assert len(sync["per_iteration"]) == iterations
        assert all(0 < s < g + 0.1 for s, g in zip(sync["per_iteration"], gst["per_iteration"]))  # compute jitter
        clean = [t for i, t in enumerate(sync["per_iteration"]) if i >= spec["warmup"] and i not in point["faulted_iterations"]]
        assert sync["fault_free_mean"] == pytest.approx(sum(clean) / len(clean))
        assert predicted > 0 and point["ratio"] == pytest.approx(sync["fault_free_mean"] / predicted)
        # the measured GST is the network's: at least the fluid time, not orders beyond it
        assert 0.9 < point["ratio"] < 10
        assert point["algbw_bytes_per_s"] == pytest.approx(point["size_bytes"] / gst["mean"])
        assert point["busbw_bytes_per_s"] == pytest.approx(point["algbw_bytes_per_s"] * 2 * 3 / 4)
        assert len(point["iteration_s"]["per_iteration"]) == iterations
        assert len(point["records"]) == 4 * iterations
        # every link direction carried about what the model says, per allreduce × iterations
        measured, model = point["bytes_per_link"]["measured"], point["bytes_per_link"]["predicted_per_allreduce"]
        assert set(measured) == set(model)
        for link, per_allreduce in model.items():
            assert per_allreduce * iterations <= measured[link] < per_allreduce * iterations * 1.2, link
        # the fidelity verdict: the CPU's headroom measured, and each reason for what it finds
        fidelity = point["fidelity"]
        assert 0 < fidelity["cpu_idle_share"] < 1 and fidelity["verdict"] in ("ok", "degraded", "model off")
        assert (fidelity["verdict"] != "ok") == bool(fidelity["reasons"])
        assert any("measured/predicted" in r for r in fidelity["reasons"]) == (not 0.90 <= point["ratio"] <= 1.10)
        assert point["checker"]["clean"] is None  # a back-to-back loop carries no gradient to check
        [event] = point["fault_events"]
        assert event["action"] == "link-degrade" and event["target"] == "h0-sw" and event["error"] is None
        assert event["applied"] is not None and event["undone"] >= event["applied"]
        # the iterations the degrade held whole, beside the model's figure with h0-sw at 50 Mbit
        [held] = point["under_faults"]
        assert (held["target"], held["rate"]) == ("h0-sw", "50Mbit") and held["iterations"], held
        assert set(held["iterations"]) <= set(point["faulted_iterations"])
        assert held["measured_s"] == pytest.approx(
            sum(sync["per_iteration"][i] for i in held["iterations"]) / len(held["iterations"]))
        assert held["predicted_s"] > 1.5 * predicted  # the ring's and the mesh's bottleneck: h0's link, halved
        print(f"{point['algorithm']} under link-degrade h0-sw 50Mbit: iterations {held['iterations']}, "
              f"{held['measured_s']:.3f} s measured, {held['predicted_s']:.3f} s predicted ({held['ratio']:.3f})")
        # near the model, not a fidelity bound (bench/ measures that): 1.00 alone on a quiet machine,
        # 1.15-1.20 seen in full suites on these two cores; priced at the undegraded rate it is ~2
        assert 0.85 <= held["ratio"] <= 1.3
        # the agents were re-paced at the shares the halved link leaves, once it was (the undo,
        # 1.5 s on, may come after the run's last iteration)
        assert point["repaced"] and point["repaced"][0]["rates"] == {"h0→sw": 50e6, "sw→h0": 50e6}, point["repaced"]
        assert event["applied"] <= point["repaced"][0]["at"] <= point["window"]["end"] + 1

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["id"] for r in rows] == [p["id"] for p in results["points"]]
    assert [r["verdict"] for r in rows] == [p["fidelity"]["verdict"] for p in results["points"]]
    assert float(rows[0]["gst_mean_s"]) == pytest.approx(results["points"][0]["gst_s"]["mean"], rel=1e-5)
    records = list(csv.DictReader((out / "iterations.csv").open()))
    assert len(records) == sum(len(p["records"]) for p in results["points"])
    for png in ("gst.png", "iterations.png", "links.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    assert set(results["labs"][0]["tiers"].values()) == {"host-switch"} and len(results["labs"][0]["tiers"]) == 8
    for point in results["points"]:
        assert 0 < point["bytes_per_link"]["seconds"] and point["window"]["start"] < point["window"]["end"]

    # Prometheus: the dashboards' queries for this run, and a TSDB snapshot taken before teardown
    monitored = results["monitoring"]["ex-smoke"]
    queries = json.loads((out / "prometheus/queries.json").read_text())["labs"]["ex-smoke"]
    assert queries["start"] <= results["points"][0]["window"]["start"] < results["points"][-1]["window"]["end"] <= queries["end"]
    assert set(queries["points"]) == {p["id"] for p in results["points"]}
    assert {"experiment", "fabric", "faults", "host"} <= set(queries["dashboards"])
    snapshot = out / "prometheus/snapshot/ex-smoke"
    assert monitored["snapshot"] == "prometheus/snapshot/ex-smoke" and snapshot.is_dir()
    blocks = [p for p in snapshot.iterdir() if (p / "meta.json").is_file()]
    assert blocks or (snapshot / "chunks_head").is_dir(), sorted(p.name for p in snapshot.iterdir())
    for block in blocks:
        meta = json.loads((block / "meta.json").read_text())
        assert meta["stats"]["numSeries"] > 0 and (block / "index").is_file()
    summary = (out / "summary.md").read_text()
    assert "status: **complete**" in summary and "link-degrade" in summary and "## Under faults" in summary
    assert "## Re-pacing" in summary and "h0→sw 50Mbit, sw→h0 50Mbit" in summary
    for point in results["points"]:
        assert f"| {point['id']} | {point['algorithm']} |" in summary

    # `testbed report` renders the same files again from results.json
    for name in FILES - {"experiment.yaml", "results.json"}:
        (out / name).unlink()
    (out / "prometheus/queries.json").unlink()
    again = subprocess.run(TESTBED + ["report", str(out)], capture_output=True, text=True, env=ENV, timeout=120)
    assert again.returncode == 0, again.stderr
    assert {p.name for p in out.iterdir()} == MONITORED
    assert json.loads((out / "prometheus/queries.json").read_text())["labs"]["ex-smoke"] == queries
    assert (out / "summary.md").read_text() == summary

    # a results directory is never overwritten
    refused = subprocess.run(TESTBED + ["run", str(ROOT / "experiments/smoke.yaml"), "--out", str(out)],
                             capture_output=True, text=True, env=ENV, timeout=120)
    assert refused.returncode == 2 and "already exists" in refused.stderr
    assert json.loads((out / "results.json").read_text()) == results


SMALL = """
name: ex-busy
lab: {name: ex-busy, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit}, servers: {runtime: netns}}
agents: {via: exec, algorithms: [ring], workload: {kind: back-to-back, size: 2MB}}
iterations: 4
monitoring: false
"""
HOG = "while True: pass"


def test_the_verdict_is_degraded_on_an_overloaded_machine(tmp_path, cleaned):
    """Busy loops on every CPU (twice over) while the experiment runs: its figure is the
    machine's, and the verdict says so, naming the CPU."""
    cleaned.append("ex-busy")
    experiment = tmp_path / "busy.yaml"
    experiment.write_text(SMALL)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, env=ENV, timeout=600)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    [point] = json.loads((tmp_path / "out" / "results.json").read_text())["points"]
    fidelity = point["fidelity"]
    assert fidelity["verdict"] == "degraded" and fidelity["cpu_idle_share"] < 0.2, fidelity
    assert any("idle while it ran" in reason for reason in fidelity["reasons"]), fidelity
    assert "degraded" in (tmp_path / "out" / "summary.md").read_text()


CONGESTION = """
name: ex-cc
lab: {name: ex-cc, topology: {kind: star, servers: 2}, links: {bandwidth: 100Mbit}, servers: {runtime: netns}}
agents: {via: exec, algorithms: [ring], workload: {kind: back-to-back, size: 1MB}}
iterations: 2
sweep: {tcp_congestion: [cubic, reno]}
"""


def test_a_congestion_control_sweep_runs_each_on_a_lab_of_its_own(tmp_path, cleaned):
    """sweep.tcp_congestion: one lab per congestion control, its servers' routes set to it,
    each point named after it in its id and its results."""
    from orchestrator.emulation import kernel
    from orchestrator.emulation.plan import namespace_name

    cleaned += ["ex-cc-v0", "ex-cc-v1"]
    experiment = tmp_path / "cc.yaml"
    experiment.write_text(CONGESTION)
    done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(tmp_path / "out"), "--keep"],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    points = json.loads((tmp_path / "out" / "results.json").read_text())["points"]
    assert [(p["status"], p["tcp_congestion"], p["lab"]) for p in points] == [
        ("done", "cubic", "ex-cc-v0"), ("done", "reno", "ex-cc-v1")], points
    assert "-cubic-" in points[0]["id"] and "-reno-" in points[1]["id"]
    for point in points:  # the kept labs: each server's routes carry its congestion control
        routes = subprocess.run(kernel.in_netns(namespace_name(point["lab"], "h0")) + ["ip", "route", "show"],
                                capture_output=True, text=True).stdout
        assert f"congctl {point['tcp_congestion']}" in routes, routes


CRASH = """
name: ex-crash
lab: {name: ex-crash, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit}, servers: {runtime: netns}}
agents: {via: exec, algorithms: [ring], workload: {kind: tensors, tensors: [100000, 50000], compute: 50ms}}
iterations: 10
monitoring: false
faults:
  events:
    - {action: server-crash, target: h2, at_iteration: 3}
"""


def test_a_server_crash_mid_run_is_survived_and_checked(tmp_path, cleaned):
    """A server crashes at iteration 3: the ring re-forms over the other three, the run ends,
    and the history checker finds every aggregate exactly the sum of its members'."""
    cleaned.append("ex-crash")
    experiment = tmp_path / "crash.yaml"
    experiment.write_text(CRASH)
    done = subprocess.run(TESTBED + ["run", str(experiment), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [point] = json.loads((tmp_path / "out" / "results.json").read_text())["points"]
    assert point["status"] == "done", point.get("error")
    history = point["history"]
    assert len(history) >= 2 and "h2" in history[0]["nodes"] and "h2" not in history[-1]["nodes"], history
    assert point["checker"]["clean"] is True and point["checker"]["iterations"] == 10, point["checker"]
    assert point["checker"]["lost"] == 0 and point["checker"]["duplicated"] == 0
    assert "History checker" in (tmp_path / "out" / "summary.md").read_text()


LONG = """
name: ex-interrupt
lab: {name: ex-int, topology: {kind: star, servers: 4}, links: {bandwidth: 100Mbit}, servers: {runtime: netns}}
agents: {algorithms: [ring, mesh], workload: {kind: back-to-back, size: 2MB}}
iterations: 40
monitoring: true
"""


def _as_a_terminal_starts_it() -> None:
    """SIGINT as a terminal's foreground job has it. A job started in the background
    (`./setup.sh test &`, nohup) ignores SIGINT and its children inherit that: Python then
    installs no KeyboardInterrupt handler, and the run went on to its end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_mid_run_leaves_nothing_but_partial_results(tmp_path, cleaned):
    cleaned.append("ex-int")
    experiment = tmp_path / "long.yaml"
    experiment.write_text(textwrap.dedent(LONG))
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(TESTBED + ["run", str(experiment), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True,
                            preexec_fn=_as_a_terminal_starts_it)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "iteration 1/40" in line:
                break
        else:
            pytest.fail(f"no iteration showed up: {''.join(seen)[-2000:]}")
        assert prometheus_of("ex-int"), "monitoring was on: its Prometheus should run now"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    assert "partial results in" in rest
    assert "ex-int" not in live_labs()
    assert not prometheus_of("ex-int")
    assert not command_lines("labs/ex-int/", live_only=True)  # agents, supervisors, exporter: none left

    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "partial" and results["partial"] is True and results["error"] == "interrupted"
    first, second = results["points"]
    assert first["status"] == "interrupted" and second["status"] == "not run"
    assert first["error"] == "interrupted"
    # what was measured before Ctrl-C is kept: at least the first iteration
    assert 1 <= len(first["gst_s"]["per_iteration"]) < 40 and first["gst_s"]["mean"] > 0
    assert {p.name for p in out.iterdir()} == MONITORED  # the snapshot is taken on the way down too
    assert "status: **partial (interrupted)**" in (out / "summary.md").read_text()
