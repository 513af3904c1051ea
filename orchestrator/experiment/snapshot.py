"""What a run leaves of its lab's Prometheus: the dashboards' queries with the run's lab and
times filled in, and a TSDB snapshot taken before the lab is removed.

    prometheus/
        queries.json            per lab: its time range, each point's window, and every panel's
                                and annotation's PromQL of the Grafana dashboards (dashboards.py)
                                with `$lab` and `$__rate_interval` substituted
        snapshot/<lab>/         a TSDB directory (blocks with meta.json, chunks_head): serve it with
                                prometheus --storage.tsdb.path=... (README "From a lab file to a report")

The snapshot goes through Prometheus's admin API (`--web.enable-admin-api`, set by
monitoring/prometheus.py): it lands in the lab's data directory, which `testbed down` removes,
so it is copied out first. Both are best effort: a run's numbers never depend on them.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from orchestrator.emulation.journal import write_inside

DIRECTORY = "prometheus"
QUERIES = "queries.json"
SNAPSHOT = "snapshot"
# Grafana's $__rate_interval for a 1 s scrape interval: max(4 × scrape, interval + scrape)
RATE_INTERVAL = "4s"
SNAPSHOT_TIMEOUT = 60.0
LAST_SCRAPE_S = 2.0  # two scrape intervals: the run's final counters are in the TSDB


def substitute(expr: str, lab: str) -> str:
    """A dashboard expression as Grafana would send it for `lab`."""
    return expr.replace("$lab", lab).replace("$__rate_interval", RATE_INTERVAL)


def _panels(board: dict):
    for panel in board["panels"]:
        yield from panel.get("panels", [])  # a row's panels
        if panel["type"] != "row":
            yield panel


def dashboard_queries(lab: str) -> dict[str, dict]:
    """Every dashboard's panels and annotations with their PromQL for `lab`."""
    from orchestrator.monitoring.dashboards import DASHBOARDS, dashboard_json

    out = {}
    for name in DASHBOARDS:
        board = dashboard_json(name)
        out[name] = {
            "title": board["title"],
            "panels": [{"title": panel["title"], "type": panel["type"],
                        "unit": panel.get("fieldConfig", {}).get("defaults", {}).get("unit"),
                        "queries": [{"ref": t["refId"], "expr": substitute(t["expr"], lab),
                                     "legend": t.get("legendFormat"), "instant": bool(t.get("instant"))}
                                    for t in panel.get("targets", [])]}
                       for panel in _panels(board)],
            "annotations": [{"name": a["name"], "expr": substitute(a["expr"], lab)}
                            for a in board["annotations"]["list"]],
        }
    return out


def queries(results: dict) -> dict:
    """queries.json of a run: per monitored lab its range, its points' windows and the queries."""
    labs = {}
    for name, monitor in (results.get("monitoring") or {}).items():
        points = [p for p in results["points"] if p["lab"] == name and p.get("window")]
        start = monitor.get("started") or min((p["window"]["start"] for p in points), default=None)
        end = monitor.get("ended") or max((p["window"]["end"] for p in points), default=None)
        labs[name] = {
            "prometheus_url": monitor.get("url"), "start": start, "end": end, "step": "1s",
            "points": {p["id"]: p["window"] for p in points},
            "snapshot": monitor.get("snapshot"),
            "dashboards": dashboard_queries(name),
        }
    return {"how": "GET /api/v1/query_range?query=EXPR&start=START&end=END&step=1s on a Prometheus serving "
                   "the snapshot (instant queries: /api/v1/query?query=EXPR&time=T); times are Unix seconds; "
                   f"$lab and $__rate_interval ({RATE_INTERVAL}) are substituted",
            "labs": labs}


def write_queries(directory: Path, results: dict) -> Path | None:
    """prometheus/queries.json, when the run had monitoring (never through a symlink)."""
    if not results.get("monitoring"):
        return None
    return write_inside(Path(directory), Path(DIRECTORY) / QUERIES, json.dumps(queries(results), indent=1) + "\n")


def take_snapshot(url: str, data: Path, destination: Path) -> Path:
    """A TSDB snapshot of the Prometheus at `url` (head included), moved to `destination`."""
    time.sleep(LAST_SCRAPE_S)
    request = urllib.request.Request(f"{url}/api/v1/admin/tsdb/snapshot", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=SNAPSHOT_TIMEOUT) as reply:
        name = json.load(reply)["data"]["name"]
    made = Path(data) / "snapshots" / name
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(made, destination)  # the snapshot hard-links the lab's blocks: copy, then drop it
    shutil.rmtree(made, ignore_errors=True)
    return destination


def save(directory: Path, monitor, entry: dict) -> None:
    """Snapshot the lab's Prometheus into the results directory, recording in `entry` (the
    lab's results["monitoring"] entry) where it went or why it did not."""
    destination = Path(directory) / DIRECTORY / SNAPSHOT / monitor.lab
    entry["ended"] = time.time()
    try:
        take_snapshot(monitor.url, monitor.data, destination)
        entry["snapshot"] = str(destination.relative_to(directory))
    except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        entry["snapshot_error"] = f"{type(exc).__name__}: {exc}"
