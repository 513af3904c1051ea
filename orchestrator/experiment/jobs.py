"""Several jobs on one fabric (an experiment's `jobs:`): where each job's servers are, and
what the model predicts of each job with all of them running at once.

Each job is planned twice per lab variant (and placement): alone, its own point as any
other, and together, a point of a group that the runner starts at once. A together point's
prediction is the job's time per synchronisation with every job's flows in one simulation
(cost/jobs.py); its `parts["interference"]` says what the others add to the job's time.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from orchestrator.cost.jobs import together
from orchestrator.cost.routes import Routes


def place(jobs: Sequence, servers: Sequence[str], placement: str | None = None) -> dict[str, tuple[str, ...]]:
    """Each job's servers: a job that names them takes those; the others, in order, take
    `count` of the servers still free — `packed`: the next ones in server order, `spread`:
    evenly over the free ones, `random`: drawn with the job's seed (`placement`, a sweep's,
    replaces each counted job's own). ValueError naming the job when they do not fit."""
    taken: dict[str, str] = {}
    out: dict[str, tuple[str, ...]] = {}
    for index, job in enumerate(jobs):
        if not isinstance(job.servers, list):
            continue
        for name in job.servers:
            if name not in servers:
                raise ValueError(f"jobs.{index}.servers: {name} is no server of the lab "
                                 f"({', '.join(servers[:6])}{', …' if len(servers) > 6 else ''})")
            if name in taken:
                raise ValueError(f"jobs.{index}.servers: {name} is job {taken[name]}'s already: jobs share no server")
            taken[name] = job.name
        out[job.name] = tuple(job.servers)
    for index, job in enumerate(jobs):
        if isinstance(job.servers, list):
            continue
        free = [s for s in servers if s not in taken]
        count, how = job.servers.count, placement or job.servers.placement
        if count > len(free):
            raise ValueError(f"jobs.{index}.servers: job {job.name} asks for {count} servers, {len(free)} of the lab's "
                             f"{len(servers)} are free: ask for fewer, or a larger lab")
        if how == "packed":
            chosen = free[:count]
        elif how == "spread":
            chosen = [free[(i * len(free)) // count] for i in range(count)]
        else:
            chosen = sorted(random.Random(job.servers.seed).sample(free, count), key=servers.index)
        for name in chosen:
            taken[name] = job.name
        out[job.name] = tuple(chosen)
    return out


def predict_together(spec, group: list, compiled: list, topology) -> list:
    """The group's planned points (one per job, all on one lab), each with its prediction
    made with every job's flows at once, each job with its own iterations and start:
    `per_run` the job's time per synchronisation together, parts["interference"] what the
    others add to it (alone as the same model makes it). `compiled`: each point's
    CompiledRun."""
    from orchestrator.experiment import workloads

    network = group[0].prediction.network
    routes = Routes(topology)
    specs = {job.name: job for job in spec.jobs}
    names = [p.point.job for p in group]
    compute = [workloads.compute_seconds(p.point.workload) for p in group]
    counts = [p.iterations for p in group]
    starts = [specs[n].start.at or 0.0 for n in names]
    after = [names.index(specs[n].start.after) if specs[n].start.after else None for n in names]
    both = together(routes, compiled, network, compute, counts, starts, after, spec.warmup)
    alone = [together(routes, [run], network, [c], [n], warmup=spec.warmup)[0]
             for run, c, n in zip(compiled, compute, counts)]
    out = []
    for planned, joint, own in zip(group, both, alone):
        parts = {**(planned.prediction.parts or {}), "interference": joint - own}
        prediction = dataclasses.replace(planned.prediction, back_to_back=joint, parts=parts)
        out.append(dataclasses.replace(planned, prediction=prediction))
    return out


def interference(entries: list[dict]) -> list[dict]:
    """Per job of a results.json with jobs: its time per synchronisation alone and together,
    measured and predicted, and the factor (together / alone) both ways, per lab variant and
    placement."""
    entries = [e for e in entries if isinstance(e.get("job"), str) and isinstance(e.get("lab"), str)
               and isinstance(e.get("placement"), (str, type(None)))]  # read back: untrusted
    alone = {(e["lab"], e.get("placement"), e["job"]): e for e in entries if e.get("mode") == "alone"}
    rows = []
    for entry in entries:
        if not entry.get("job") or entry.get("mode") != "together":
            continue
        own = alone.get((entry["lab"], entry.get("placement"), entry["job"]))
        if own is None:
            continue
        measured = [_sync(own), _sync(entry)]
        predicted = [_number((own.get("predicted") or {}).get("seconds")),
                     _number((entry.get("predicted") or {}).get("seconds"))]
        # the factor from one model: together against the same simulation with the job alone
        # (together less what the others add), not the alone point's back-to-back figure
        added = ((entry.get("predicted") or {}).get("parts") or {}).get("interference")
        joint_alone = _number(predicted[1] - added) if predicted[1] and isinstance(added, (int, float)) else None
        rows.append({"lab": entry.get("lab"), "placement": entry.get("placement"), "job": entry["job"],
                     "algorithm": entry.get("algorithm"), "servers": entry.get("workers"),
                     "alone_measured_s": measured[0], "together_measured_s": measured[1],
                     "alone_predicted_s": predicted[0], "together_predicted_s": predicted[1],
                     "factor_measured": measured[1] / measured[0] if all(measured) else None,
                     "factor_predicted": predicted[1] / (joint_alone or predicted[0]) if predicted[1] and
                     (joint_alone or predicted[0]) else None})
    return rows


def _sync(entry: dict) -> float | None:
    value = (entry.get("sync_s") or {}).get("fault_free_mean") if entry.get("status") == "done" else None
    return _number(value)


def _number(value) -> float | None:
    """A figure read back from results.json (untrusted): a positive number, else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


HEADER = ("lab", "placement", "job", "algorithm", "servers", "alone s", "together s", "interference")


def table_rows(results: dict) -> list[list[str]]:
    """The jobs' table (HEADER): each time measured / predicted, the factor likewise."""
    def pair(measured, predicted, digits: int) -> str:
        shown = [format(v, f".{digits}f") if v is not None else "–" for v in (measured, predicted)]
        return f"{shown[0]} / {shown[1]}"

    return [[str(row["lab"]), str(row["placement"] or "as written"), str(row["job"]), str(row["algorithm"]),
             str(len(row["servers"]) if isinstance(row["servers"], list) else "–"),
             pair(row["alone_measured_s"], row["alone_predicted_s"], 4),
             pair(row["together_measured_s"], row["together_predicted_s"], 4),
             pair(row["factor_measured"], row["factor_predicted"], 3)]
            for row in interference([p for p in results.get("points") or [] if isinstance(p, dict)])]
