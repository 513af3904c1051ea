"""A run's iterations in time, and what the model expects of those a link-degrade held.

Records are `RunResult.records()` rows (rank, iteration, start_time, gst_s, compute_s, …).
The experiment's results (experiment/results.py) and the Python API (deploy/lab_agents.py)
both read them through these functions, so a degrade made by an experiment's timeline and
one made by hand (`testbed fault`) while `agents.run` goes on are priced by the same rule
(each caller gives the model's prediction: the runner the point's planned one, with its
compute and the even ECMP spread; the API the run's own, over the paths it hashed onto).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from orchestrator import units


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


def entry_spread(records: list[dict], workers: int, warmup: int) -> float | None:
    """How far apart ranks 0..workers−1 (the workers) entered the allreduces after the
    `warmup` first, by their start times (cost.predict.entry_spread; Prediction.entry_spread
    is the model's). On a lab split over hosts, as far as the hosts' clocks agree. None
    without an allreduce every worker entered."""
    from orchestrator.cost.predict import entry_spread as spread_of_entries  # here: results' readers skip numpy

    rows: dict[int, dict[int, float]] = {}
    for record in records:
        start = record.get("start_time")
        if record["iteration"] >= warmup and isinstance(start, (int, float)) and math.isfinite(start):
            rows.setdefault(record["iteration"], {})[record["rank"]] = start
    return spread_of_entries([rows[i] for i in sorted(rows)], workers)


def iteration_spans(records: list[dict]) -> dict[int, tuple[float, float]]:
    """Per iteration, from the first agent's start of compute to the last agent's end of
    synchronisation (Unix times)."""
    spans: dict[int, tuple[float, float]] = {}
    for r in records:
        begin, end = r["start_time"] - r["compute_s"], r["start_time"] + r["gst_s"]
        low, high = spans.get(r["iteration"], (begin, end))
        spans[r["iteration"]] = (min(low, begin), max(high, end))
    return spans


def iterations_within(records: list[dict], begin: float, end: float) -> list[int]:
    """Iterations whose compute and synchronisation lay wholly within [begin, end] (Unix
    times): what a fault in effect over that span set alone."""
    return sorted(i for i, (low, high) in iteration_spans(records).items() if begin <= low and high <= end)


@dataclass(frozen=True)
class Degrade:
    """A link-degrade with a rate as it happened: both directions of `target` (`A-B`) at
    `rate` bit/s from `applied` to `undone` (Unix times; None: still in effect)."""

    action: str
    target: str
    rate: float
    applied: float
    undone: float | None = None
    label: str = ""  # the rate as the timeline wrote it ("50Mbit"); default: formatted

    @property
    def end(self) -> float:
        return float("inf") if self.undone is None else self.undone

    def covers(self, low: float, high: float) -> bool:
        return self.applied <= low and high <= self.end

    def overlaps(self, low: float, high: float) -> bool:
        return self.applied < high and low < self.end

    def rates(self) -> dict[tuple[str, str], float]:
        a, b = self.target.split("-")
        return {(a, b): self.rate, (b, a): self.rate}


def degrades_of(events: list[dict]) -> list[Degrade]:
    """The link-degrades with a rate among fault-log entries (the lab's journal, `{action,
    target, params, applied, undone}`): those applied, on a link named `A-B`."""
    out = []
    for event in events:
        rate = (event.get("params") or {}).get("rate")
        if (event.get("action") == "link-degrade" and rate and event.get("applied") is not None
                and len(str(event.get("target", "")).split("-")) == 2):
            out.append(Degrade("link-degrade", event["target"], float(rate), float(event["applied"]),
                               None if event.get("undone") is None else float(event["undone"])))
    return out


Predict = Callable[[dict[tuple[str, str], float]], "float | None"]  # link-direction rates → time per allreduce


def under_degrades(records: list[dict], degrades: list[Degrade], warmup: int, predict: Predict,
                   shown: Callable[[Degrade], bool] = lambda _: True) -> list[dict]:
    """Each degrade beside what the model predicts of the iterations (after `warmup`) it held
    from start to end: the same schedules with its link at its rate, and with the links of
    every other degrade that held those iterations too (named in `alongside`). An iteration
    another degrade began or ended within is priced by none: its rates changed under it.
    One entry per degrade and set of companions (one per degrade when they do not overlap);
    degrades not `shown` only keep others company (their rates were priced already)."""
    spans, sync = iteration_spans(records), sync_times(records)
    timed = [i for i in sorted(spans) if warmup <= i < len(sync)]
    predicted_for: dict[frozenset, float | None] = {}  # overlapping degrades share their rates: one prediction
    out = []
    for degrade in filter(shown, degrades):
        others = [d for d in degrades if d is not degrade]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in timed:
            low, high = spans[i]
            if not degrade.covers(low, high) or any(d.overlaps(low, high) and not d.covers(low, high) for d in others):
                continue
            groups.setdefault(tuple(j for j, d in enumerate(others) if d.covers(low, high)), []).append(i)
        for companions, held in groups.items() or [((), [])]:
            rates: dict[tuple[str, str], float] = {}
            for d in sorted([degrade, *(others[j] for j in companions)], key=lambda d: d.applied):
                rates.update(d.rates())  # the later of two on one link is the one in effect
            key = frozenset(rates.items())
            if held and key not in predicted_for:
                predicted_for[key] = predict(rates)
            predicted = predicted_for[key] if held else None
            measured = statistics.fmean(sync[i] for i in held) if held else None
            out.append({"action": degrade.action, "target": degrade.target,
                        "rate": degrade.label or units.format_rate(degrade.rate), "iterations": held,
                        "alongside": [others[j].target for j in companions],
                        "measured_s": measured, "predicted_s": predicted,
                        "ratio": measured / predicted if measured is not None and predicted else None})
    return out
