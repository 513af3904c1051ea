"""Several jobs on one fabric through `testbed run` (issue 32 item 1): two ring jobs on
torus,4,1 (four forwarding servers), each alone and then both at once, packed and spread.
Spread, each job relays the other's bytes and takes about twice as long, as the model says
from both jobs' flows in one simulation; packed, they do not touch. Each job's history is
checked on its own."""

from __future__ import annotations

from tests.netns.test_torch_run import _run


def test_two_jobs_interfere_as_the_model_says_spread_and_not_packed(tmp_path):
    results = _run(tmp_path, {
        "name": "jobs",
        "lab": {"name": "ex-jobs4", "topology": {"kind": "torus", "k": 4, "d": 1}, "links": {"bandwidth": "50Mbit"},
                "servers": {"runtime": "netns"}},
        "agents": {"workload": {"kind": "tensors", "tensors": [250_000], "compute": "10ms"}},
        "jobs": [{"name": "a", "servers": {"count": 2}, "algorithm": "ring"},
                 {"name": "b", "servers": {"count": 2}, "algorithm": "ring"}],
        "iterations": 5, "warmup": 1, "sweep": {"placements": ["packed", "spread"]},
    })
    points = results["points"]
    assert len(points) == 8 and all(p["status"] == "done" for p in points), [p.get("error") for p in points]
    assert all(p["checker"]["clean"] is True for p in points), [p["checker"] for p in points]
    together = [p for p in points if p["mode"] == "together"]
    for a, b in zip(together[0::2], together[1::2]):  # each pair ran at once
        assert a["window"]["start"] < b["window"]["end"] and b["window"]["start"] < a["window"]["end"]
    rows = {(r["placement"], r["job"]): r for r in results["jobs"]}
    for job in ("a", "b"):
        packed, spread = rows[("packed", job)], rows[("spread", job)]
        print(job, "packed", packed["factor_measured"], packed["factor_predicted"],
              "spread", spread["factor_measured"], spread["factor_predicted"])
        assert abs(packed["factor_predicted"] - 1) < 0.01 and 0.9 < packed["factor_measured"] < 1.12
        assert abs(spread["factor_predicted"] - 2) < 0.1 and 1.6 < spread["factor_measured"] < 2.3
        assert 0.85 < spread["together_measured_s"] / spread["together_predicted_s"] < 1.15


def test_a_jobs_fault_timeline_runs_with_that_job_alone(tmp_path):
    results = _run(tmp_path, {
        "name": "jobfaults",
        "lab": {"name": "ex-jobf", "topology": {"kind": "star", "servers": 4}, "links": {"bandwidth": "50Mbit"},
                "servers": {"runtime": "netns"}},
        "agents": {"workload": {"kind": "tensors", "tensors": [125_000], "compute": "10ms"}},
        "jobs": [{"name": "a", "servers": ["h0", "h1"], "algorithm": "ring",
                  "faults": {"events": [{"action": "link-degrade", "target": "h0-sw", "at_iteration": 2, "for": "0.5s",
                                         "options": {"rate": "25Mbit"}}]}},
                 {"name": "b", "servers": ["h2", "h3"], "algorithm": "ring"}],
        "iterations": 5, "warmup": 1,
    })
    points = {(p["job"], p["mode"]): p for p in results["points"]}
    assert all(p["status"] == "done" and p["checker"]["clean"] is True for p in points.values())
    for mode in ("alone", "together"):
        (event,) = points[("a", mode)]["fault_events"]
        assert event["action"] == "link-degrade" and event["applied"] and event["undone"] and not event.get("error")
        assert points[("a", mode)]["faulted_iterations"], points[("a", mode)]["faulted_iterations"]
        assert points[("b", mode)]["fault_events"] == [] and points[("b", mode)]["faulted_iterations"] == []


def test_a_job_that_starts_after_another_ends_runs_as_if_alone(tmp_path):
    """Spread on torus,4,1 the two jobs would halve each other's rate (above); with b after
    a (which runs 3 iterations to b's 5) neither is slowed, measured as predicted."""
    results = _run(tmp_path, {
        "name": "jobsafter",
        "lab": {"name": "ex-jobsa", "topology": {"kind": "torus", "k": 4, "d": 1}, "links": {"bandwidth": "50Mbit"},
                "servers": {"runtime": "netns"}},
        "agents": {"workload": {"kind": "back-to-back", "size": "1MB"}},
        "jobs": [{"name": "a", "servers": ["t0", "t2"], "algorithm": "ring", "iterations": 3},
                 {"name": "b", "servers": ["t1", "t3"], "algorithm": "ring", "start": {"after": "a"}}],
        "iterations": 5, "warmup": 1,
    })
    points = {(p["job"], p["mode"]): p for p in results["points"]}
    assert all(p["status"] == "done" for p in points.values()), [p.get("error") for p in points.values()]
    a, b = points[("a", "together")], points[("b", "together")]
    assert len(a["records"]) == 2 * 3 and len(b["records"]) == 2 * 5  # each its own iterations
    assert b["window"]["start"] >= a["window"]["end"] - 0.05  # b waited for a's end
    rows = {r["job"]: r for r in results["jobs"]}
    for job in ("a", "b"):
        assert abs(rows[job]["factor_predicted"] - 1) < 0.01, rows[job]
        assert 0.85 < rows[job]["factor_measured"] < 1.15, rows[job]
