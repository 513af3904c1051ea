"""Several jobs on one fabric: every job's flows simulated together, max-min shared on the
links they have in common, each job looping over its own allreduces (a rank enters its next
iteration when it has left the last, as alone), and each job's time per synchronisation
read from its own ranks' exits.

    seconds = together(routes, [run_a, run_b], network, compute_s=[0.0, 0.05])

The same call with one run is that job alone, so a job's interference factor (together over
alone) compares figures the model made the same way. Pure, as the rest of the model.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from orchestrator.collectives.schedule import Schedule
from orchestrator.cost.compiled import CompiledRun
from orchestrator.cost.network import Network
from orchestrator.cost.predict import BACK_TO_BACK
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import DEFAULT_RECEIVE_BUFFER_BYTES, simulate


def merged(runs: Sequence[CompiledRun]) -> tuple[list, list[str], list[range]]:
    """One run's worth of schedules holding every job's: job j's ranks renumbered after the
    jobs before it (its partitions are empty for every other job's ranks, which the model
    passes at once); the server of every rank; each job's ranks."""
    total = sum(run.ranks for run in runs)
    schedules, nodes, ranks = [], [], []
    for run in runs:
        offset = len(nodes)
        ranks.append(range(offset, offset + run.ranks))
        nodes += run.nodes
        for part, schedule in run.schedules:
            steps = [[dataclasses.replace(t, src=t.src + offset, dst=t.dst + offset) for t in step]
                     for step in schedule.steps]
            moved = Schedule(schedule.algorithm, total, schedule.size, steps,
                             tuple(w + offset for w in schedule.workers), dict(schedule.meta))
            schedules.append((part, moved))
    if len(set(nodes)) != len(nodes):
        raise ValueError("jobs on one fabric must not share a server: give each its own")
    return schedules, nodes, ranks


# Iterations of each job the model follows (its own count when fewer): their mean time per
# synchronisation stands for the job's, as SKEW_ITERATIONS does for stragglers
JOINT_ITERATIONS = 32
IDLE_S = 1e9  # a job not started yet, or done: its ranks compute this long before going on


def together(routes: Routes, runs: Sequence[CompiledRun], network: Network, compute_s: Sequence[float] = (),
             iterations: Sequence[int] | int = BACK_TO_BACK, starts: Sequence[float] = (),
             after: Sequence[int | None] = (), warmup: int = 0) -> list[float]:
    """Each job's mean seconds per synchronisation while `runs` loop on one fabric, as a run
    measures it: its slowest rank's exit of one iteration to its exit of the next, less its
    compute, over its iterations from `warmup` (at least the second) to its last.

    `compute_s`: each job's compute per iteration; `iterations`: each job's count (or one
    for all); `starts`: seconds after the first job's start each job starts; `after`: the
    index of the job whose end a job waits for (None: it starts at its `starts`). A job
    done is done: the others run on without it."""
    if not runs:
        return []
    jobs = len(runs)
    compute = list(compute_s) or [0.0] * jobs
    counts = [iterations] * jobs if isinstance(iterations, int) else list(iterations)
    offsets = list(starts) or [0.0] * jobs
    waits = list(after) or [None] * jobs
    if not len(compute) == len(counts) == len(offsets) == len(waits) == jobs:
        raise ValueError(f"compute, iterations, starts and after must give one value for each of the {jobs} jobs")
    if all(o == 0 for o in offsets) and all(w is None for w in waits):
        counts = [min(max(1, c), JOINT_ITERATIONS) for c in counts]  # all start at once: a sample stands for the run
    else:  # who overlaps whom depends on how long each runs: follow every iteration (MAX_WORK bounds it)
        counts = [max(1, c) for c in counts]
    credits = {run.credit_bytes for run in runs}
    if len(credits) > 1:
        raise ValueError("jobs on one fabric share one credit (partitioning.credit_bytes)")
    schedules, nodes, ranks = merged(runs)
    job_of = {rank: j for j, span in enumerate(ranks) for rank in span}
    _check_no_circle(waits)
    begins = [o if w is None else IDLE_S for o, w in zip(offsets, waits)]
    # each pass starts every waiting job at its predecessor's end as the last pass saw it; a
    # start can change what came before it (a job now overlapping the predecessor's own
    # neighbour), so passes go on until no start moves (a chain of n waits settles in n)
    for _ in range(2 * jobs + 1):
        run = _simulate(routes, runs, schedules, nodes, network, credits, compute, counts, begins, job_of)
        ends = [_ends(run, span, count) for span, count in zip(ranks, counts)]
        moved = False
        for j, w in enumerate(waits):
            if w is not None and begins[w] < IDLE_S and abs(begins[j] - ends[w][-1]) > 1e-9:
                begins[j], moved = ends[w][-1], True
        if not moved:
            break
    out = []
    for j in range(jobs):
        own = ends[j]
        syncs = [own[i] - own[i - 1] - compute[j] for i in range(max(1, warmup), len(own))]
        out.append(max(0.0, sum(syncs) / len(syncs)) if syncs else max(0.0, own[0] - begins[j] - compute[j]))
    return out


def _check_no_circle(waits: Sequence[int | None]) -> None:
    for j in range(len(waits)):
        seen, k = set(), j
        while k is not None:
            if k in seen:
                raise ValueError("jobs wait for each other in a circle: one of them must start on its own")
            seen.add(k)
            k = waits[k]


def _simulate(routes, runs, schedules, nodes, network, credits, compute, counts, begins, job_of):
    def seconds(iteration: int, rank: int) -> float:
        j = job_of[rank]
        if iteration >= counts[j]:
            return IDLE_S  # done: out of the others' way
        return compute[j] + (begins[j] if iteration == 0 else 0.0)

    return simulate(routes, schedules, nodes, network, max(r.chunk_bytes for r in runs), next(iter(credits)),
                    receive_buffer_bytes=DEFAULT_RECEIVE_BUFFER_BYTES,
                    send_buffer_bytes=max(r.send_buffer_bytes for r in runs), iterations=max(counts),
                    compute_s=seconds, rendezvous=[r.meets for r in runs for _ in r.schedules])


def _ends(run, span: range, count: int) -> list[float]:
    """When the job's slowest rank left each of its own iterations."""
    return [max((exits[r] for r in span if r in exits), default=0.0) for exits in run.exits[:count]]
