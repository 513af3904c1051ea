"""Running a planned experiment: for each lab variant, up → monitor → deploy → for each of its
points: run (with the fault timeline) → collect; then report and down.

Every point's results go to results.json as soon as it is measured. Ctrl-C, SIGTERM, SIGHUP
or a failure stop the run where it is, mark the results partial, and the labs (with their
agents, Prometheus and faults, all journalled) are removed, unless `keep`. A point whose
agents fail (RunError: a crashed server, a timeout) is recorded as failed and the next one
runs on freshly deployed agents.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import grpc

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator import frameworks, units
from orchestrator.errors import TestbedError
from orchestrator.experiment import results as results_lib
from orchestrator.experiment import calibrate, jobs, snapshot, verdict, workloads
from orchestrator.experiment.plan import (Plan, PlannedPoint, compiled_point, context, latency_of, plan_points,
                                         predict_over_paths, predict_with_compute, predict_with_rates, topology_of)
from orchestrator.experiment.rejoin import Rejoiner
from orchestrator.experiment.report import render
from orchestrator.experiment.sweep import LabVariant
from orchestrator.monitoring.exporter import FabricCollector, host_cpu, idle_share, link_place, steal_share
from orchestrator.monitoring.peaks import QueuePeaks
from orchestrator.deploy import lab_agents
from orchestrator.emulation.interrupts import terminate_as_interrupt
from orchestrator.control import checker, driver
from orchestrator.control.iterations import Degrade, under_degrades

# (phase, text, done, total): phases up, monitor, deploy, run (one call per iteration),
# point (a point's results), report, down
Progress = Callable[[str, str, int, int], None]
MakeLab = Callable[..., object]  # (LabSpec, progress(stage, done, total)) → a live lab
POLL_SECONDS = 0.25


def _quiet(phase: str, text: str, done: int, total: int) -> None:
    pass


@dataclasses.dataclass
class Outcome:
    directory: Path
    results: dict
    kept: list[str]  # labs left up (--keep)


def point_entry(spec, planned: PlannedPoint) -> dict:
    """A point as results.json holds it before it runs: what it is and what was predicted."""
    prediction = planned.prediction
    return {
        **planned.point.describe(), "status": "not run", "error": None,
        "size_bytes": planned.size_bytes, "workload": planned.point.workload.model_dump(mode="json"),
        "workers": list(planned.layout.workers), "servers": list(planned.layout.servers),
        "iterations": planned.iterations, "warmup": spec.warmup,
        # stragglers: the compute each worker was handed, [iteration][worker] (None: no skew)
        "compute_drawn": planned.compute,
        # what the run's time per synchronisation is held against: one allreduce of a run of them
        "predicted": {**_predicted_time(prediction), "latency_s": prediction.network.latency,
                      "peer_latency_s": prediction.network.peer_latency, "cores": prediction.network.cores},
        "fault_events": [],
    }


def _predicted_time(prediction) -> dict:
    """What results.json's `predicted` holds of a prediction's time and bytes (point_entry's,
    and again after a run that knows more: `_predict_over`)."""
    return {"seconds": prediction.per_run, "alone_seconds": prediction.seconds, "algbw_bytes_per_s": prediction.algbw,
            "busbw_bytes_per_s": prediction.busbw, "link_bytes": prediction.link_bytes, "parts": prediction.parts,
            "entry_spread_s": prediction.entry_spread, "rendezvous": prediction.rendezvous}


def start_results(plan: Plan, source: Path) -> dict:
    spec = plan.spec
    return {
        "schema": results_lib.SCHEMA, "status": "running", "partial": True, "error": None,
        "experiment": {"name": spec.name, "description": spec.description, "file": results_lib.EXPERIMENT,
                       "source": str(source), "monitoring": spec.monitoring, "via": spec.agents.via,
                       "faults": spec.faults.model_dump(mode="json", by_alias=True)},
        "started": results_lib.now_iso(), "finished": None, "wall_s": None,
        "versions": results_lib.versions(),
        "labs": [{"name": v.lab.name, "topology": v.topology, "link_rate": v.link_rate,
                  "rate_bytes_per_s": v.lab.links.bandwidth / 8, "tiers": tiers(v),
                  "spec": v.lab.model_dump(mode="json")} for v in plan.variants],
        "points": [point_entry(spec, p) for p in plan.points],
    }


def tiers(variant: LabVariant) -> dict[str, str]:
    """Each link direction's tier as the fabric exporter labels it ("a→b" → "level0",
    "edge-aggregation", …): the utilisation plot reads results.json alone."""
    topology = topology_of(variant.lab)
    out = {}
    for link in topology.links:
        tier, _ = link_place(topology, link)
        out[f"{link.a.node}→{link.b.node}"] = out[f"{link.b.node}→{link.a.node}"] = tier
    return out


def run_experiment(plan: Plan, source: Path, directory: Path, keep: bool = False,
                   progress: Progress = _quiet, make_lab: MakeLab | None = None) -> Outcome:
    """Run every point of `plan`, writing into `directory` (made by results.new_directory).
    `make_lab(spec, progress)`: how each variant's lab is brought up (default `Lab.up`, on
    this machine; `testbed run --hosts` splits it over hosts)."""
    shutil.copyfile(source, directory / results_lib.EXPERIMENT)
    results = start_results(plan, source)
    results_lib.write(directory, results)
    started = time.monotonic()
    kept: list[str] = []
    try:
        with terminate_as_interrupt():
            for variant in plan.variants:
                _run_variant(plan, variant, results, directory, keep, kept, progress, make_lab or _lab_here)
        results["status"], results["partial"] = "complete", False
    except KeyboardInterrupt:
        results["status"], results["error"] = "partial", "interrupted"
        raise
    except BaseException as exc:
        results["status"], results["error"] = "partial", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        results["finished"], results["wall_s"] = results_lib.now_iso(), time.monotonic() - started
        results_lib.write(directory, results)
        progress("report", "writing the report", 0, 1)
        render(directory, results)
        progress("report", "report written", 1, 1)
    return Outcome(directory, results, kept)


def _lab_here(spec, progress):
    from orchestrator.emulation import Lab

    return Lab.up(spec, progress)


def _collector(lab):
    """What reads the lab's link counters: here, or on each host of a split lab."""
    return lab.fabric_collector() if hasattr(lab, "fabric_collector") else FabricCollector(lab)


