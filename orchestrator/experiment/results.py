"""The results directory of one run of an experiment, and its results.json.

    results/<name>-<UTC time>/
        experiment.yaml     the file as run (its bytes)
        results.json        everything measured: per point the GST statistics, the prediction
                            and their ratio, algbw/busbw, iteration times, bytes per link,
                            fault events, every agent's records; versions; status
        results.csv         one row per point; iterations.csv: one row per agent and iteration
        gst.png, iterations.png, links.png, summary.md   (report.py, from results.json alone)
        prometheus/         queries.json (report.py) and snapshot/<lab>/ (runner), with monitoring

results.json is written again after every point (atomically), so an interrupted or crashed
run leaves what it measured, with `status` saying how it ended: running (the process died),
complete, partial (interrupted or failed; `error` says why).
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Sequence

from orchestrator.emulation.journal import write_atomically
from orchestrator.errors import BadUsage

SCHEMA = 1
RESULTS = "results.json"
EXPERIMENT = "experiment.yaml"


def utc_stamp(moment: datetime.datetime | None = None) -> str:
    return (moment or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def new_directory(name: str, out: Path | None) -> Path:
    """The run's directory, created now: `out`, or results/<name>-<UTC time> under the
    current directory. An existing directory is never reused (one line, exit 2)."""
    path = out if out is not None else Path("results") / f"{name}-{utc_stamp()}"
    if path.exists():
        raise BadUsage(f"--out {path}: already exists; results are never overwritten: pick a new directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise BadUsage(f"--out {path}: already exists; results are never overwritten: pick a new directory") from None
    except OSError as exc:
        raise BadUsage(f"--out {path}: cannot create it: {exc.strerror or exc}") from None
    return path


def versions() -> dict:
    """What produced the numbers: package versions, Python, kernel, and the git commit."""
    found = {"python": platform.python_version(), "kernel": platform.release()}
    for package in ("testbed", "grpcio", "pydantic", "numpy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        found["git_commit"] = commit.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        found["git_commit"] = None
    return found


def write(directory: Path, results: dict) -> None:
    """results.json, atomically: a reader (or a crash) never sees half a file."""
    write_atomically(directory / RESULTS, json.dumps(results, indent=1, default=str) + "\n")


def load(directory: Path) -> dict:
    path = Path(directory) / RESULTS
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadUsage(f"{directory}: no {RESULTS} here: give a directory `testbed run` wrote") from None
    except (OSError, ValueError) as exc:
        raise BadUsage(f"{path}: cannot read it: {exc}") from None
    if not isinstance(results, dict) or results.get("schema") != SCHEMA:
        raise BadUsage(f"{path}: not a results file of this testbed (schema {SCHEMA})")
    return results


# -- statistics of one run ------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "min": min(values), "max": max(values)}


def iteration_times(records: list[dict]) -> list[float]:
    """Per iteration, from the end of the previous synchronisation (the slowest agent's) to
    the end of this one; the first from the earliest start of its compute."""
    by_iteration: dict[int, list[dict]] = {}
    for record in records:
        by_iteration.setdefault(record["iteration"], []).append(record)
    times, previous_end = [], None
    for iteration in sorted(by_iteration):
        rows = by_iteration[iteration]
        end = max(r["start_time"] + r["gst_s"] for r in rows)
        begin = previous_end if previous_end is not None else min(r["start_time"] - r["compute_s"] for r in rows)
        times.append(end - begin)
        previous_end = end
    return times


def sync_times(records: list[dict]) -> list[float]:
    """Per iteration, the time per synchronisation: its iteration time (above) less the
    compute in it (the median agent's), NCCL-tests' time per operation with compute between.
    This is what the cost model predicts. GST, the slowest agent's time inside the allreduce,
    also counts an early agent waiting for late ones to enter (a colocated PS's workers finish
    an iteration up to 1.8 s apart on bcube,4,1, and enter the next as far apart)."""
    compute: dict[int, list[float]] = {}
    for record in records:
        compute.setdefault(record["iteration"], []).append(record["compute_s"])
    return [max(0.0, t - statistics.median(compute[i]))
            for i, t in zip(sorted(compute), iteration_times(records))]


RECOVERY_S = 1.0  # after a link comes back, TCP's backed-off retransmission timer may wait this long


def faulted_iterations(records: list[dict], events: list[dict], history: Sequence[dict] = (),
                       settle: int = 1) -> list[int]:
    """Iterations whose compute or synchronisation overlapped a fault in effect (applied to
    undone, plus RECOVERY_S; to the end when it was never undone), and the first `settle`
    of every membership a surviving run re-formed into (`history` after its first epoch):
    the re-form is the fault's doing, and its new connections start cold like the run's
    warm-up (a rejoined BCube(4,1) HiPS: 1.5 × the model, then 1.2, 1.1)."""
    spans: dict[int, tuple[float, float]] = {}
    for r in records:
        begin, end = r["start_time"] - r["compute_s"], r["start_time"] + r["gst_s"]
        low, high = spans.get(r["iteration"], (begin, end))
        spans[r["iteration"]] = (min(low, begin), max(high, end))
    faults = [(e["applied"], e["undone"] + RECOVERY_S if e.get("undone") is not None else float("inf"))
              for e in events if e.get("applied") is not None]
    touched = {i for i, (begin, end) in spans.items() if any(a < end and begin < u for a, u in faults)}
    touched |= {i for epoch in history[1:] for i in range(epoch["first"], epoch["first"] + settle) if i in spans}
    return sorted(touched)


def _predicted_at(iteration: int, history: list[dict], predicted: float | None) -> float | None:
    """The point's prediction for the membership that ran `iteration`: scaled by how the
    run's own prediction for that membership compares with its first (all servers)."""
    first = history[0].get("predicted_s") if history else None
    found = predicted
    for epoch in history:
        if epoch["first"] <= iteration:
            found = predicted * epoch["predicted_s"] / first if predicted and first and epoch.get("predicted_s") \
                else predicted
    return found


def _after_warmup(values: list[float], warmup: int) -> list[float]:
    """The timed iterations: those after the warm-up, or all when the run was no longer."""
    return values[warmup:] if len(values) > warmup else values


def measured_point(point: dict, records: list[dict], gst: list[float], warmup: int, workers: int) -> dict:
    """The measured fields of a point from its agents' records and per-iteration GST. The
    ratio is the time per synchronisation (`sync_times`) over the prediction (a fault-free
    network's, for the membership of the iteration); it leaves out the iterations a fault of
    the timeline touched, and a re-formed membership's first (as many as the warm-up, at
    least one); the GST statistics keep every measured iteration."""
    stats = summary(_after_warmup(gst, warmup))
    size = point["size_bytes"]
    mean = stats["mean"]
    algbw = size / mean if mean else None
    busbw = algbw * 2 * (workers - 1) / workers if algbw is not None and workers > 1 else None
    predicted = (point.get("predicted") or {}).get("seconds")
    faulted = faulted_iterations(records, point.get("fault_events") or [], point.get("history") or [], max(1, warmup))
    iterations = iteration_times(records)
    sync = sync_times(records) if records else []
    kept = [i for i in range(len(gst)) if i >= min(warmup, len(gst) - 1) and i not in faulted]
    kept_sync = [i for i in kept if i < len(sync)]

    def fault_free(values: list[float], at: list[int]) -> float | None:
        return sum(values[i] for i in at) / len(at) if at else None

    # each iteration beside the prediction for the membership that ran it (a surviving run
    # re-formed over fewer servers is predicted again: driver.Epoch.predicted_s)
    expected = [_predicted_at(i, point.get("history") or [], predicted) for i in kept_sync]
    return {
        "gst_s": {**stats, "per_iteration": gst, "fault_free_mean": fault_free(gst, kept)},
        "sync_s": {**summary(_after_warmup(sync, warmup)), "per_iteration": sync,
                   "fault_free_mean": fault_free(sync, kept_sync)},
        "faulted_iterations": faulted,
        "ratio": sum(sync[i] for i in kept_sync) / sum(expected) if kept_sync and all(expected) else None,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": busbw,
        "iteration_s": {**summary(iterations[warmup:]), "per_iteration": iterations},
        "verified": all(r["verified"] for r in records) if records else None,
        "records": records,
    }
