"""A results directory rendered from results.json alone (no root, no lab): link utilisation
by tier, the dashboards' queries for Prometheus, `testbed compare`, and every ready
experiment of experiments/ validated and planned as `--dry-run` plans it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.experiment import compare, plots, report, snapshot
from orchestrator.experiment.plan import make_plan
from orchestrator.experiment.results import SCHEMA
from orchestrator.experiment.sweep import expand
from orchestrator.monitoring.dashboards import DASHBOARDS
from orchestrator.spec.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "orchestrator.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
RATE = 12_500_000  # 100 Mbit in bytes per second
TIERS = {"h0→s0": "level0", "s0→h0": "level0", "h1→s0": "level0", "s0→h1": "level0",
         "h0→s1": "level1", "s1→h0": "level1"}


def point(index: int, algorithm: str, gst: float | None, predicted: float, verdict: str = "ok",
          status: str = "done", moved: dict | None = None) -> dict:
    measured = {"gst_s": {"mean": gst, "p50": gst, "p95": gst, "min": gst, "max": gst,
                          "per_iteration": [gst * 2, gst, gst]},
                "ratio": gst / predicted, "algbw_bytes_per_s": 1e6 / gst, "busbw_bytes_per_s": 1.5e6 / gst,
                "records": [{"rank": 0, "node": "h0", "iteration": i, "gst_s": gst, "compute_s": 0.0,
                             "start_time": 1000.0 + i, "bytes_sent": 1, "bytes_received": 1, "verified": True}
                            for i in range(3)],
                "fidelity": {"verdict": verdict, "reasons": [] if verdict == "ok" else ["CPU 5% idle"],
                             "cpu_idle_share": 0.5}} if gst else {}
    return {"id": f"{index:03d}-bcube-2-1-100mbit-1mib-{algorithm}", "lab": "ex-unit", "topology": "bcube-2-1",
            "link_rate": "100Mbit", "size_bytes": 1 << 20, "algorithm": algorithm, "workers": ["h0", "h1"],
            "servers": [], "status": status, "error": None, "warmup": 1, "partitioning": {},
            "predicted": {"seconds": predicted, "link_bytes": {}},
            "fault_events": [{"action": "link-down", "target": "h0-s0", "planned": 1000.5, "applied": 1001.2,
                              "undone": 1001.8, "error": None}],
            "window": {"start": 1000.0, "end": 1004.0},
            "bytes_per_link": {"measured": moved or {}, "seconds": 4.0, "predicted_per_allreduce": {}},
            **measured}


def results(points: list[dict], name: str = "unit", monitoring: bool = False) -> dict:
    made = {"schema": SCHEMA, "status": "complete", "partial": False, "error": None,
            "experiment": {"name": name, "description": "", "file": "experiment.yaml", "monitoring": monitoring},
            "started": "2026-01-01T00:00:00.000+00:00", "finished": "2026-01-01T00:01:00.000+00:00", "wall_s": 60.0,
            "versions": {"testbed": "0"},
            "labs": [{"name": "ex-unit", "topology": "bcube-2-1", "link_rate": "100Mbit", "rate_bytes_per_s": RATE,
                      "tiers": TIERS, "spec": {"servers": {"runtime": "netns"}}}],
            "points": points}
    if monitoring:
        made["monitoring"] = {"ex-unit": {"url": "http://127.0.0.1:9", "started": 990.0, "ended": 1010.0,
                                          "snapshot": "prometheus/snapshot/ex-unit"}}
    return made


def write(directory: Path, data: dict) -> Path:
    directory.mkdir()
    (directory / "results.json").write_text(json.dumps(data))
    return directory


# -- link utilisation by tier ---------------------------------------------------------------------
def test_utilisation_by_tier_counts_idle_directions_and_the_busiest():
    # level0: 4 directions, one carried 25 MB in 4 s at 12.5 MB/s → 0.5 of its capacity, others idle
    moved = {"h0→s0": 25_000_000, "s1→h0": 10_000_000}
    shares = plots.utilisation_by_tier(results([point(0, "ring", 1.0, 1.0, moved=moved)]))
    assert shares == {"000-bcube-2-1-100mbit-1mib-ring": {"level0": (pytest.approx(0.125), pytest.approx(0.5)),
                                                          "level1": (pytest.approx(0.1), pytest.approx(0.2))}}


def test_points_without_counters_or_tiers_are_left_out():
    old = results([point(0, "ring", 1.0, 1.0, moved={"h0→s0": 1})])
    del old["labs"][0]["tiers"]  # a results.json written before tiers were recorded
    assert plots.utilisation_by_tier(old) == {}
    not_run = results([point(0, "ring", None, 1.0, status="not run")])
    not_run["points"][0]["bytes_per_link"] = {}
    assert plots.utilisation_by_tier(not_run) == {}


def test_render_writes_every_file_from_results_json_alone(tmp_path):
    data = results([point(0, "ring", 1.0, 0.95, moved={"h0→s0": 10_000_000}), point(1, "hips", 0.5, 0.5)],
                   monitoring=True)
    directory = write(tmp_path / "run", data)
    written = report.render(directory)
    names = {p.relative_to(directory).as_posix() for p in written}
    assert names == {"results.csv", "iterations.csv", "gst.png", "iterations.png", "links.png", "summary.md",
                     "prometheus/queries.json"}
    assert (directory / "links.png").read_bytes().startswith(b"\x89PNG")
    summary = (directory / "summary.md").read_text()
    assert "![Link utilisation by tier](links.png)" in summary
    assert "TSDB snapshot in [prometheus/snapshot/ex-unit]" in summary


# -- Prometheus queries -----------------------------------------------------------------------------
def test_queries_hold_every_dashboard_query_for_the_lab_and_the_run():
    data = results([point(0, "ring", 1.0, 1.0)], monitoring=True)
    queries = snapshot.queries(data)
    lab = queries["labs"]["ex-unit"]
    assert (lab["start"], lab["end"]) == (990.0, 1010.0)
    assert lab["points"] == {"000-bcube-2-1-100mbit-1mib-ring": {"start": 1000.0, "end": 1004.0}}
    assert set(lab["dashboards"]) == set(DASHBOARDS)
    expressions = [q["expr"] for board in lab["dashboards"].values() for panel in board["panels"]
                   for q in panel["queries"]] + [a["expr"] for board in lab["dashboards"].values()
                                                  for a in board["annotations"]]
    assert len(expressions) >= 30
    assert all("$" not in e for e in expressions), [e for e in expressions if "$" in e]
    assert any('lab="ex-unit"' in e and "[4s]" in e for e in expressions)
    assert snapshot.write_queries(Path("/nonexistent"), results([point(0, "ring", 1.0, 1.0)])) is None  # no monitoring


# -- testbed compare --------------------------------------------------------------------------------
def test_compare_matches_points_by_what_they_measured(tmp_path):
    a = results([point(0, "ring", 1.0, 0.9), point(1, "hips", 0.5, 0.5), point(2, "ps", 2.0, 2.0)], name="before")
    later = [point(0, "hips", 0.4, 0.5), point(1, "ring", 1.2, 0.9, verdict="degraded"), point(2, "bml", 0.3, 0.3)]
    b = results(later, name="after")
    rows = {row.algorithm: row for row in compare.rows(a, b)}
    assert list(rows) == ["ring", "hips", "ps", "bml"]  # A's order, then B's extras
    assert rows["ring"].change == pytest.approx(1.2) and rows["hips"].change == pytest.approx(0.8)
    assert rows["ps"].b is None and rows["bml"].a is None and rows["ps"].change is None
    assert rows["ring"].cells()[5:] == ["1.111", "1.333", "ok", "degraded"]
    assert rows["ps"].cells()[-1] == "absent"

    first, second = write(tmp_path / "a", a), write(tmp_path / "b", b)
    done = subprocess.run(TESTBED + ["compare", str(first), str(second), "--out", str(tmp_path / "cmp.md")],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "1.200" in done.stdout and "degraded" in done.stdout and "absent" in done.stdout
    markdown = (tmp_path / "cmp.md").read_text()
    assert "# before vs after" in markdown
    assert "| 000-bcube-2-1-100mbit-1mib-ring | ring | 1 | 1.2 | 1.200 | 1.111 | 1.333 | ok | degraded |" in markdown


def test_compare_refuses_a_directory_without_results(tmp_path):
    (tmp_path / "empty").mkdir()
    good = write(tmp_path / "a", results([point(0, "ring", 1.0, 1.0)]))
    done = subprocess.run(TESTBED + ["compare", str(good), str(tmp_path / "empty")], capture_output=True,
                          text=True, env=ENV, timeout=60)
    assert done.returncode == 2 and "no results.json here" in done.stderr


# -- ready experiments ------------------------------------------------------------------------------
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


def test_the_ready_experiments_are_there():
    names = {p.stem for p in EXPERIMENTS}
    assert {"smoke", "demo", "hips-vs-ring", "fattree-vs-bcube", "bigraph-hdrm", "bml-fault-tolerance",
            "bytescheduler", "digits"} <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_ready_experiment_plans_without_root_and_prints_its_plan(path, monkeypatch):
    from io import StringIO

    from rich.console import Console

    from orchestrator import cli

    spec = load_experiment(path)
    plan = make_plan(spec, str(path))
    assert plan.points and all(p.prediction.seconds > 0 for p in plan.points)
    ids = [p.point.id for p in plan.points]
    assert len(set(ids)) == len(ids)
    for variant in plan.variants:  # ready experiments use ex-… labs, or the demo's own
        assert variant.lab.name.startswith(("ex-", "demo")), variant.lab.name
    # what `testbed run --dry-run` prints of it (the command line itself: the test below)
    printed = StringIO()
    monkeypatch.setattr(cli, "out", Console(file=printed, width=250))
    cli._print_plan(plan, cli._plan_needs(plan))
    assert f"experiment {spec.name}:" in printed.getvalue()
    assert all(p.point.id in printed.getvalue() for p in plan.points)


def test_the_readmes_experiment_dry_runs_from_the_command_line():
    """The command line's own path (every ready experiment's plan and print: the test above,
    in-process, where each took a CLI of its own for 40 s of the unit tier)."""
    path = ROOT / "experiments/demo.yaml"
    done = subprocess.run(TESTBED + ["run", str(path), "--dry-run"], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"experiment {load_experiment(path).name}:" in done.stdout


def test_a_partitioning_sweep_is_crossed_and_changes_the_prediction():
    spec = load_experiment(ROOT / "experiments/bytescheduler.yaml")
    points = expand(spec)
    settings = spec.sweep.partitionings
    assert len(points) == len(settings) * len(spec.agents.algorithms)
    assert [p.partitioning for p in points[::len(spec.agents.algorithms)]] == list(settings)
    assert points[0].id.endswith("-pnone-call-ring") and "-p512kib-c1mib-" in points[4].id
    plan = make_plan(spec)
    credited = [p.prediction.seconds for p in plan.points if p.point.partitioning.credit_bytes]
    assert credited and plan.points[0].point.describe()["partitioning"] == {"partition_bytes": None,
                                                                           "credit_bytes": 0}
    copy.deepcopy(plan.points[0].point.describe())  # JSON-able, as results.json stores it


def _records(syncs: list[float], compute: float = 0.5, early: dict | None = None) -> list[dict]:
    """Agent records of iterations `syncs[i]` s of synchronisation apart, each agent computing
    `compute` s first; `early`: {iteration: seconds} the first agent left the iteration before
    it ends (a PS worker whose pull came first), and so enters the next one that much early."""
    records, end = [], 0.0
    for i, sync in enumerate(syncs):
        ahead = (early or {}).get(i - 1, 0.0)
        finish = end + compute + sync
        leaves = finish - (early or {}).get(i, 0.0)
        for rank, entered in enumerate((end - ahead + compute, end + compute)):
            records.append({"iteration": i, "start_time": entered, "compute_s": compute,
                            "gst_s": (leaves if rank == 0 else finish) - entered, "node": f"h{rank}", "rank": rank,
                            "verified": True, "bytes_sent": 0, "seconds": 1.0})
        end = finish
    return records


def _gst(records: list[dict]) -> list[float]:
    by: dict[int, float] = {}
    for r in records:
        by[r["iteration"]] = max(by.get(r["iteration"], 0.0), r["gst_s"])
    return [by[i] for i in sorted(by)]


def test_the_ratio_sets_each_iteration_beside_the_prediction_for_its_membership():
    """A surviving run re-formed over 15 of 16 servers is predicted again (driver.Epoch):
    its iterations count against that prediction, scaled to the point's; faulted ones not at all."""
    from orchestrator.experiment.results import measured_point

    # iteration 3 is the re-formed membership's first: new connections, cold
    records = _records([1.0, 1.0, 9.0, 5.0, 2.0, 2.0])
    gst = _gst(records)
    history = [{"first": 0, "members": [], "nodes": [], "reason": "start", "predicted_s": 0.5},
               {"first": 3, "members": [], "nodes": [], "reason": "h33 lost", "predicted_s": 1.0}]
    point = {"size_bytes": 100, "predicted": {"seconds": 1.0}, "history": history,
             "fault_events": [{"applied": records[4]["start_time"] + 0.5, "undone": records[4]["start_time"] + 0.8}]}
    measured = measured_point(point, records, gst, 0, 2)
    assert measured["faulted_iterations"] == [2, 3]  # the fault's, and the re-form's first
    assert measured["sync_s"]["per_iteration"] == pytest.approx([1.0, 1.0, 9.0, 5.0, 2.0, 2.0])
    # iterations 0, 1 against 1.0; 4, 5 against 1.0 × 1.0/0.5 = 2.0
    assert measured["ratio"] == pytest.approx((1 + 1 + 2 + 2) / (1 + 1 + 2 + 2))
    # with a warm-up of 2, a re-formed membership settles for as long
    assert measured_point(point, records, gst, 2, 2)["faulted_iterations"] == [2, 3, 4]
    point["history"] = history[:1]  # nobody lost: the point's own prediction throughout
    assert measured_point(point, records, gst, 0, 2)["faulted_iterations"] == [2]
    assert measured_point(point, records, gst, 0, 2)["ratio"] == pytest.approx(11.0 / 5)