def _run_variant(plan: Plan, variant: LabVariant, results: dict, directory: Path, keep: bool, kept: list[str],
                 progress: Progress, make_lab: MakeLab) -> None:
    spec = plan.spec
    points = plan.of_variant(variant)
    entries = {e["id"]: e for e in results["points"]}
    lab = make_lab(variant.lab, lambda stage, done, total: progress("up", f"{variant.lab.name}: {stage}", done, total))
    monitor = None
    try:
        if spec.monitoring:
            from orchestrator.monitoring import monitor_up

            progress("monitor", f"{lab.name}: prometheus", 0, 1)
            monitor = monitor_up(lab)
            results.setdefault("monitoring", {})[lab.name] = {"url": monitor.url, "pid": monitor.pid,
                                                              "started": time.time()}
            progress("monitor", f"{lab.name}: prometheus at {monitor.url}", 1, 1)
        endpoints = _deploy(lab, spec.agents.via, progress)
        points = _with_latency(plan, variant, points, lab, endpoints, entries, progress)
        for group in _groups(points):
            group_entries = [entries[p.point.id] for p in group]
            if len(group) == 1:
                faulted = _run_point(plan, group[0], lab, endpoints, group_entries[0], progress)
            else:
                faulted = _run_together(plan, group, lab, endpoints, group_entries, progress)
                results["jobs"] = jobs.interference(results["points"])
            results_lib.write(directory, results)
            progress("point", group[-1].point.id, points.index(group[-1]) + 1, len(points))
            if faulted or any(e["status"] == "failed" for e in group_entries):  # crashed or paused agents: deploy again
                endpoints = _deploy(lab, spec.agents.via, progress)
    finally:
        if monitor is not None:  # before the lab (and its Prometheus's data) goes, interrupted or not
            progress("monitor", f"{lab.name}: prometheus snapshot", 0, 1)
            snapshot.save(directory, monitor, results["monitoring"][lab.name])
            results_lib.write(directory, results)
            progress("monitor", f"{lab.name}: prometheus snapshot", 1, 1)
        if keep:
            kept.append(lab.name)
        else:
            progress("down", f"{lab.name}: removing", 0, 1)
            lab.down()  # agents, Prometheus and faults with it: all journalled
            progress("down", f"{lab.name}: removed", 1, 1)


