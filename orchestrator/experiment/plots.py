"""The PNG plots of a results directory, from results.json alone (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402

GST_PNG = "gst.png"
ITERATIONS_PNG = "iterations.png"


def _label(point: dict, varied: set[str]) -> str:
    """The algorithm, with whichever sweep axes vary in this experiment."""
    parts = [point["algorithm"]]
    if "topology" in varied:
        parts.append(point["topology"])
    if "link_rate" in varied:
        parts.append(point["link_rate"])
    if "size_bytes" in varied:
        parts.append(f"{point['size_bytes'] / 2**20:.3g} MiB")
    return "\n".join(parts)


def _varied(points: list[dict]) -> set[str]:
    return {axis for axis in ("topology", "link_rate", "size_bytes") if len({p[axis] for p in points}) > 1}


def gst_per_algorithm(results: dict, path: Path) -> Path:
    """Measured GST (mean, whiskers p50..p95) beside the cost model's prediction, per point."""
    points = results["points"]
    varied = _varied(points)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(points) + 2), 4.5))
    width = 0.38
    xs = range(len(points))
    measured = [(p.get("gst_s") or {}).get("mean") or 0.0 for p in points]
    low = [max(0.0, m - ((p.get("gst_s") or {}).get("p50") or m)) for p, m in zip(points, measured)]
    high = [max(0.0, ((p.get("gst_s") or {}).get("p95") or m) - m) for p, m in zip(points, measured)]
    predicted = [(p.get("predicted") or {}).get("seconds") or 0.0 for p in points]
    ax.bar([x - width / 2 for x in xs], measured, width, yerr=[low, high], capsize=3, label="measured (mean; p50–p95)",
           color="#3b75af")
    ax.bar([x + width / 2 for x in xs], predicted, width, label="predicted", color="#ef8636", alpha=0.85)
    for x, point in zip(xs, points):
        if point["status"] != "done":
            ax.annotate(point["status"], (x - width / 2, 0), ha="center", va="bottom", rotation=90, fontsize=8,
                        color="#b00")
    ax.set_xticks(list(xs), [_label(p, varied) for p in points], fontsize=8)
    ax.set_ylabel("GST per allreduce (s)")
    ax.set_title(f"{results['experiment']['name']}: GST measured and predicted"
                 + (" (partial)" if results.get("partial") else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def gst_per_iteration(results: dict, path: Path) -> Path:
    """GST of every iteration per point, warm-up shaded, fault events marked where they fell."""
    points = [p for p in results["points"] if (p.get("gst_s") or {}).get("per_iteration")]
    varied = _varied(results["points"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for point in points:
        series = point["gst_s"]["per_iteration"]
        line, = ax.plot(range(len(series)), series, marker="o", markersize=3,
                        label=_label(point, varied).replace("\n", " "))
        for event in point.get("fault_events", []):
            iteration = _iteration_of(point, event.get("applied"))
            if iteration is not None:
                ax.axvline(iteration, color=line.get_color(), linestyle="--", linewidth=1)
                ax.annotate(f"{event['action']} {event['target']}", (iteration, max(series)), rotation=90,
                            fontsize=7, va="top", color=line.get_color())
    warmup = max((p.get("warmup", 0) for p in points), default=0)
    if warmup:
        ax.axvspan(-0.5, warmup - 0.5, color="#ddd", label="warm-up")
    ax.set_xlabel("iteration")
    ax.set_ylabel("GST (s), slowest agent")
    ax.set_title(f"{results['experiment']['name']}: GST per iteration")
    if points:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing measured", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _iteration_of(point: dict, moment: float | None) -> float | None:
    """Where a Unix time falls on the iteration axis, from the records' start times."""
    if moment is None:
        return None
    starts: dict[int, float] = {}
    for record in point.get("records", []):
        starts[record["iteration"]] = min(starts.get(record["iteration"], record["start_time"]), record["start_time"])
    before = [i for i, t in starts.items() if t <= moment]
    return max(before) if before else (0 if starts else None)


PLOTS = {GST_PNG: gst_per_algorithm, ITERATIONS_PNG: gst_per_iteration}


def draw_all(results: dict, directory: Path) -> list[Path]:
    return [draw(results, directory / name) for name, draw in PLOTS.items()]
