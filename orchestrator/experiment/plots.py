"""The PNG plots of a results directory, from results.json alone (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402

from orchestrator.emulation.journal import write_inside  # noqa: E402

GST_PNG = "gst.png"
ITERATIONS_PNG = "iterations.png"
LINKS_PNG = "links.png"


def _label(point: dict, varied: set[str]) -> str:
    """The algorithm, with whichever sweep axes vary in this experiment."""
    parts = [point["algorithm"]]
    if isinstance(point.get("job"), str):  # jobs: which, alone or together, where
        parts.append(" ".join(str(point.get(f)) for f in ("job", "mode", "placement") if point.get(f)))
    if "topology" in varied:
        parts.append(point["topology"])
    if "link_rate" in varied:
        parts.append(point["link_rate"])
    for axis in ("queue", "tcp_congestion"):
        if axis in varied:
            parts.append(str(point.get(axis)))
    if "size_bytes" in varied:
        parts.append(f"{point['size_bytes'] / 2**20:.3g} MiB")
    if "partitioning" in varied:
        parts.append(_partitioning(point))
    return "\n".join(parts)


def _partitioning(point: dict) -> str:
    setting = point.get("partitioning") or {}
    size, credit = setting.get("partition_bytes"), setting.get("credit_bytes")
    return (f"part {size / 2**20:.3g} MiB" if size else "whole") + (f", credit {credit / 2**20:.3g} MiB" if credit else "")


def _varied(points: list[dict]) -> set[str]:
    axes = {"topology": lambda p: p["topology"], "link_rate": lambda p: p["link_rate"],
            "queue": lambda p: p.get("queue"), "tcp_congestion": lambda p: p.get("tcp_congestion"),
            "size_bytes": lambda p: p["size_bytes"], "partitioning": _partitioning}
    return {axis for axis, read in axes.items() if len({read(p) for p in points}) > 1}


def gst_per_algorithm(results: dict, path: Path) -> Path:
    """Measured GST (mean, whiskers p50..p95) and time per synchronisation (what the ratio
    takes, results.sync_times) beside the cost model's prediction, per point."""
    points = results["points"]
    varied = _varied(points)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(points) + 2), 4.5))
    width = 0.27
    xs = range(len(points))
    measured = [(p.get("gst_s") or {}).get("mean") or 0.0 for p in points]
    low = [max(0.0, m - ((p.get("gst_s") or {}).get("p50") or m)) for p, m in zip(points, measured)]
    high = [max(0.0, ((p.get("gst_s") or {}).get("p95") or m) - m) for p, m in zip(points, measured)]
    predicted = [(p.get("predicted") or {}).get("seconds") or 0.0 for p in points]
    # what the ratio takes: faulted and warming-up iterations left out
    sync = [(p.get("sync_s") or {}).get("fault_free_mean") or 0.0 for p in points]
    ax.bar([x - width for x in xs], measured, width, yerr=[low, high], capsize=3,
           label="GST, slowest agent (mean; p50–p95)", color="#3b75af")
    ax.bar(list(xs), sync, width, label="time per synchronisation (mean, no fault)", color="#7aa6d6")
    ax.bar([x + width for x in xs], predicted, width, label="predicted", color="#ef8636", alpha=0.85)
    for x, point in zip(xs, points):
        if point["status"] != "done":
            ax.annotate(point["status"], (x - width, 0), ha="center", va="bottom", rotation=90, fontsize=8,
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
    top = max((max(p["gst_s"]["per_iteration"]) for p in points), default=0.0)
    marked: set[tuple] = set()  # the same fault at the same iteration of every point: one label
    for point in points:
        series = point["gst_s"]["per_iteration"]
        line, = ax.plot(range(len(series)), series, marker="o", markersize=3,
                        label=_label(point, varied).replace("\n", " "))
        for event in point.get("fault_events", []):
            iteration = _iteration_of(point, event.get("applied"))
            if iteration is not None:
                ax.axvline(iteration, color=line.get_color(), linestyle="--", linewidth=1)
                text = f"{event['action']} {event['target']}"
                if (iteration, text) not in marked:
                    marked.add((iteration, text))
                    ax.annotate(text, (iteration, top), rotation=90, fontsize=7, va="top", ha="right", color="#444")
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


def utilisation_by_tier(results: dict) -> dict[str, dict[str, tuple[float, float]]]:
    """Per measured point, per topology tier: (mean, busiest) utilisation of its link
    directions over the point's run: bytes sent / (rate × seconds), idle directions counted."""
    labs = {lab["name"]: lab for lab in results["labs"]}
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for point in results["points"]:
        lab, moved = labs.get(point["lab"], {}), point.get("bytes_per_link") or {}
        tiers, rate, seconds = lab.get("tiers"), lab.get("rate_bytes_per_s"), moved.get("seconds")
        if not tiers or not rate or not seconds:
            continue  # not run, or results from before tiers were recorded
        capacity = rate * seconds
        by_tier: dict[str, list[float]] = {}
        for direction, tier in tiers.items():
            by_tier.setdefault(tier, []).append(moved["measured"].get(direction, 0) / capacity)
        out[point["id"]] = {tier: (sum(u) / len(u), max(u)) for tier, u in sorted(by_tier.items())}
    return out


def link_utilisation(results: dict, path: Path) -> Path:
    """Per point, each topology tier's mean link utilisation (bars) and its busiest
    direction (marks), the fabric exporter's tiers (level0/level1, host-edge, …)."""
    by_point = utilisation_by_tier(results)
    points = [p for p in results["points"] if p["id"] in by_point]
    varied = _varied(results["points"])
    tiers = sorted({tier for shares in by_point.values() for tier in shares})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(points) * max(1, len(tiers)) / 2 + 2), 4.5))
    width = 0.8 / max(1, len(tiers))
    for index, tier in enumerate(tiers):
        xs = [x - 0.4 + width * (index + 0.5) for x in range(len(points))]
        mean = [by_point[p["id"]].get(tier, (0.0, 0.0))[0] for p in points]
        busiest = [by_point[p["id"]].get(tier, (0.0, 0.0))[1] for p in points]
        ax.bar(xs, mean, width, label=f"{tier} (mean)")
        ax.plot(xs, busiest, linestyle="none", marker="_", markersize=max(6.0, 300 * width / max(1, len(points))),
                markeredgewidth=2, color="#222")
    if points:
        ax.plot([], [], linestyle="none", marker="_", markeredgewidth=2, color="#222", label="busiest direction")
        ax.set_xticks(range(len(points)), [_label(p, varied) for p in points], fontsize=8)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no link counters measured", ha="center", transform=ax.transAxes)
    ax.axhline(1.0, color="#999", linewidth=0.8, linestyle=":")
    ax.set_ylabel("utilisation over the run (share of the link rate)")
    ax.set_title(f"{results['experiment']['name']}: link utilisation by topology tier")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


PLOTS = {GST_PNG: gst_per_algorithm, ITERATIONS_PNG: gst_per_iteration, LINKS_PNG: link_utilisation}


def draw_all(results: dict, directory: Path) -> list[Path]:
    """Every plot into `directory`, never through a symlink (savefig writes into the open
    file write_inside gives it)."""
    return [write_inside(directory, name, lambda handle, draw=draw: draw(results, handle))
            for name, draw in PLOTS.items()]