def _groups(points: list[PlannedPoint]) -> list[list[PlannedPoint]]:
    """The points in the order they run, each alone, except jobs that run together: one
    group per lab variant and placement."""
    out: list[list[PlannedPoint]] = []
    together: dict[tuple, list[PlannedPoint]] = {}
    for planned in points:
        key = planned.point.group
        if key is None:
            out.append([planned])
            continue
        if key not in together:
            together[key] = []
            out.append(together[key])
        together[key].append(planned)
    return out


def _run_together(plan: Plan, group: list[PlannedPoint], lab, endpoints: list[driver.Endpoint], entries: list[dict],
                  progress: Progress) -> bool:
    """Run a group's jobs at once, each on its own servers' agents (a thread per job, each
    measured as a point of its own), each from its start (`at` seconds after the group's, or
    when the job it waits for has ended); whether a fault touched a server. An error in one
    is raised when the others have ended; Ctrl-C stops them all (`_stop_jobs`)."""
    outcomes: list[BaseException | bool | None] = [None] * len(group)
    starts = {job.name: job.start for job in plan.spec.jobs}
    names = [p.point.job for p in group]
    began = time.monotonic()

    def job(index: int) -> None:
        start = starts[names[index]]
        if start.after is not None:  # when that job has ended, well or not
            threads[names.index(start.after)].join()
        elif start.at:
            time.sleep(max(0.0, began + start.at - time.monotonic()))  # a start time, not a state to wait for
        try:
            outcomes[index] = _run_point(plan, group[index], lab, endpoints, entries[index], progress)
        except BaseException as exc:  # noqa: BLE001  handed to the caller's thread below
            outcomes[index] = exc

    threads = [threading.Thread(target=job, args=(i,), name=f"job-{p.point.job}", daemon=True)
               for i, p in enumerate(group)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:  # Ctrl-C (the main thread's alone): stop every job before the teardown
        _stop_jobs(plan, group, endpoints, entries, threads)
        raise
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
    return any(outcomes)


STOP_JOBS_S = 15.0  # for the jobs' threads to end once their agents are stopped


def _stop_jobs(plan: Plan, group: list[PlannedPoint], endpoints: list[driver.Endpoint], entries: list[dict],
               threads: list[threading.Thread]) -> None:
    """Interrupted while jobs run together: each job's agents are told to stop, so its
    driver returns (its thread records what it can), and what they measured is kept; a
    job still under way after STOP_JOBS_S is marked interrupted all the same."""
    for planned, entry in zip(group, entries):
        _collect_partial(ranked(endpoints, planned), planned, entry, plan.spec.warmup, len(planned.layout.workers))
    for thread in threads:
        thread.join(timeout=STOP_JOBS_S / len(threads))
    for entry in entries:
        if entry["status"] in ("running", "failed"):
            entry["status"], entry["error"] = "interrupted", "interrupted"


def _deploy(lab, via: str, progress: Progress) -> list[driver.Endpoint]:
    from orchestrator.deploy import deploy

    deployment = deploy(lab, via=via, progress=lambda stage, done, total: progress(
        "deploy", f"{lab.name}: {stage}", done, total))
    return deployment.endpoints


def _with_latency(plan: Plan, variant: LabVariant, points: list[PlannedPoint], lab, endpoints: list[driver.Endpoint],
                  entries: dict, progress: Progress) -> list[PlannedPoint]:
    """The points, predicted with α as measured on this lab: measured now (a zero-byte ring
    and a ping-pong, a few seconds) and kept if this machine has not measured it before, and
    the results' predictions made again with it. A lab α could not be measured on keeps the
    points as planned (α 0), and says so."""
    transport = plan.spec.agents.transport
    if latency_of(plan.spec, variant.lab) is not None:
        return points
    progress("latency", f"{lab.name}: measuring α over {transport}", 0, 1)
    try:
        measured = calibrate.measure_latency(lab, endpoints, transport)
    except (driver.RunError, ValueError) as exc:
        progress("latency", f"{lab.name}: α not measured ({exc}): predictions leave latency out", 1, 1)
        return points
    try:
        calibrate.save_latency(variant.lab, transport, measured)
        kept = "kept"
    except TestbedError as exc:  # used all the same; measured again next time
        kept = f"not kept: {exc}"
    progress("latency", f"{lab.name}: α {calibrate.describe_latency(measured)}, {kept}", 1, 1)
    again = plan_points(plan.spec, [p.point for p in points], "experiment", latency=calibrate.Latency.of(measured))
    for planned in again:
        entries[planned.point.id]["predicted"] = point_entry(plan.spec, planned)["predicted"]
    return again


def ranked(endpoints: list[driver.Endpoint], planned: PlannedPoint) -> list[driver.Endpoint]:
    """The lab's endpoints in the point's rank order: workers, then parameter servers."""
    by_node = {e.node: e for e in endpoints}
    workers, servers = planned.layout.workers, planned.layout.servers
    return [dataclasses.replace(by_node[n], rank=i, role="worker") for i, n in enumerate(workers)] + \
        [dataclasses.replace(by_node[n], rank=len(workers) + i, role="ps") for i, n in enumerate(servers)]


def _run_point(plan: Plan, planned: PlannedPoint, lab, endpoints: list[driver.Endpoint], entry: dict,
               progress: Progress) -> bool:
    """Run one point into `entry`; whether a fault touched a server (its agents may be gone)."""
    from orchestrator.faults.timeline import TimelineRunner

    spec, point = plan.spec, planned.point
    if point.algorithm.framework is not None:
        return _run_framework_point(plan, planned, lab, entry, progress)
    eps = ranked(endpoints, planned)
    workers = len(planned.layout.workers)
    faults = planned.faults
    entry["status"] = "running"
    timeline = TimelineRunner(lab, faults)
    iterations = planned.iterations

    def on_iteration(iteration: int) -> None:
        timeline.on_iteration(iteration)
        progress("run", point.id, iteration, iterations)

    planned = dataclasses.replace(planned, compiled=compiled_point(spec, planned))  # kept, else built now
    watcher = _IterationWatcher(eps, iterations, on_iteration)
    rejoiner = Rejoiner(lab, spec.agents.via) if faults else None
    prepare, packets = _sized_packets(lab)
    result = None
    with _measured(lab, entry, lambda: [dataclasses.asdict(r) for r in timeline.events()]) as counters:
        try:
            with timeline, watcher:
                result = driver.run(eps, point.algorithm.name, planned.tensors,
                                    workloads.build(point.workload, planned.tensors, workers, planned.compute),
                                    iterations=iterations, ctx=context(point, planned.layout),
                                    partition_bytes=point.partitioning.partition_bytes,
                                    credit_bytes=point.partitioning.credit_bytes, timeout=spec.timeout,
                                    network=planned.prediction.network, link_state=lab.link_up,
                                    flow_paths=lab_agents.flow_paths(lab, spec.agents.transport), survive=bool(faults),
                                    rejoin=rejoiner, transport=spec.agents.transport, compiled=planned.compiled,
                                    prepare=prepare, links_now=lambda: lab_agents.as_degraded(lab))
        except driver.RunError as exc:
            entry["status"], entry["error"] = "failed", str(exc)
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            entry["status"], entry["error"] = "interrupted", "interrupted" if interrupted else f"{type(exc).__name__}: {exc}"
            if interrupted:
                _collect_partial(eps, planned, entry, spec.warmup, workers)
            raise
        finally:
            if rejoiner is not None:
                rejoiner.close()
    if result is not None:
        progress("run", point.id, iterations, iterations)
        records = result.records()
        entry["history"] = [dataclasses.asdict(epoch) for epoch in result.history]  # measured_point reads it
        paths = _hashed_paths(result, planned)
        if paths is not None:
            _predict_over(spec, planned, paths, entry)
        alone = not faults and len(result.history) <= 1 and planned.point.group is None  # one membership, alone
        if alone:
            _predict_as_run(spec, planned, records, entry, workers, paths)
        entry.update(results_lib.measured_point(entry, records, result.gst(), spec.warmup, workers))
        if alone and point.workload.kind == "back-to-back":
            # entries set by the allreduces alone (no compute between, after the first), beside
            # those of the point's prediction (as it ran, when `_predict_as_run` could take it)
            entry["entry_spread_s"] = {"measured": results_lib.entry_spread(records, workers, max(1, spec.warmup)),
                                       "predicted": entry["predicted"].get("entry_spread_s")}
        entry.update(status="done", run_id=result.run_id, wall_s=result.wall_seconds)
        if point.workload.kind == "back-to-back" and iterations > 1:
            entry["back_to_back_s"] = sum(result.back_to_back_times(max(1, spec.warmup))) / len(result.results)
        entry["checker"] = _check(result, workloads.checked(point.workload))
        entry["under_faults"] = _under_faults(plan, planned, records, entry["fault_events"], spec.warmup, paths)
        entry["repaced"] = result.repaced  # the agents' pacing, following the links the timeline changed
    entry["fidelity"] = _judge(entry, counters["before"], counters["after"], float(lab.spec.links.bandwidth) / 8,
                               packets)
    return any(f.action.startswith("server-") for f in faults)


def _hashed_paths(result: driver.RunResult, planned: PlannedPoint):
    """The paths the run's connections hashed onto (cost.routes.Routes), when the driver
    predicted over them (a lab with ECMP) and the run kept one membership; else None. Also
    None for a job run together with others: its prediction is made with every job's flows
    (experiment/jobs.py), which the driver's, of this job alone, would lose; such a point
    keeps the plan's even spread."""
    compiled = result.compiled
    if result.predicted is None or compiled is None or compiled.routes is None or len(result.history) > 1 \
            or planned.point.group is not None:
        return None
    return compiled.routes if compiled.routes.pinned else None


def _predict_over(spec, planned: PlannedPoint, paths, entry: dict) -> None:
    """A point on a lab with ECMP: predicted again over the paths its connections hashed onto,
    which the plan could not know (it spreads them evenly). Two connections hashed onto one
    link direction take twice as long there, and that is the network's doing, not the lab's
    or the model's: bigraph 4×2's ring at 4 MiB, 50 Mbit, measured 2.015 × the even
    spread's prediction, and its connections' paths said why. The plan's figure is kept
    beside (`planned_seconds`)."""
    prediction = predict_over_paths(spec, planned, paths)
    predicted = entry["predicted"]
    predicted.update(planned_seconds=predicted.get("planned_seconds", predicted["seconds"]),
                     **_predicted_time(prediction), routes="hashed")
    entry["bytes_per_link"]["predicted_per_allreduce"] = prediction.link_bytes


def _predict_as_run(spec, planned: PlannedPoint, records: list[dict], entry: dict, workers: int,
                    paths=None) -> None:
    """A point predicted again as its workers ran it: each entering its first iteration when it
    did, and computing in every iteration for the seconds it measured. The plan could know
    neither, and both set the time:
    - real training computes for what it takes (the digits MLP on bcube,2,1: ring 1.06 and
      HiPS 1.24 × a compute-free prediction; 0.97 and 1.08 with the compute measured);
    - a schedule whose ranks move in lockstep only by symmetry does not stay there once they
      enter apart: the model's own halving-doubling on bigraph 4×2 (HDRM, 1 MiB, 50 Mbit) runs
      0.307 s per allreduce started together, and 0.41-0.46 s, as the lab measures it (0.47),
      from its agents' first entries, which lay 38 ms apart. A ring absorbs the same skew.
    The time a synchronisation waits for ranks entering apart is then the model's (its part
    `skew`), not a gap blamed on it. Entries are the agents' Unix times (on a lab split over
    hosts, as far as their clocks agree); parameter servers enter with the earliest worker.
    The plan's figure is kept beside; a table without every worker's every iteration leaves
    it as it was."""
    table: dict[int, dict[int, dict]] = {}
    for record in records:
        if record["rank"] < workers:
            table.setdefault(record["iteration"], {})[record["rank"]] = record
    if not table or any(len(row) != workers for row in table.values()) or sorted(table) != list(range(len(table))):
        return
    fields = [table[i][w].get(key) for i in range(len(table)) for w in range(workers) for key in ("compute_s", "start_time")]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in fields):
        return  # a framework's records are read back: not numbers, not predicted
    # when each worker began its first iteration's compute, from the earliest
    begun = [table[0][w]["start_time"] - table[0][w]["compute_s"] for w in range(workers)]
    compute = [[table[i][w]["compute_s"] for w in range(workers)] for i in range(len(table))]
    if not all(x >= 0 for row in compute for x in row):
        return
    compute[0] = [seconds + begun[w] - min(begun) for w, seconds in enumerate(compute[0])]
    prediction = predict_with_compute(spec, planned, compute, paths)
    if prediction is None:
        return
    predicted = entry["predicted"]
    predicted.update(planned_seconds=predicted.get("planned_seconds", predicted["seconds"]), seconds=prediction.per_run,
                     parts=prediction.parts, compute="measured", entry="measured",
                     entry_spread_s=prediction.entry_spread)


