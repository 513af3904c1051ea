"""A traced run's steps beside the cost model's: where in an allreduce the lab falls behind
(or gets ahead of) the prediction, step by step (issue 29: "find, by measurement against
per-transfer traces, why ...").

Both sides are read the same way. An allreduce begins when its first worker enters it (a
run: the earliest `start_time` of its records; the model: the earliest exit from the one
before). A step ends when its last transfer has landed (a run: the latest `last` of its
traced receives; the model: the latest `finished` of its flows), counted from that
beginning. The model's allreduces in a row settle into the same times from the second on;
a run's vary, so each step shows the median and the slowest over the timed ones.

What a step lost is often another step's doing: a rank that entered late is still in the
step before while its partners' next step crosses the same link (HDRM on bigraph,4,2 at
4 MiB, 1.10-1.27 × the model: a pair late in step 0 shared sl0→su0 with step 1's pair for
over 100 ms), which the model's lockstep never has. So each step also counts its transfers
that shared a link direction with a transfer of another step while both were under way
(`crossings`): from the first byte sent to the last applied at the receiver, in the run
and in the model alike, over the links the prediction routed each connection on; and how
long those alone on their links and the crossed ones took against their bytes at the line's
rate (`paces`), which tells the links' emulation from the crossings. Pure:
the run's records and transfers (driver.RunResult.records/transfers) and the model's
Simulation (CompiledRun.timeline) and routes come in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple, Sequence

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


def compare(sim: Simulation | None, schedules, records: Sequence[dict], transfers: Sequence[dict], skip: int = 1,
            itemsize: int = 4) -> list[StepTimes]:
    """Every step of `schedules` ([(Partition, Schedule)], one allreduce) with its end in the
    model (`sim`, the same schedules back to back; None: the run's alone) and in the traced run."""
    counts: dict[int, list[int]] = {}
    for _, schedule in schedules:
        for index, step in enumerate(schedule.steps):
            tally = counts.setdefault(index, [0, 0])
            tally[0] += len(step)
            tally[1] += sum(t.length for t in step) * itemsize
    model = model_steps(sim, len(schedules), skip) if sim is not None else {}
    measured = measured_steps(records, transfers, skip)
    return [StepTimes(step, transfers_, bytes_, model.get(step), _median(measured.get(step, [])),
                      max(measured[step]) if measured.get(step) else None)
            for step, (transfers_, bytes_) in sorted(counts.items())]


@dataclass(frozen=True)
class Crossing:
    """A step's transfers that shared a link with another step's while both were under way,
    over the allreduces looked at: how many of how many, for how long (the median of each
    one's longest overlap), and the longest ("h01→h02 of step 0 on sw→h02 while ...")."""

    step: int
    transfers: int  # over every allreduce looked at (a step's transfers × allreduces)
    crossed: int
    median_s: float | None
    longest: str


# overlaps shorter than this are a message boundary, not a shared link
MIN_OVERLAP_S = 0.001


class Wire(NamedTuple):
    """A transfer under way: from its first byte sent to its last applied at the receiver."""

    iteration: int
    partition: int
    step: int
    src: int
    dst: int
    start: float
    end: float
    elements: int = 0  # what it carried (0: not known)


def run_wire(transfers: Sequence[dict]) -> list[Wire]:
    """Every traced transfer with both ends: from the send's first byte to the receive's
    last chunk applied (a receiver applies a step's chunks once it has entered the step:
    bytes of a step it has not reached wait in its buffers meanwhile, under way still)."""
    def key(t: dict, src: int, dst: int) -> tuple:
        return t["iteration"], t["partition"], t["step"], src, dst, t["offset"], t["count"]

    sends = {key(t, t["rank"], t["peer"]): t for t in transfers if t["kind"] == "send"}
    out = []
    for t in transfers:
        if t["kind"] != "receive":
            continue
        send = sends.get(key(t, t["peer"], t["rank"]))
        if send is not None and send["first"] and t["last"] and t["last"] > send["first"]:
            out.append(Wire(t["iteration"], t["partition"], t["step"], t["peer"], t["rank"], send["first"], t["last"],
                            t["count"]))
    return out


def model_wire(sim: Simulation, per_iteration: int) -> list[Wire]:
    """Every flow of the model's allreduces, as `run_wire` reads a run's: from its first
    byte to its last chunk applied."""
    per = max(1, per_iteration)
    return [Wire(f.partition // per, f.partition % per, f.step, f.src, f.dst, f.flowing_at, f.finished, f.hi - f.lo)
            for f in sim.flows if f.flowing_at is not None and f.finished is not None and f.finished > f.flowing_at]


def crossings(routes, schedules, nodes: Sequence[str], wire: Sequence[Wire], skip: int = 1) -> list[Crossing]:
    """Per step of `schedules`, its transfers under way (`run_wire` or `model_wire`;
    allreduces `skip` on) that shared a link direction of `routes` (the prediction's:
    CompiledRun.routes) with another step's transfer, or another partition's, while both
    were under way; not with another transfer of its own connection, whose steps queue in
    order on it."""
    return _crossings(*_overlaps(routes, schedules, nodes, wire, skip))


def _crossings(overlaps: list[_Overlap], steps: list[int]) -> list[Crossing]:
    found: dict[int, list[tuple[float, str]]] = {step: [] for step in steps}
    counted: dict[int, int] = dict.fromkeys(steps, 0)
    for o in overlaps:
        counted[o.wire.step] += 1
        if o.seconds >= MIN_OVERLAP_S:
            found[o.wire.step].append((o.seconds, o.what))
    out = []
    for step in steps:
        hits = found[step]
        out.append(Crossing(step, counted[step], len(hits), _median([h[0] for h in hits]),
                            max(hits)[1] if hits else ""))
    return out


class _Overlap(NamedTuple):
    wire: Wire
    links: frozenset[int]  # the link directions it crossed
    seconds: float  # its longest overlap with another step's transfer on one of them
    what: str  # that overlap, named


def _overlaps(routes, schedules, nodes: Sequence[str], wire: Sequence[Wire],
              skip: int) -> tuple[list[_Overlap], list[int]]:
    """Every transfer of `wire` (allreduces `skip` on) with its longest overlap (`crossings`),
    and the steps of `schedules`."""
    nic: dict[tuple[int, int, int, int], int | None] = {}
    for p, (_, schedule) in enumerate(schedules):
        for index, t in schedule.transfers():
            nic.setdefault((p, index, t.src, t.dst), t.nic)
    links: dict[tuple[int, int, int, int], frozenset[int]] = {}
    for key, via in nic.items():
        usage, _ = routes.usage(nodes[key[2]], nodes[key[3]], via)
        links[key] = frozenset(link for link, share in usage if share > 0)

    def where(w: Wire) -> tuple[int, int, int, int]:
        return w.partition, w.step, w.src, w.dst

    wire = [w for w in wire if where(w) in links]
    by_link: dict[int, list[Wire]] = {}
    for w in wire:
        for link in links[where(w)]:
            by_link.setdefault(link, []).append(w)
    out = []
    for w in wire:
        if w.iteration < skip:
            continue
        connection = (w.src, w.dst, nic[where(w)])
        best, what = 0.0, ""
        for link in links[where(w)]:
            for other in by_link[link]:
                if (other.iteration, other.partition, other.step) == (w.iteration, w.partition, w.step) or \
                        (other.src, other.dst, nic[where(other)]) == connection:
                    continue
                overlap = min(w.end, other.end) - max(w.start, other.start)
                if overlap > best:
                    d = routes.directions[link]
                    when = " of the allreduce before" if other.iteration < w.iteration else (
                        " of the next allreduce" if other.iteration > w.iteration else "")
                    best, what = overlap, (f"{nodes[other.src]}→{nodes[other.dst]} of step {other.step}{when} on "
                                           f"{d.src}→{d.dst} while {nodes[w.src]}→{nodes[w.dst]} of step {w.step} "
                                           f"was under way, {overlap * 1e3:,.0f} ms")
        out.append(_Overlap(w, links[where(w)], best, what))
    return out, sorted({key[1] for key in nic})


@dataclass(frozen=True)
class Pace:
    """How long transfers took against their bytes at their slowest link's payload rate
    (1.0: at the line's rate; α and the path's delay add to it): `count` of them, and the
    10th, 50th and 90th percentiles and the largest of that ratio."""

    count: int
    p10: float | None
    p50: float | None
    p90: float | None
    largest: float | None


def paces(routes, schedules, nodes: Sequence[str], wire: Sequence[Wire], capacities: Sequence[float],
          itemsize: int = 4, skip: int = 1) -> dict[str, Pace]:
    """{"alone": …, "crossed": …}: the transfers of `wire` that had every link they crossed to
    themselves (no overlap of MIN_OVERLAP_S with another step's: `crossings`), and those that
    did not, each as a Pace at `capacities` (Routes.capacities: bytes/s per link direction).
    A run whose lone transfers keep to the line's rate while its crossed ones do not lost its
    time to the crossings, not to the links' emulation (HTB, TCP); one whose lone ones are
    slow too, to the emulation. Transfers of unknown size are left out."""
    return _paces(_overlaps(routes, schedules, nodes, wire, skip)[0], capacities, itemsize)


def crossings_and_paces(routes, schedules, nodes: Sequence[str], wire: Sequence[Wire], capacities: Sequence[float],
                        itemsize: int = 4, skip: int = 1) -> tuple[list[Crossing], dict[str, Pace]]:
    """`crossings` and `paces` of the same transfers, from one search of their overlaps."""
    overlaps, steps = _overlaps(routes, schedules, nodes, wire, skip)
    return _crossings(overlaps, steps), _paces(overlaps, capacities, itemsize)


def _paces(overlaps: list[_Overlap], capacities: Sequence[float], itemsize: int) -> dict[str, Pace]:
    groups: dict[str, list[float]] = {"alone": [], "crossed": []}
    for o in overlaps:
        if not o.wire.elements or not o.links:
            continue
        line = o.wire.elements * itemsize / min(capacities[link] for link in o.links)
        groups["crossed" if o.seconds >= MIN_OVERLAP_S else "alone"].append((o.wire.end - o.wire.start) / line)
    return {name: _pace(sorted(ratios)) for name, ratios in groups.items()}


def _pace(ratios: list[float]) -> Pace:
    if not ratios:
        return Pace(0, None, None, None, None)
    at = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]  # noqa: E731
    return Pace(len(ratios), at(0.1), _median(ratios), at(0.9), ratios[-1])


def pace_lines(run: dict[str, Pace], model: dict[str, Pace] | None = None) -> list[str]:
    """`paces` as text, the run's beside the model's."""
    def one(p: Pace) -> str:
        if not p.count:
            return "none"
        return f"{p.p50:.3f} × (p10 {p.p10:.3f}, p90 {p.p90:.3f}, largest {p.largest:.3f}; {p.count})"

    lines = ["time on the wire / bytes at the slowest link's rate, median (first byte sent to last applied):"]
    for name, label in (("alone", "alone on their links"), ("crossed", "crossed by another step")):
        line = f"  {label:<24} run {one(run[name])}"
        if model is not None:
            line += f"; model {one(model[name])}"
        lines.append(line)
    return lines


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:,.1f}"