def test_the_ratio_counts_the_time_per_synchronisation_not_an_agent_waiting_for_a_late_one():
    # the first agent leaves iterations 0 and 2 half a second before the second: it enters
    # the next one as early, and its GST counts the wait; the synchronisation does not
    from orchestrator.experiment.results import measured_point

    records = _records([1.0, 1.0, 1.0, 1.0], early={0: 0.5, 2: 0.5})
    gst = _gst(records)
    assert gst == pytest.approx([1.0, 1.5, 1.0, 1.5])
    measured = measured_point({"size_bytes": 100, "predicted": {"seconds": 1.0}}, records, gst, 0, 2)
    assert measured["sync_s"]["per_iteration"] == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert measured["ratio"] == pytest.approx(1.0) and measured["gst_s"]["mean"] == pytest.approx(1.25)


def test_a_link_degrade_is_predicted_with_its_rate_over_the_iterations_it_held(tmp_path):
    """The smoke experiment's ring with h0-sw at 50 Mbit: the model's figure for the iterations
    the degrade held, from the same schedules; the plan's own topology stays as it was."""
    from orchestrator.experiment.plan import predict_with_rates, topology_of
    from orchestrator.experiment.results import iterations_within

    plan = make_plan(load_experiment(ROOT / "experiments" / "smoke.yaml"))
    ring = next(p for p in plan.points if p.point.algorithm.name == "ring")
    slow = predict_with_rates(plan.spec, ring, {("h0", "sw"): 50e6, ("sw", "h0"): 50e6})
    # a ring moves the same bytes over every server's link: the halved one sets its pace
    assert slow.per_run == pytest.approx(2 * ring.prediction.per_run, rel=0.05)
    assert {load.link for load in slow.bottlenecks()} == {"h0→sw", "sw→h0"}
    assert topology_of(ring.point.lab).rates == {}
    again = predict_with_rates(plan.spec, ring, {})
    assert again.per_run == pytest.approx(ring.prediction.per_run)

    records = [{"iteration": i, "start_time": 10.0 + i, "compute_s": 0.1, "gst_s": 0.8} for i in range(5)]
    # iteration i spans [9.9 + i, 10.8 + i]: a fault over [11.5, 14.0] held 2 and 3 whole
    assert iterations_within(records, 11.5, 14.0) == [2, 3]
    assert iterations_within(records, 11.5, float("inf")) == [2, 3, 4]
    assert iterations_within(records, 12.0, 12.5) == []