@contextmanager
def _measured(lab, entry: dict, events: Callable[[], list[dict]] = list) -> Iterator[dict]:
    """The fabric's counters and the host's CPU before and after the block (`before` and
    `after` in the dict it yields), and the point's window, fault events and bytes per link
    in `entry`, however the run inside ends."""
    fabric = _collector(lab)
    counters = {"before": _fabric(fabric)}
    window = (time.time(), time.monotonic())
    peaks = QueuePeaks(fabric)
    try:
        with peaks:
            yield counters
    finally:
        counters["after"] = after = _fabric(fabric)
        fabric.close()
        seconds = time.monotonic() - window[1]
        before = counters["before"]
        entry["window"] = {"start": window[0], "end": window[0] + seconds}  # Unix times: Prometheus's range
        entry["fault_events"] = events()
        entry["bytes_per_link"] = {"measured": _delta(before["bytes"], after["bytes"]), "seconds": seconds,
                                   "predicted_per_allreduce": entry["predicted"]["link_bytes"]}
        # what the queues did: drops and ECN marks per direction, and the deepest each got
        entry["queues_per_link"] = {"drops": _delta(before["drops"], after["drops"]),
                                    "marks": _delta(before["marks"], after["marks"]), **peaks.result()}


def _run_framework_point(plan: Plan, planned: PlannedPoint, lab, entry: dict, progress: Progress) -> bool:
    """Run one point by the framework its algorithm names (PyTorch's gloo: frameworks/
    torch_gloo.py) on the point's workers, in place of the agents; measured and judged as
    the agents' points are."""
    spec, point = plan.spec, planned.point
    framework = frameworks.get(point.algorithm.framework)
    workers = list(planned.layout.workers)
    prepare, packets = _sized_packets(lab)
    prepare(compiled_point(spec, planned))
    entry.update(status="running", framework=framework.name)
    job = frameworks.Job(lab, workers, planned.tensors, point.workload, planned.compute, planned.iterations, spec.timeout,
                         lambda iteration: progress("run", point.id, iteration, planned.iterations))
    outcome = None
    with _measured(lab, entry) as counters:
        progress("run", point.id, 0, planned.iterations)
        try:
            outcome = framework.run(job)
        except driver.RunError as exc:
            entry["status"], entry["error"] = "failed", str(exc)
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            entry["status"], entry["error"] = "interrupted", "interrupted" if interrupted else f"{type(exc).__name__}: {exc}"
            raise
    got = {r.get("iteration") for r in outcome.records} if outcome is not None else set()
    if outcome is not None and got != set(range(planned.iterations)):
        entry["status"], entry["error"] = "failed", (f"framework {framework.name} reported iterations "
                                                     f"{sorted(i for i in got if isinstance(i, int))[:10]} of "
                                                     f"{planned.iterations}")
        outcome = None
    if outcome is not None:
        records = sorted(outcome.records, key=lambda r: (r["iteration"], r["rank"]))
        gst = [max(r["gst_s"] for r in records if r["iteration"] == i) for i in range(planned.iterations)]
        if planned.point.group is None:  # as the agents' points are: from when its workers entered
            _predict_as_run(spec, planned, records, entry, len(workers))
        entry.update(results_lib.measured_point(entry, records, gst, spec.warmup, len(workers)))
        entry.update(status="done", run_id=f"{framework.name}-{int(entry['window']['start'])}",
                     wall_s=entry["bytes_per_link"]["seconds"])
        if point.workload.kind == "back-to-back" and planned.iterations > 1:
            entry["back_to_back_s"] = _back_to_back(records, max(1, spec.warmup))
        entry["checker"] = outcome.checker
        entry["under_faults"] = []
    entry["fidelity"] = _judge(entry, counters["before"], counters["after"], float(lab.spec.links.bandwidth) / 8,
                               packets)
    return False