def _share(c: Crossing | None) -> str:
    return "–" if c is None or not c.transfers else f"{c.crossed / c.transfers:.0%}"


def table(rows: Sequence[StepTimes], crossed: Sequence[Crossing] = (), modelled: Sequence[Crossing] = ()) -> str:
    """The steps as text: each step's end in the model and in the run (median, slowest), how
    far the run's median trails the model's ("behind") and how much of that it added since
    the step before ("grew": a difference of medians); given `crossed` (and the model's own
    `modelled`), the share of its transfers that shared a link with another step's while
    both were under way, the median overlap, and the longest per step in the run."""
    by_step, in_model = {c.step: c for c in crossed}, {c.step: c for c in modelled}
    lines = [f"{'step':>4} {'transfers':>9} {'bytes':>12} {'model ends':>11} {'run ends':>10} "
             f"{'slowest':>10} {'behind':>9} {'grew':>9}"
             + (f" {'crossed':>8} {'for':>7} {'in model':>9}" if crossed else "")
             + "   (ms from the allreduce's first entry; per allreduce)"]
    before = 0.0
    for row in rows:
        behind = row.behind
        grew = None if behind is None else behind - before
        line = (f"{row.step:>4} {row.transfers:>9} {row.bytes:>12,} {_ms(row.model_end):>11} "
                f"{_ms(row.measured_end):>10} {_ms(row.slowest_end):>10} {_ms(behind):>9} {_ms(grew):>9}")
        c = by_step.get(row.step)
        if crossed:
            line += f" {_share(c):>8} {_ms(c.median_s) if c else '–':>7} {_share(in_model.get(row.step)):>9}"
        lines.append(line)
        if behind is not None:
            before = behind
    longest = [f"  step {c.step}: {c.longest}" for c in crossed if c.longest]
    if longest:
        lines += ["crossed: a transfer of another step on the same link while both were under way "
                  "(first byte sent to last applied); the longest per step:", *longest]
    return "\n".join(lines)
