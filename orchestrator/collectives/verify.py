"""Does an algorithm reduce exactly? What the project checks of its own algorithms, for any
registered one (pure, in process; `testbed check-algorithm` runs it on a user's plugin).

Every case builds the algorithm's schedules (one per partition, as a run does), runs them on
int64 gradients with `simulate`'s rules (a step's sends read the buffers as the step began),
and checks that every worker ends with the exact sum of all workers' gradients over the whole
buffer, so that every rank ends identical. A wrong result is named by the rank, the bytes
and the step that last wrote them (or that none did).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.collectives.schedule import Schedule, ScheduleError, apply, validate

ITEMSIZE = 4  # bytes per element of the gradients a run moves (float32)
RANKS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
SIZES = (1, 7, 64, 1000, 4099)  # elements: one, fewer than ranks, even, odd and prime


@dataclass(frozen=True)
class Case:
    """One check: the algorithm over `ctx` on `size` elements, cut into `parts` partitions."""

    ctx: Context
    size: int
    partition_bytes: int | None = None
    label: str = ""  # the topology it runs on, if any

    def describe(self) -> str:
        where = f" on {self.label}" if self.label else ""
        cut = f", partitions of {self.partition_bytes} B" if self.partition_bytes else ""
        options = f", options {self.ctx.options}" if self.ctx.options else ""
        return f"{self.ctx.workers} workers{where}, {self.size} elements{cut}{options}"


@dataclass
class Outcome:
    checked: int = 0
    refused: list[str] = field(default_factory=list)  # cases the algorithm declined (ValueError)
    failures: list[str] = field(default_factory=list)


def generic_cases(ranks=RANKS, sizes=SIZES) -> list[Case]:
    """Topology-oblivious contexts: every rank count × size, whole and in three partitions."""
    out = []
    for n in ranks:
        for size in sizes:
            out.append(Case(Context(n), size))
            if size >= 3:
                out.append(Case(Context(n), size, partition_bytes=-(-size // 3) * ITEMSIZE))
    return out


def topology_cases(topologies: dict, sizes=(7, 1000)) -> list[Case]:
    """Every server of each topology a worker (label → Topology), whole and partitioned."""
    out = []
    for label, topology in topologies.items():
        nodes = tuple(s.name for s in topology.servers)
        for size in sizes:
            ctx = Context(len(nodes), topology, nodes)
            out += [Case(ctx, size, label=label), Case(ctx, size, -(-size // 2) * ITEMSIZE, label)]
    return out


def check(name: str, cases: list[Case], options: dict | None = None, seed: int = 0) -> Outcome:
    """Run every case; ValueError for an unknown algorithm or options it refuses."""
    registry.get(name)
    options = registry.check_options(name, options)
    rng = np.random.default_rng(seed)
    outcome = Outcome()
    for case in cases:
        case = replace(case, ctx=replace(case.ctx, options=options)) if options else case
        try:
            built = registry.schedules(name, case.ctx, case.size,
                                       partitions([case.size], case.partition_bytes, ITEMSIZE))
        except ScheduleError as exc:
            outcome.checked += 1
            outcome.failures.append(f"{case.describe()}: {exc}")
            continue
        except ValueError as exc:  # the algorithm declines this case (a rank count, a topology)
            outcome.refused.append(f"{case.describe()}: {exc}")
            continue
        except Exception as exc:  # a plugin's bug: said with the case, not a traceback
            outcome.checked += 1
            outcome.failures.append(f"{case.describe()}: building raised {type(exc).__name__}: {exc}")
            continue
        outcome.checked += 1
        try:
            problem = _reduces([s for _, s in built], case.ctx.workers, case.size, rng)
        except Exception as exc:  # a schedule too odd to run: said with the case
            problem = f"running the schedule raised {type(exc).__name__}: {exc}"
        if problem:
            outcome.failures.append(f"{case.describe()}: {problem}")
    return outcome


def _reduces(schedules: list[Schedule], workers: int, size: int, rng: np.random.Generator) -> str | None:
    """None when the schedules, run in order, leave every worker the exact sum; else what
    went wrong, naming the rank, its byte range and the step that last wrote it."""
    if not schedules:
        return None if size == 0 else "built no schedule"
    ranks = schedules[0].ranks
    for index, schedule in enumerate(schedules):
        if schedule.size != size:
            return f"partition {index}: its schedule's buffer has {schedule.size} elements, not the {size} asked"
        if any(not 0 <= w < schedule.ranks for w in schedule.workers):
            return f"partition {index}: its workers {schedule.workers} are not all among its {schedule.ranks} ranks"
        if schedule.ranks != ranks or len(schedule.workers) != workers or schedule.workers != schedules[0].workers:
            return f"partition {index}: its schedule has other ranks or workers than partition 0's"
        try:
            validate(schedule)
        except ScheduleError as exc:
            return f"partition {index}: {exc}"
    gradients = rng.integers(-1_000, 1_000, size=(workers, size), dtype=np.int64)
    buffers = np.zeros((ranks, size), dtype=np.int64)
    buffers[list(schedules[0].workers)] = gradients
    written = np.full((ranks, size), -1, dtype=np.int64)  # (partition, step) that last wrote, packed
    sender = np.full((ranks, size), -1, dtype=np.int64)  # and the rank that sent it
    for p, schedule in enumerate(schedules):
        def landed(step: int, t, p: int = p) -> None:
            written[t.dst, t.offset:t.end] = p * 1_000_000 + step
            sender[t.dst, t.offset:t.end] = t.src

        apply(schedule, buffers, landed)
    expected = gradients.sum(axis=0)
    for rank in schedules[0].workers:
        wrong = np.flatnonzero(buffers[rank] != expected)
        if wrong.size:
            first = int(wrong[0])
            last = first  # the run of wrong elements from the first
            while last + 1 < size and buffers[rank, last + 1] != expected[last + 1]:
                last += 1
            where = written[rank, first]
            by = "no step wrote them (the rank kept its own gradient there)" if where < 0 else (
                f"last written in partition {where // 1_000_000}, step {where % 1_000_000}"
                if len(schedules) > 1 else f"last written in step {where % 1_000_000}")
            if where >= 0:
                by += f", by rank {sender[rank, first]}"
            return (f"rank {rank} ends wrong on bytes [{first * ITEMSIZE}, {(last + 1) * ITEMSIZE}) "
                    f"({wrong.size} of {size} elements wrong): {by}")
    return None