def _back_to_back(records: list[dict], warmup: int) -> float:
    """NCCL-tests' time per operation, the mean over ranks: from entering the first operation
    after the warm-up to leaving the last, over their number (RunResult.back_to_back_times)."""
    times = []
    for rank in sorted({r["rank"] for r in records}):
        timed = [r for r in records if r["rank"] == rank][warmup:]
        if timed:
            times.append((timed[-1]["start_time"] + timed[-1]["gst_s"] - timed[0]["start_time"]) / len(timed))
    return sum(times) / len(times)


def _under_faults(plan: Plan, planned: PlannedPoint, records: list[dict], events: list[dict], warmup: int,
                  paths=None) -> list[dict]:
    """Each `link-degrade` with a rate beside what the model predicts of the iterations it
    held from start to end (after the warm-up): the same schedules (over `paths`, the hashed
    ones, when given) with that link's rate (control/iterations.py)."""
    options = {(f.event, f.action, f.target): f.options for f in planned.faults}
    degrades = []
    for event in events:
        rate = options.get((event["event"], event["action"], event["target"]), {}).get("rate")
        if event["action"] != "link-degrade" or rate is None or event.get("applied") is None or event.get("error"):
            continue
        degrades.append(Degrade(event["action"], event["target"], float(units.parse_rate(rate)),
                                event["applied"], event.get("undone"), str(rate)))
    return under_degrades(records, degrades, warmup,
                          lambda rates: predict_with_rates(plan.spec, planned, rates, paths).per_run)


