"""Rendering a results directory from its results.json: CSV files, plots, summary.md.

`testbed report DIR` calls `render(DIR)`; `testbed run` calls it at the end, interrupted or not.
Every file is written whole, through journal.write_inside: never through a symlink (a
symlinked DIR, or a symlink where one of its files goes, is refused in one line before
anything is written), and a directory the user may not write is one line too.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from orchestrator import units
from orchestrator.emulation.journal import write_inside
from orchestrator.errors import BadUsage
from orchestrator.experiment import jobs, plots, snapshot
from orchestrator.experiment import results as results_lib
from orchestrator.spec.loader import display_path

RESULTS_CSV = "results.csv"
ITERATIONS_CSV = "iterations.csv"
SUMMARY = "summary.md"

def _verdict(point: dict) -> str:
    return (point.get("fidelity") or {}).get("verdict", "–")


def _checker(point: dict) -> str:
    clean = (point.get("checker") or {}).get("clean")
    return "–" if clean is None else "clean" if clean else "NOT clean"


# results.csv: column → how to read it from a point
COLUMNS = {
    "id": lambda p: p["id"], "lab": lambda p: p["lab"], "topology": lambda p: p["topology"],
    "link_rate": lambda p: p["link_rate"], "size_bytes": lambda p: p["size_bytes"],
    "algorithm": lambda p: p["algorithm"], "workers": lambda p: len(p["workers"]),
    "servers": lambda p: len(p["servers"]), "status": lambda p: p["status"],
    "gst_mean_s": lambda p: _get(p, "gst_s", "mean"), "gst_p50_s": lambda p: _get(p, "gst_s", "p50"),
    "gst_p95_s": lambda p: _get(p, "gst_s", "p95"), "sync_fault_free_mean_s": lambda p: _get(p, "sync_s", "fault_free_mean"),
    "predicted_s": lambda p: _get(p, "predicted", "seconds"),
    "predicted_bandwidth_s": lambda p: _part(p, "bandwidth"), "predicted_latency_s": lambda p: _part(p, "latency"),
    "predicted_waiting_s": lambda p: _part(p, "waiting"), "predicted_skew_s": lambda p: _part(p, "skew"),
    "predicted_compute": lambda p: _get(p, "predicted", "compute"),
    "predicted_routes": lambda p: _get(p, "predicted", "routes"),
    "planned_s": lambda p: _get(p, "predicted", "planned_seconds"),
    "ratio": lambda p: p.get("ratio"), "algbw_bytes_per_s": lambda p: p.get("algbw_bytes_per_s"),
    "busbw_bytes_per_s": lambda p: p.get("busbw_bytes_per_s"),
    "iteration_mean_s": lambda p: _get(p, "iteration_s", "mean"),
    "link_bytes_measured": lambda p: sum((p.get("bytes_per_link") or {}).get("measured", {}).values()),
    "link_drops": lambda p: sum(_queues(p, "drops").values()),
    "link_ecn_marks": lambda p: sum(_queues(p, "marks").values()),
    "peak_queue_delay_s": lambda p: max(_queues(p, "peak_queue_delay_s").values(), default=None),
    "fault_events": lambda p: len(p.get("fault_events", [])), "error": lambda p: p.get("error") or "",
    "verdict": _verdict, "checker": _checker, "cpu_idle_share": lambda p: (p.get("fidelity") or {}).get("cpu_idle_share"),
    "verdict_reasons": lambda p: "; ".join((p.get("fidelity") or {}).get("reasons", [])),
}
ITERATION_COLUMNS = ("id", "algorithm", "iteration", "rank", "node", "gst_s", "compute_s", "start_time",
                     "bytes_sent", "bytes_received", "verified")


def _get(point: dict, key: str, field: str):
    return (point.get(key) or {}).get(field)


def _queues(point: dict, field: str) -> dict:
    return (point.get("queues_per_link") or {}).get(field) or {}


def _part(point: dict, cause: str):
    return ((point.get("predicted") or {}).get("parts") or {}).get(cause)


def _attribution_lines(results: dict) -> list[str]:
    """Where the model puts each point's predicted time: the busiest link's bytes at its
    rate (bandwidth), α on the messages (latency), and the rest (waiting on dependencies
    while that link idles)."""
    rows = []
    for p in results["points"]:
        parts, total = (p.get("predicted") or {}).get("parts"), _get(p, "predicted", "seconds")
        if not parts or not total:
            continue
        alpha = _get(p, "predicted", "latency_s")
        shares = [f"{_seconds(parts.get(k))} ({(parts.get(k) or 0) / total:.0%})" if parts.get(k) is not None else "–"
                  for k in ("bandwidth", "latency", "waiting", "skew")]
        computed = _get(p, "predicted", "compute") or ("drawn" if parts.get("skew") is not None else "–")
        routes = _get(p, "predicted", "routes") or "–"
        rows.append(f"| {p['id']} | {_seconds(total)} | " + " | ".join(shares)
                    + f" | {computed} | {routes} | {'–' if alpha is None else f'{alpha * 1e6:,.0f}'} |")
    if not rows:
        return []
    return ["", "## Where the model puts the time", "",
            "Per point, the predicted time per synchronisation split by cause: the busiest link direction's "
            "bytes at its rate (bandwidth), α on every message (latency; α as measured on the lab, "
            "cost/latency.py), ranks waiting on each other while that link idles (waiting), and workers "
            "entering apart (skew): after a run, from when each worker entered its first iteration and the "
            "compute each measured in every iteration (compute: measured; the plan's figure, from the "
            "compute stragglers were drawn, is `planned_seconds` in results.json). On a lab with ECMP each "
            "point is predicted over the paths its connections hashed onto (routes: hashed), which its "
            "plan, spreading them evenly, could not know; the plan's figure is `planned_seconds` there too.", "",
            "| point | predicted s | bandwidth s | latency s | waiting s | skew s | compute | routes | α µs |",
            "|---|---|---|---|---|---|---|---|---|", *rows]


def render(directory: Path, results: dict | None = None) -> list[Path]:
    """Write every derived file of `directory` again; the files written."""
    directory = Path(directory)
    results = results if results is not None else results_lib.load(directory)
    names = [RESULTS_CSV, ITERATIONS_CSV, *plots.PLOTS, SUMMARY]
    names += [snapshot.DIRECTORY, f"{snapshot.DIRECTORY}/{snapshot.QUERIES}"] if results.get("monitoring") else []
    _refuse_symlinks(directory, names)
    written = [write_csv(results, directory / RESULTS_CSV), write_iterations(results, directory / ITERATIONS_CSV)]
    written += plots.draw_all(results, directory)
    written.append(write_summary(results, directory / SUMMARY))
    if (queries := snapshot.write_queries(directory, results)) is not None:
        written.append(queries)
    return written


def _refuse_symlinks(directory: Path, names: list[str]) -> None:
    """One line, before anything is written, if `directory` or a path render writes in it is a
    symlink (write_inside refuses each again as it writes)."""
    for path in [directory] + [directory / name for name in names]:
        if path.is_symlink():
            what = "the results directory" if path == directory else "a file report writes"
            raise BadUsage(f"{display_path(path)}: is a symlink ({what}); testbed writes no file through a "
                           f"symlink: remove the link, or render a copy of the directory")
    if not directory.is_dir():
        raise BadUsage(f"{display_path(directory)}: not a directory: give a directory `testbed run` wrote")


def _csv_text(header, rows) -> str:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    return text.getvalue()


def write_csv(results: dict, path: Path) -> Path:
    rows = ([_cell(read(point)) for read in COLUMNS.values()] for point in results["points"])
    return write_inside(path.parent, path.name, _csv_text(COLUMNS, rows))


def write_iterations(results: dict, path: Path) -> Path:
    def rows():
        for point in results["points"]:
            for record in point.get("records", []):
                row = {"id": point["id"], "algorithm": point["algorithm"], **record}
                yield [_cell(row.get(c)) for c in ITERATION_COLUMNS]

    return write_inside(path.parent, path.name, _csv_text(ITERATION_COLUMNS, rows()))


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _seconds(value) -> str:
    return "–" if value is None else f"{value:.4g}"


def _rate(bytes_per_second) -> str:
    return "–" if bytes_per_second is None else f"{bytes_per_second * 8 / 1e6:.4g}"


def table_rows(results: dict) -> list[list[str]]:
    """The summary table: one row per point (also what the CLI prints at the end)."""
    rows = []
    for p in results["points"]:
        ratio = p.get("ratio")
        rows.append([p["id"], p["algorithm"], p["topology"], p["link_rate"], f"{p['size_bytes'] / 2**20:.3g}",
                     p["status"], _seconds(_get(p, "gst_s", "mean")), _seconds(_get(p, "gst_s", "p50")),
                     _seconds(_get(p, "gst_s", "p95")), _seconds(_get(p, "sync_s", "fault_free_mean")),
                     _seconds(_get(p, "predicted", "seconds")),
                     "–" if ratio is None else f"{ratio:.3f}", _rate(p.get("algbw_bytes_per_s")),
                     _rate(p.get("busbw_bytes_per_s")), str(len(p.get("fault_events", []))), _checker(p), _verdict(p)])
    return rows



TABLE_HEADER = ["point", "algorithm", "topology", "rate", "MiB", "status", "GST mean s", "p50 s", "p95 s",
                "sync s, no fault", "predicted s", "ratio", "algbw Mbit/s", "busbw Mbit/s", "faults", "checker", "verdict"]


def write_summary(results: dict, path: Path) -> Path:
    experiment = results["experiment"]
    status = results["status"] + (f" ({results['error']})" if results.get("error") else "")
    lines = [f"# {experiment['name']}", ""]
    if experiment.get("description"):
        lines += [experiment["description"], ""]
    wall = results.get("wall_s")
    lines += [f"- status: **{status}**", f"- started {results['started']}, finished {results.get('finished') or '–'}"
              + (f" ({wall:.1f} s)" if wall is not None else ""),
              f"- labs: " + ", ".join(f"{lab['name']} ({lab['topology']}, {lab['link_rate']}, "
                                      f"{lab['spec']['servers']['runtime']})" for lab in results["labs"]),
              f"- experiment file: [{experiment['file']}]({experiment['file']}); all numbers: "
              f"[results.json](results.json), [results.csv]({RESULTS_CSV}), [iterations.csv]({ITERATIONS_CSV})",
              "- versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v), "",
              "GST is the slowest agent's synchronisation time per iteration (warm-up left out); sync is the "
              "time per synchronisation: from the end of the last to the end of this one, less the compute "
              "between (NCCL-tests' time per operation; GST also counts an early agent waiting for late ones to "
              "enter); ratio = mean sync over the iterations no fault touched (nor a re-formed membership's "
              "first, warming up) / predicted; algbw = S / GST, busbw = algbw × 2(n−1)/n (REFERENCE.md).", "",
              "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += _attribution_lines(results)
    shared = jobs.table_rows(results)
    if shared:
        lines += ["", "## Jobs on one fabric", "", "Each job's time per synchronisation alone and with the other jobs "
                  "at once, measured / predicted (the model simulates every job's flows together), and the "
                  "interference factor, together / alone:", "", "| " + " | ".join(jobs.HEADER) + " |",
                  "|" + "---|" * len(jobs.HEADER)]
        lines += ["| " + " | ".join(row) + " |" for row in shared]
    degraded = [p for p in results["points"] if (p.get("fidelity") or {}).get("reasons")]
    if degraded:
        lines += ["", "## Fidelity", "", "A point is \"degraded\" when its figure may not be the emulated network's "
                  "(the machine may have set it), \"model off\" when the machine kept up but the cost model does "
                  "not explain the figure (measured / predicted outside [0.90, 1.10]):", ""]
        lines += [f"- {p['id']} ({p['fidelity'].get('verdict', '–')}): " + "; ".join(p["fidelity"]["reasons"])
                  for p in degraded]
    held = [(p["id"], u) for p in results["points"] for u in p.get("under_faults") or []]
    if held:
        lines += ["", "## Under faults", "", "Each link-degrade with a rate beside the model's prediction for the same "
                  "schedules with that link at that rate, over the iterations it held from start to end:", "",
                  "| point | fault | iterations | sync s | predicted s | ratio |", "|---|---|---|---|---|---|"]
        lines += [f"| {pid} | {u['action']} {u['target']} to {u['rate']}"
                  f"{' with ' + ', '.join(u['alongside']) if u.get('alongside') else ''} | {_iterations(u['iterations'])} | "
                  f"{_seconds(u.get('measured_s'))} | {_seconds(u.get('predicted_s'))} | "
                  f"{'–' if u.get('ratio') is None else format(u['ratio'], '.3f')} |" for pid, u in held]
    repaced = [(p["id"], r) for p in results["points"] for r in p.get("repaced") or []]
    if repaced:
        lines += ["", "## Re-pacing", "", "When the links changed under a running point (a link-degrade applied or "
                  "undone), its agents were paced at the shares over the links as they were then, from their next "
                  "iteration:", "", "| point | at | link directions at a rate of their own |", "|---|---|---|"]
        lines += [f"| {pid} | {_clock(r.get('at'))} | "
                  f"{', '.join(f'{link} {units.format_rate(rate)}' for link, rate in (r.get('rates') or {}).items()) or 'none'} |"
                  for pid, r in repaced]
    checked = [p for p in results["points"] if (p.get("checker") or {}).get("clean") is not None]
    if checked:
        lines += ["", "## History checker", "", "Every survivor holds the same parameters after each iteration, and "
                  "each aggregate is exactly the sum of the contributions it claims:", ""]
        lines += [f"- {p['id']}: {'clean' if p['checker']['clean'] else 'NOT CLEAN'} ({p['checker']['summary']})"
                  for p in checked]
    failed = [p for p in results["points"] if p.get("error")]
    if failed:
        lines += ["", "## Errors", ""] + [f"- {p['id']}: {p['error']}" for p in failed]
    events = [(p["id"], e) for p in results["points"] for e in p.get("fault_events", [])]
    if events:
        lines += ["", "## Fault events", "", "| point | action | target | planned | applied | undone | error |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {pid} | {e['action']} | {e['target']} | {_clock(e.get('planned'))} | {_clock(e.get('applied'))} "
                  f"| {_clock(e.get('undone'))} | {e.get('error') or ''} |" for pid, e in events]
    lines += _monitoring_lines(results)
    lines += ["", f"![GST per algorithm]({plots.GST_PNG})", "", f"![GST per iteration]({plots.ITERATIONS_PNG})", "",
              f"![Link utilisation by tier]({plots.LINKS_PNG})", ""]
    return write_inside(path.parent, path.name, "\n".join(lines))


def _iterations(iterations: list[int]) -> str:
    if not iterations:
        return "none whole"
    return f"{iterations[0]}–{iterations[-1]}" if iterations == list(range(iterations[0], iterations[-1] + 1)) \
        else ", ".join(map(str, iterations))


def _monitoring_lines(results: dict) -> list[str]:
    monitored = results.get("monitoring") or {}
    if not monitored:
        return []
    lines = ["", "## Prometheus", "",
             f"The Grafana dashboards' queries with this run's lab and times: "
             f"[{snapshot.DIRECTORY}/{snapshot.QUERIES}]({snapshot.DIRECTORY}/{snapshot.QUERIES}).", ""]
    for lab, entry in monitored.items():
        where = entry.get("snapshot")
        lines.append(f"- {lab}: " + (f"TSDB snapshot in [{where}]({where})" if where
                                      else f"no snapshot ({entry.get('snapshot_error') or 'not taken'})"))
    return lines


def _clock(moment) -> str:
    import datetime

    if moment is None:
        return "–"
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
