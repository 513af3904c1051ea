"""A traced run's steps beside the cost model's: where in an allreduce the lab falls behind
(or gets ahead of) the prediction, step by step (issue 29: "find, by measurement against
per-transfer traces, why ...").

Both sides are read the same way. An allreduce begins when its first worker enters it (a
run: the earliest `start_time` of its records; the model: the earliest exit from the one
before). A step ends when its last transfer has landed (a run: the latest `last` of its
traced receives; the model: the latest `finished` of its flows), counted from that
beginning. The model's allreduces in a row settle into the same times from the second on;
a run's vary, so each step shows the median and the slowest over the timed ones. Pure:
the run's records and transfers (driver.RunResult.records/transfers) and the model's
Simulation (CompiledRun.timeline) come in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from orchestrator.cost.simulate import Simulation


@dataclass(frozen=True)
class StepTimes:
    """One step of an allreduce: when it ended in the model and in the run (seconds from the
    allreduce's beginning; None where no iteration had it), and how much it moved."""

    step: int
    transfers: int  # per allreduce, every partition
    bytes: int  # per allreduce
    model_end: float | None
    measured_end: float | None  # median over the timed allreduces
    slowest_end: float | None  # the slowest of them

    @property
    def behind(self) -> float | None:
        """Seconds the run's median end trails the model's (negative: ahead)."""
        if self.model_end is None or self.measured_end is None:
            return None
        return self.measured_end - self.model_end


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def model_steps(sim: Simulation, per_iteration: int, skip: int = 1) -> dict[int, float]:
    """Step → when it ended in the model's allreduces from `skip` on (the median; they settle
    into one time), from each allreduce's first entry. `per_iteration`: partitions per allreduce."""
    ends: dict[int, dict[int, float]] = {}  # iteration → step → end
    for flow in sim.flows:
        if flow.finished is None:
            continue
        iteration = flow.partition // max(1, per_iteration)
        by_step = ends.setdefault(iteration, {})
        by_step[flow.step] = max(by_step.get(flow.step, 0.0), flow.finished)
    out: dict[int, list[float]] = {}
    for iteration, by_step in ends.items():
        if iteration < skip:
            continue
        begun = min(sim.exits[iteration - 1].values(), default=0.0) if iteration else 0.0
        for step, end in by_step.items():
            out.setdefault(step, []).append(end - begun)
    return {step: statistics.median(values) for step, values in out.items()}


def measured_steps(records: Sequence[dict], transfers: Sequence[dict], skip: int = 1) -> dict[int, list[float]]:
    """Step → when it ended in each of the run's allreduces from `skip` on, from that
    allreduce's first entry (records' start_time; traced receives' `last`)."""
    begun: dict[int, float] = {}
    for record in records:
        iteration = record["iteration"]
        begun[iteration] = min(begun.get(iteration, record["start_time"]), record["start_time"])
    ends: dict[tuple[int, int], float] = {}
    for t in transfers:
        if t["kind"] != "receive" or t["iteration"] < skip or t["iteration"] not in begun or not t["last"]:
            continue
        key = (t["iteration"], t["step"])
        ends[key] = max(ends.get(key, t["last"]), t["last"])
    out: dict[int, list[float]] = {}
    for (iteration, step), end in sorted(ends.items()):
        out.setdefault(step, []).append(end - begun[iteration])
    return out


def compare(sim: Simulation, schedules, records: Sequence[dict], transfers: Sequence[dict], skip: int = 1,
            itemsize: int = 4) -> list[StepTimes]:
    """Every step of `schedules` ([(Partition, Schedule)], one allreduce) with its end in the
    model (`sim`, the same schedules back to back) and in the traced run."""
    counts: dict[int, list[int]] = {}
    for _, schedule in schedules:
        for index, step in enumerate(schedule.steps):
            tally = counts.setdefault(index, [0, 0])
            tally[0] += len(step)
            tally[1] += sum(t.length for t in step) * itemsize
    model = model_steps(sim, len(schedules), skip)
    measured = measured_steps(records, transfers, skip)
    return [StepTimes(step, transfers_, bytes_, model.get(step), _median(measured.get(step, [])),
                      max(measured[step]) if measured.get(step) else None)
            for step, (transfers_, bytes_) in sorted(counts.items())]


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:,.1f}"


def table(rows: Sequence[StepTimes]) -> str:
    """The steps as text: each step's end in the model and the run, and what the run lost (or
    gained) in that step over the step before."""
    lines = [f"{'step':>4} {'transfers':>9} {'bytes':>12} {'model ends':>11} {'run ends':>10} "
             f"{'slowest':>10} {'behind':>9} {'in step':>9}   (ms from the allreduce's first entry)"]
    before = 0.0
    for row in rows:
        behind = row.behind
        gained = None if behind is None else behind - before
        lines.append(f"{row.step:>4} {row.transfers:>9} {row.bytes:>12,} {_ms(row.model_end):>11} "
                     f"{_ms(row.measured_end):>10} {_ms(row.slowest_end):>10} {_ms(behind):>9} {_ms(gained):>9}")
        if behind is not None:
            before = behind
    return "\n".join(lines)