def _collect_partial(eps: list[driver.Endpoint], planned: PlannedPoint, entry: dict, warmup: int, workers: int) -> None:
    """The iterations an interrupted run completed, from its agents (stopped first): what was
    measured is kept. Best effort, a few seconds at most: the teardown comes next."""
    try:
        with driver.control_stubs(eps) as stubs:
            for stub in stubs.values():
                stub.Stop(pb.Empty(), timeout=2)
            replies = [stubs[e.control].Results(pb.Empty(), timeout=3) for e in eps]
        partial = driver.RunResult("", planned.point.algorithm.name, replies, planned.size_bytes, 0.0)
        gst = partial.gst() if all(r.records for r in replies) else []
        if gst:
            entry.update(results_lib.measured_point(entry, partial.records(), gst, min(warmup, len(gst) - 1), workers))
    except (grpc.RpcError, ValueError):
        pass


def _check(result: driver.RunResult, kind: str | None) -> dict:
    """The history checker's verdict on a run: every survivor holds the same parameters after
    each iteration, each aggregate is exactly the sum of the contributions it claims."""
    if kind is None:
        return {"clean": None, "summary": "not checked: a back-to-back loop carries no gradient"}
    report = checker.check_run(result, emulated=kind == "emulated")
    return {"clean": report.clean, "summary": str(report), "iterations": report.iterations,
            "lost": len(report.lost), "duplicated": len(report.duplicated)}