def test_the_summary_sets_a_degraded_links_iterations_beside_their_prediction(tmp_path):
    held = point(0, "ring", 0.5, 0.25)
    held["under_faults"] = [{"action": "link-degrade", "target": "h0-s0", "rate": "50Mbit", "iterations": [2, 3, 4],
                             "measured_s": 0.51, "predicted_s": 0.5, "ratio": 1.02}]
    directory = write(tmp_path / "run", results([held, point(1, "mesh", 0.4, 0.4)]))
    report.render(directory)
    summary = (directory / "summary.md").read_text()
    assert "## Under faults" in summary
    assert "| 000-bcube-2-1-100mbit-1mib-ring | link-degrade h0-s0 to 50Mbit | 2–4 | 0.51 | 0.5 | 1.020 |" in summary


def test_the_summary_says_when_a_points_agents_were_re_paced(tmp_path):
    held = point(0, "ring", 0.5, 0.25)
    held["repaced"] = [{"at": 1_800_000_000.25, "rates": {"h0→s0": 50e6, "s0→h0": 50e6}}, {"at": 1_800_000_002.0, "rates": {}}]
    directory = write(tmp_path / "run", results([held, point(1, "mesh", 0.4, 0.4)]))
    report.render(directory)
    summary = (directory / "summary.md").read_text()
    assert "## Re-pacing" in summary
    assert "| 000-bcube-2-1-100mbit-1mib-ring | 08:00:00.250 | h0→s0 50Mbit, s0→h0 50Mbit |" in summary
    assert "| 000-bcube-2-1-100mbit-1mib-ring | 08:00:02.000 | none |" in summary
    plain = write(tmp_path / "plain", results([point(0, "ring", 0.5, 0.25)]))
    report.render(plain)
    assert "## Re-pacing" not in (plain / "summary.md").read_text()
