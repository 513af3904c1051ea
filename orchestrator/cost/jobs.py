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


def together(routes: Routes, runs: Sequence[CompiledRun], network: Network, compute_s: Sequence[float] = (),
             iterations: int = BACK_TO_BACK) -> list[float]:
    """Each job's seconds per synchronisation while all of `runs` loop at once (`compute_s`:
    each job's compute per iteration), as a run measures it: its slowest rank's exit of
    one iteration to its exit of the next, over the iterations, less the compute."""
    if not runs:
        return []
    compute = list(compute_s) or [0.0] * len(runs)
    if len(compute) != len(runs):
        raise ValueError(f"{len(compute)} compute times for {len(runs)} jobs")
    credits = {run.credit_bytes for run in runs}
    if len(credits) > 1:
        raise ValueError("jobs on one fabric share one credit (partitioning.credit_bytes)")
    schedules, nodes, ranks = merged(runs)
    job_of = {rank: j for j, span in enumerate(ranks) for rank in span}
    run = simulate(routes, schedules, nodes, network, max(r.chunk_bytes for r in runs), credits.pop(),
                   receive_buffer_bytes=DEFAULT_RECEIVE_BUFFER_BYTES,
                   send_buffer_bytes=max(r.send_buffer_bytes for r in runs), iterations=iterations,
                   compute_s=(lambda iteration, rank: compute[job_of[rank]]) if any(compute) else 0.0)
    out = []
    for j, span in enumerate(ranks):
        ends = [max((exits[r] for r in span if r in exits), default=0.0) for exits in run.exits]
        period = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else ends[0]
        out.append(max(0.0, period - (compute[j] if len(ends) > 1 else 0.0)))
    return out