FABRIC = {"bytes": "testbed_link_transmit_bytes", "packets": "testbed_link_transmit_packets",
          "drops": "testbed_link_qdisc_drops", "marks": "testbed_link_qdisc_ecn_marks"}


def _fabric(collector: FabricCollector) -> dict[str, dict[str, int]]:
    """Per counter (bytes, packets, drops, ECN marks), each fabric link direction's total so far, from
    the kernel as the exporter reads it; plus the CPU seconds (idle, busy) of this machine and,
    of a lab split over hosts, of each host (`host_cpus`)."""
    counters: dict[str, dict[str, int]] = {key: {} for key in FABRIC}
    counters["cpu"] = host_cpu()
    try:
        if hasattr(collector, "host_cpus"):
            counters["host_cpus"] = collector.host_cpus()
        families = collector.link_families()
    except (TestbedError, OSError):
        return counters
    by_name = {name: key for key, name in FABRIC.items()}
    for family, samples in families:
        if family.name in by_name:
            counters[by_name[family.name]] = {values[0]: int(value) for values, value in samples}
    return counters


def _cpu_shares(before: dict, after: dict, share: Callable[[dict, dict], float | None]) -> dict[str, float | None]:
    """`share` (idle_share, steal_share) of each machine's CPU between two reads: this one ("")
    and each host's."""
    machines = {"": (before["cpu"], after["cpu"])}
    for host, cpu in (after.get("host_cpus") or {}).items():
        if host in (before.get("host_cpus") or {}):
            machines[host] = (before["host_cpus"][host], cpu)
    return {machine: share(first, last) for machine, (first, last) in machines.items()}


def _sized_packets(lab) -> tuple[Callable, dict]:
    """driver.run's `prepare` for the lab (lab_agents.super_packets_of), and what it last sized:
    the run's smallest transfer and the super-packet the lab set for it (facts the verdict
    explains a small gradient's figure with; a re-formed membership's attempt sizes again)."""
    packets: dict = {}
    fit = lab_agents.super_packets_of(lab)

    def prepare(compiled) -> None:
        packets.update(smallest_transfer_bytes=compiled.smallest_transfer, super_packet_bytes=fit(compiled))

    return prepare, packets


def _judge(entry: dict, before: dict, after: dict, rate_bytes_per_s: float, packets: dict | None = None) -> dict:
    """The point's fidelity verdict from what moved while it ran (`packets`: what
    `_sized_packets` kept). On a lab split over hosts the CPU headroom is the least any
    machine had (this one, which drives, or a host)."""
    shares = _cpu_shares(before, after, idle_share)
    known = {machine: share for machine, share in shares.items() if share is not None}
    tightest = min(known, key=known.get, default="")
    stolen = {machine: share for machine, share in _cpu_shares(before, after, steal_share).items() if share is not None}
    robbed = max(stolen, key=stolen.get, default="")
    # a job running beside others shares links whose bytes the counters cannot tell apart, and
    # they flow before and after its own run: its bytes are held against its whole window
    seconds = (entry.get("bytes_per_link") or {}).get("seconds") if entry.get("mode") == "together" \
        else entry.get("wall_s")
    facts = {"cpu_idle_share": known.get(tightest), "cpu_idle_machine": tightest or None,
             "cpu_steal_share": stolen.get(robbed), "cpu_steal_machine": robbed or None, "seconds": seconds,
             "rate_bytes_per_s": rate_bytes_per_s, "ratio": entry.get("ratio"), **(packets or {}),
             "entry_spread_s": entry.get("entry_spread_s"), "sync_s": (entry.get("sync_s") or {}).get("fault_free_mean"),
             **{f"link_{key}": _delta(before.get(key, {}), after.get(key, {})) for key in FABRIC}}
    by_host = {host: share for host, share in shares.items() if host}
    return {**verdict.judge(facts), "cpu_idle_share": facts["cpu_idle_share"], **(packets or {}),
            **({"cpu_steal_share": round(facts["cpu_steal_share"], 4)} if facts["cpu_steal_share"] is not None else {}),
            **({"cpu_idle_by_host": by_host, "cpu_idle_machine": tightest or None} if by_host else {}),
            "drops": sum(facts["link_drops"].values()), "marks": sum(facts["link_marks"].values())}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    # a counter that went back started again (a queue replaced by a fault's heal, a restarted
    # container's interface): what it counted since is what is known of the window
    moved = {k: after[k] - before[k] if after[k] >= before[k] else after[k] for k in after if k in before}
    return dict(sorted(((k, v) for k, v in moved.items() if v > 0), key=lambda kv: -kv[1]))


class _IterationWatcher:
    """Polls the agents' Status while a run goes on and calls `on_iteration(i)` each time
    every agent has entered iteration i (0 at once): its progress bar and the timeline's
    iteration events. driver.run blocks until the end; this is how the experiment sees
    iterations pass."""

    def __init__(self, endpoints: list[driver.Endpoint], iterations: int, on_iteration: Callable[[int], None]) -> None:
        self.endpoints, self.iterations, self.on_iteration = endpoints, iterations, on_iteration
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="iteration-watcher", daemon=True)
        self._channels = [driver.control_channel(e) for e in endpoints]
        self._stubs = [pb_grpc.ControlStub(c) for c in self._channels]
        self._previous = self._run_ids()  # the last run's: its "done" is not this run's

    def _run_ids(self) -> set[str]:
        try:
            return {stub.Status(pb.Empty(), timeout=2).run_id for stub in self._stubs}
        except grpc.RpcError:
            return set()

    def __enter__(self) -> "_IterationWatcher":
        self.on_iteration(0)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for channel in self._channels:
            channel.close()

    def _loop(self) -> None:
        reached = 0
        while not self._stop.wait(POLL_SECONDS):
            asked = [stub.Status.future(pb.Empty(), timeout=2) for stub in self._stubs]
            statuses = []
            for future in asked:
                try:
                    statuses.append(future.result())
                except grpc.RpcError:
                    continue  # a crashed or frozen server: the run goes on without it
            current = [s for s in statuses if s.run_id not in self._previous and s.state in ("running", "done")]
            if not current:
                continue  # no agent has started this run yet
            # a surviving run re-forms under new run ids: the largest group is the attempt under way
            run_id, _ = Counter(s.run_id for s in current).most_common(1)[0]
            entered = min(self.iterations if s.state == "done" else s.iteration for s in current if s.run_id == run_id)
            while reached < entered:
                reached += 1
                self.on_iteration(reached)
