"""The plan of an experiment, pure (no root, no I/O): its run points, every point's rank
layout and the cost model's prediction for the very schedules its agents will run. This is
what `testbed run --dry-run` prints, and `testbed run` refuses a plan with a point that
cannot run before it builds anything."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache

from orchestrator import topology as topology_lib
from orchestrator import units
from orchestrator.agent import transports
from orchestrator.agent.plan import chunk_bytes_for
from orchestrator.collectives import registry
from orchestrator.collectives.schedule import RankMismatch
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import check_gradient_bytes, partitions
from orchestrator.cost import Network, Prediction
from orchestrator.cost.compiled import CompiledRun, compile_run
from orchestrator.cost.routes import Routes
from orchestrator import frameworks
from orchestrator.errors import FaultError, SpecError
from orchestrator.cost.simulate import ModelTooLarge
from orchestrator.experiment import jobs, workloads
from orchestrator.experiment.machines import Machines
from orchestrator.faults.timeline import plan as plan_faults
from orchestrator.experiment.sweep import LabVariant, RunPoint, expand, variants
from orchestrator.spec.experiment import ExperimentSpec
from orchestrator.spec.lab import LabSpec
from orchestrator.topology import Topology


@dataclass(frozen=True)
class Layout:
    """Ranks of one point: workers first (server order, minus parameter servers), then the
    algorithm's `ps` servers."""

    workers: tuple[str, ...]
    servers: tuple[str, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.workers + self.servers


@dataclass(frozen=True)
class PlannedPoint:
    point: RunPoint
    layout: Layout
    tensors: list[int]
    prediction: Prediction
    faults: list  # faults.timeline.PlannedFault, in the order they fall
    compute: list[list[float]] | None = None  # stragglers' drawn compute, [iteration][worker]
    iterations: int = 1  # how many the point runs (a job's own count, else the experiment's)
    # the schedules, routes and prediction the point runs with (`compiled_point`): kept from
    # planning while the plan's KEEP_TRANSFERS allow, so a run compiles nothing again
    compiled: CompiledRun | None = field(default=None, repr=False, compare=False)
    threads_on: dict[int, int] = field(default_factory=dict)  # what its agents run at once, by machine index

    @property
    def size_bytes(self) -> int:
        return sum(self.tensors) * workloads.ITEMSIZE

    @property
    def threads(self) -> int:
        """What its agents run at once, summed over the machines (`agent_threads`)."""
        return sum(self.threads_on.values())


@dataclass(frozen=True)
class Plan:
    spec: ExperimentSpec
    variants: list[LabVariant]
    points: list[PlannedPoint] = field(default_factory=list)
    auto_rate: float | None = None  # what `links.bandwidth: auto` chose (bit/s)

    def of_variant(self, variant: LabVariant) -> list[PlannedPoint]:
        return [p for p in self.points if p.point.variant.index == variant.index]


@cache
def _topology(lab: LabSpec) -> Topology:
    return topology_lib.from_lab(lab)


def topology_of(lab: LabSpec) -> Topology:
    return _topology(lab)


def layout(point: RunPoint, source: str, spec: ExperimentSpec | None = None) -> Layout:
    """The point's ranks; a job's (`spec` given) over its own servers only."""
    topology = topology_of(point.lab)
    servers = [s.name for s in topology.servers]
    if point.job is not None and spec is not None:
        try:
            return Layout(jobs.place(spec.jobs, servers, point.placement)[point.job], ())
        except ValueError as exc:
            raise SpecError(f"{source}: {exc} (run {point.id})") from None
    for name in point.algorithm.ps:
        if name not in servers:
            raise SpecError(f"{source}: agents.algorithms: {point.algorithm.key}: ps: {name} is no server of "
                            f"{point.variant.topology} (servers {', '.join(servers[:6])}{', …' if len(servers) > 6 else ''})")
    ps = tuple(dict.fromkeys(point.algorithm.ps))
    return Layout(tuple(s for s in servers if s not in ps), ps)


def context(point: RunPoint, ranks: Layout) -> Context:
    return Context(len(ranks.workers), topology_of(point.lab), ranks.nodes, dict(point.algorithm.options))


# Transfers of compiled runs a plan keeps for its run (about 1 KB each with their routes and
# prediction: two of the largest points registry.MAX_TRANSFERS allows, ~120 MB); points past
# it keep their prediction only and are compiled again when the run reaches them.
KEEP_TRANSFERS = 2 * registry.MAX_TRANSFERS

# What one agent holds beyond its gradient buffer (the bench of record: at most 73 MiB).
AGENT_OVERHEAD_BYTES = 96 << 20
# Of the memory the plan is given (the host's MemAvailable), what the agents may take.
AGENT_MEMORY_SHARE = 0.8


def check_memory(spec: ExperimentSpec, point: RunPoint, tensors: list[int], ranks: Layout, source: str,
                 machines: Machines) -> None:
    """The gradient against the agents' memory, before anything is sized by it: every agent
    holds one buffer of it, on the machine it runs on (SpecError naming the workload field,
    the figure and the limit)."""
    size = sum(tensors) * workloads.ITEMSIZE
    field = "sweep.sizes" if spec.sweep.sizes else "agents.workload"
    if point.job is not None:
        index = _job_index(spec, point)
        field = f"jobs.{index}.workload" if spec.jobs[index].workload is not None else field
    try:
        check_gradient_bytes(size)
    except ValueError as exc:
        raise SpecError(f"{source}: {field}: {exc} (run {point.id}): give a smaller size or scale") from None
    need = size + AGENT_OVERHEAD_BYTES
    limit = point.lab.servers.memory
    if point.lab.servers.runtime == "docker" and limit is not None and need > limit:
        raise SpecError(f"{source}: {field}: each agent needs about {need >> 20:,} MiB (the {size:,}-byte gradient and "
                        f"{AGENT_OVERHEAD_BYTES >> 20} MiB) and servers.memory is {limit >> 20:,} MiB (run {point.id}): "
                        "raise servers.memory or give a smaller size")
    held = dict.fromkeys(ranks.nodes, need)  # server → what its agent holds
    if point.mode == "together":  # every job's agents hold their buffers at once
        placed = jobs.place(spec.jobs, [s.name for s in topology_of(point.lab).servers], point.placement)
        held = {}
        for job in spec.jobs:
            size = sum(workloads.tensors(job.workload or spec.agents.workload)) * workloads.ITEMSIZE
            for node in placed[job.name]:
                held[node] = held.get(node, 0) + size + AGENT_OVERHEAD_BYTES
    for index, nodes in machines.spread(point.lab, topology_of(point.lab), list(held)).items():
        machine = machines.machines[index]
        agents, total = len(nodes), sum(held[node] for node in nodes)
        if machine.memory is not None and total > machine.memory * AGENT_MEMORY_SHARE:
            raise SpecError(f"{source}: {field}: {agents} agents of about {total // agents >> 20:,} MiB each need "
                            f"{total >> 20:,} MiB (run {point.id}), more than {AGENT_MEMORY_SHARE:.0%} of the "
                            f"{machine.memory >> 20:,} MiB {_has(machine)} available: give a smaller size or fewer "
                            "servers" + (", or more hosts" if machines.split else ""))


def _has(machine) -> str:
    """How a refusal says what a machine has: "this machine has", "host a has"."""
    return f"{machine.name} has" if not machine.name.startswith("hosts ") else f"{machine.name} have"


# Threads an agent runs beside its connections: gRPC's, the event loop's and its executor's,
# the native data path's poller and iteration (9 idle and 12 in a run, counted on local
# agents), with room. Every connection costs its sender a writer thread (the native data
# path's) and its receiver a reader (the tcp listener's).
AGENT_THREADS = 16
# Of the threads this host can still start (kernel.pid_max and threads-max less the tasks
# running), what a run's agents may take; the rest keeps the host usable.
THREAD_SHARE = 0.8


def agent_threads(compiled: CompiledRun) -> int:
    """The threads every agent of `compiled` runs at once, summed: a mesh of n ranks runs
    n × (16 + 2 (n - 1)), a ring n × 18."""
    return sum(threads_by_node(compiled).values())


def threads_by_node(compiled: CompiledRun) -> dict[str, int]:
    """The threads of the agent on each server: 16, and one per connection it writes (as
    sender) or reads (as receiver)."""
    threads = [AGENT_THREADS] * compiled.ranks
    for src, dst, _ in compiled.connection_ends:
        threads[src] += 1
        threads[dst] += 1
    return dict(zip(compiled.nodes, threads))


def thread_refusal(spec: ExperimentSpec, planned: list[PlannedPoint], source: str,
                   machines: Machines) -> SpecError | None:
    """The first point (or jobs run together) whose agents on one machine need more threads
    than THREAD_SHARE of the tasks it can still start; None if every one fits. Past it a
    thread cannot start (EAGAIN) and a rank stops in the middle of a run."""
    runs: dict[object, list[PlannedPoint]] = {}
    for p in planned:
        runs.setdefault(p.point.group if p.point.group is not None else p.point.id, []).append(p)
    for group in runs.values():
        for index, machine in enumerate(machines.machines):
            threads = sum(p.threads_on.get(index, 0) for p in group)
            if machine.tasks is None or threads <= machine.tasks * THREAD_SHARE:
                continue
            point = group[0].point
            agents = sum(len(p.layout.nodes) for p in group)
            what = "jobs" if len(group) > 1 else _algorithm_field(spec, point)
            where = "this host" if not machines.split else machine.name
            return SpecError(
                f"{source}: {what}: run {point.id}: its {agents:,} agents need about {threads:,} threads "
                f"({AGENT_THREADS} each and 2 per connection){' on ' + where if machines.split else ''} and "
                f"{where} can start {machine.tasks:,} more "
                f"(kernel.pid_max and kernel.threads-max less the tasks running; a run may take "
                f"{THREAD_SHARE:.0%}): choose an algorithm with fewer peers per server or fewer servers, or raise "
                "kernel.pid_max" + (", or split the lab over more hosts" if machines.split else ""))
    return None


def latency_of(spec: ExperimentSpec, lab: LabSpec):
    """The α measured on `lab` over the experiment's transport (calibrate.Latency), or None:
    not measured yet (a run measures it before its first point)."""
    from orchestrator.experiment import calibrate

    try:
        return calibrate.latency_for(lab, spec.agents.transport)
    except calibrate.NotCalibrated:
        return None


def predict_point(spec: ExperimentSpec, point: RunPoint, source: str, machines: Machines | None = None,
                  latency=None) -> PlannedPoint:
    """The point's layout and prediction, as the driver will build them; SpecError naming
    the point if its algorithm cannot run there, or if its agents would not fit the memory of
    the `machines` they run on (default: this host, unchecked). `latency`: a
    calibrate.Latency (default: as measured on the lab, `latency_of`; else α is 0)."""
    _framework_fits(point, source)
    iterations = point.iterations or spec.iterations
    latency = latency if latency is not None else latency_of(spec, point.lab)
    ranks = layout(point, source, spec)
    tensors = workloads.tensors(point.workload)
    machines = machines or Machines.here(None, None)
    check_memory(spec, point, tensors, ranks, source, machines)
    partitioning = point.partitioning
    try:
        parts = partitions(tensors, partitioning.partition_bytes)
    except ValueError as exc:
        field = "sweep.partitionings" if spec.sweep.partitionings else "partitioning"
        raise SpecError(f"{source}: {field}.{exc} (run {point.id})") from None
    try:
        network = Network.from_links(point.lab.links, latency=latency.alpha if latency else 0.0,
                                     cores=latency.cores if latency else None,
                                     wire=transports.get(spec.agents.transport).wire,
                                     peer_latency=latency.peer if latency else 0.0)
        try:
            drawn = workloads.drawn_compute(point.workload, len(ranks.workers), iterations)
        except ValueError as exc:
            raise SpecError(f"{source}: agents.workload.compute: {exc} (run {point.id})") from None
        compiled = _compiled(spec, point, ranks, tensors, parts).predicted(
            network, topology_of(point.lab), attribute=True, **_compute(spec, point, drawn))
    except RankMismatch as exc:
        raise SpecError(f"{source}: run {point.id}: {point.algorithm.key} cannot run on {point.variant.topology}: "
                        f"it needs {exc.ranks} agents (workers and parameter servers), the "
                        f"{'job' if point.job else 'lab'} gives {exc.given}: "
                        + ("give the job more servers" if point.job else "name separate parameter servers with ps: [...]")) \
            from None
    except registry.TooManyTransfers as exc:  # name what makes it big: the partitions, else the lab and algorithm
        field = ("sweep.partitionings" if spec.sweep.partitionings else "partitioning.partition_bytes") if len(parts) > 1 \
            else _algorithm_field(spec, point)
        raise SpecError(f"{source}: {field}: run {point.id}: {exc}") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise SpecError(f"{source}: run {point.id}: {point.algorithm.key} cannot run on {point.variant.topology}: "
                        f"{exc}") from None
    field, timeline = "faults", spec.faults
    if point.job is not None:
        index = _job_index(spec, point)
        field, timeline = f"jobs.{index}.faults", spec.jobs[index].faults
    try:
        faults = plan_faults(timeline, topology_of(point.lab), ps=set(ranks.servers), name=point.lab.name,
                             iterations=iterations)
    except FaultError as exc:  # "timeline events.2: ..." → the file and its field
        raise SpecError(f"{source}: {field}.{str(exc).removeprefix('timeline ')} (run {point.id})") from None
    if point.job is not None:
        foreign = [f for f in faults if f.action.startswith("server-") and f.target not in ranks.nodes]
        if foreign:
            raise SpecError(f"{source}: {field}: {foreign[0].action} {foreign[0].target} is no server of job "
                            f"{point.job} ({', '.join(ranks.nodes)}): a job's server faults target its own servers "
                            f"(run {point.id})")
    threads_on: dict[int, int] = {}
    per_node = threads_by_node(compiled)
    for index, nodes in machines.spread(point.lab, topology_of(point.lab), list(per_node)).items():
        threads_on[index] = sum(per_node[node] for node in nodes)
    return PlannedPoint(point, ranks, tensors, compiled.prediction, faults, drawn, iterations, compiled, threads_on)


def _job_index(spec: ExperimentSpec, point: RunPoint) -> int:
    """Where the file lists the point's job (`jobs.N`)."""
    return [job.name for job in spec.jobs].index(point.job)


def _algorithm_field(spec: ExperimentSpec, point: RunPoint) -> str:
    """Where the file names the point's algorithm."""
    if point.job is not None:
        return f"jobs.{_job_index(spec, point)}.algorithm"
    return f"agents.algorithms.{spec.agents.algorithms.index(point.algorithm)}"


def plan_points(spec: ExperimentSpec, points: list[RunPoint], source: str, machines: Machines | None = None,
                latency=None) -> list[PlannedPoint]:
    """Every point planned and predicted (`predict_point`); jobs that run together, predicted
    with each other's flows (experiment/jobs.py). `machines`: where the agents run, with the
    memory and threads each has (default: this host, unchecked)."""
    machines = machines or Machines.here(None, None)
    planned, kept = [], 0
    for point in points:
        p = predict_point(spec, point, source, machines, latency)
        kept += p.compiled.transfer_count
        planned.append(p if kept <= KEEP_TRANSFERS else dataclasses.replace(p, compiled=None))
    groups: dict[tuple, list[int]] = {}
    for index, p in enumerate(planned):
        if p.point.group is not None:
            groups.setdefault(p.point.group, []).append(index)
    for indices in groups.values():
        group = [planned[i] for i in indices]
        # a dropped compiled run is built again with its point's prediction: what it chose (meets)
        compiled = [p.compiled or dataclasses.replace(
                        _compiled(spec, p.point, p.layout, p.tensors, partitions(p.tensors, None)), prediction=p.prediction)
                    for p in group]
        try:
            predicted = jobs.predict_together(spec, group, compiled, topology_of(group[0].point.lab))
        except (ValueError, ModelTooLarge) as exc:
            raise SpecError(f"{source}: jobs: run {group[0].point.id}: the model cannot take them together: {exc}") \
                from None
        for i, p in zip(indices, predicted):
            planned[i] = p
    refused = thread_refusal(spec, planned, source, machines)
    if refused:
        raise refused
    return planned


def _framework_fits(point: RunPoint, source: str) -> None:
    """A point a framework runs: its lab's runtime is one the framework runs on, and this
    machine has what it needs (torch installed); SpecError naming the point otherwise."""
    if point.algorithm.framework is None:
        return
    framework = frameworks.get(point.algorithm.framework)
    runtime = point.lab.servers.runtime
    if runtime not in framework.runtimes:
        raise SpecError(f"{source}: run {point.id}: framework {framework.name} runs on "
                        f"{' or '.join(framework.runtimes)} labs, not {runtime}: set lab.servers.runtime: "
                        f"{framework.runtimes[0]}")
    reason = framework.missing()
    if reason:
        raise SpecError(f"{source}: run {point.id}: framework {framework.name}: {reason}")


def _compiled(spec: ExperimentSpec, point: RunPoint, ranks: Layout, tensors: list[int], parts) -> CompiledRun:
    transport = spec.agents.transport
    return compile_run(point.algorithm.name, context(point, ranks), sum(tensors), parts, nodes=ranks.nodes,
                       given=range(len(ranks.nodes)), credit_bytes=point.partitioning.credit_bytes,
                       chunk_bytes=chunk_bytes_for(transport), send_buffer_bytes=transports.get(transport).send_buffer,
                       rendezvous=transports.get(transport).rendezvous)


def compiled_point(spec: ExperimentSpec, planned: PlannedPoint) -> CompiledRun:
    """The point's compiled run with its prediction: the one kept from planning, else built
    again (a plan past KEEP_TRANSFERS keeps only predictions)."""
    if planned.compiled is not None:
        return planned.compiled
    parts = partitions(planned.tensors, planned.point.partitioning.partition_bytes)
    return _compiled(spec, planned.point, planned.layout, planned.tensors, parts).predicted(
        planned.prediction.network, topology_of(planned.point.lab), **_compute(spec, planned.point, planned.compute))


def _over(topology: Topology, paths: Routes | None) -> Routes | None:
    """`paths` (the ones a run's connections hashed onto) on `topology`; None: the even spread."""
    return None if paths is None else Routes(topology, paths.pinned, paths.underlay)


def predict_over_paths(spec: ExperimentSpec, planned: PlannedPoint, paths: Routes) -> Prediction:
    """The point's prediction (same schedules, α, cores and compute) over the paths its
    connections took (`paths`: driver.run's, read once they were open) in place of the plan's
    even ECMP spread, which a run cannot know before its connections hash."""
    topology = topology_of(planned.point.lab)
    return compiled_point(spec, planned).predicted(planned.prediction.network, topology, _over(topology, paths),
                                                   attribute=True,
                                                   **_compute(spec, planned.point, planned.compute)).prediction


def predict_with_rates(spec: ExperimentSpec, planned: PlannedPoint, rates: dict[tuple[str, str], float],
                       paths: Routes | None = None) -> Prediction:
    """The point's prediction (same schedules, α and cores; over `paths` when given, see
    `predict_over_paths`) with some link directions at other rates, bit/s: what the model
    expects of the iterations a `link-degrade` holds."""
    topology = topology_of(planned.point.lab).with_rates(rates)
    return compiled_point(spec, planned).predicted(planned.prediction.network, topology, _over(topology, paths),
                                                   **_compute(spec, planned.point, planned.compute)).prediction


def predict_with_compute(spec: ExperimentSpec, planned: PlannedPoint, compute: list[list[float]],
                         paths: Routes | None = None) -> Prediction | None:
    """The point's prediction (same schedules, α and cores; over `paths` when given, see
    `predict_over_paths`) with its workers computing for the seconds `compute`
    [iteration][worker] they measured: the skew between them, as the run's sync times count
    it (cost/predict.py `_stragglers`). None when the model cannot take that many iterations."""
    topology = topology_of(planned.point.lab)
    prediction = compiled_point(spec, planned).predicted(
        planned.prediction.network, topology, _over(topology, paths), attribute=True, compute_s=0.0, compute=compute,
        warmup=spec.warmup).prediction
    return prediction if prediction.parts is not None and "skew" in prediction.parts else None


def _compute(spec: ExperimentSpec, point: RunPoint, drawn: list[list[float]] | None) -> dict:
    """The workload's compute as the prediction takes it: its mean, and with stragglers the
    times `drawn` for every worker and iteration (as the run hands them out)."""
    return {"compute_s": workloads.compute_seconds(point.workload), "compute": drawn, "warmup": spec.warmup}


def make_plan(spec: ExperimentSpec, source: str = "experiment", memory: int | None = None,
              tasks: int | None = None, machines: Machines | None = None) -> Plan:
    """Every point planned and predicted; `memory`: bytes the agents may use on this host
    (MemAvailable), `tasks`: threads it can still start (None skips either check, as a plan
    for another machine would); or `machines`: the hosts a split run's agents go to, with
    what each machine has."""
    machines = machines or Machines.here(memory, tasks)
    auto_rate = None
    if spec.auto_bandwidth:
        spec = _auto_bandwidth(spec, source, machines)
        auto_rate = spec.lab.links.bandwidth
    return Plan(spec, variants(spec), plan_points(spec, expand(spec), source, machines), auto_rate)


AUTO_RANGE = (1e6, 100e9)  # bit/s: the rates `auto` chooses among


def _auto_bandwidth(spec: ExperimentSpec, source: str, machines: Machines) -> ExperimentSpec:
    """The spec with `links.bandwidth: auto` replaced by the highest rate at which every
    point's CPU need leaves the verdict's idle share free (two significant figures, rounded
    down), from this machine's calibration (experiment/calibrate.py)."""
    from orchestrator.experiment import calibrate

    try:
        calibration = calibrate.load()
    except calibrate.NotCalibrated as exc:
        raise SpecError(f"{source}: lab.links.bandwidth: auto needs this machine's calibration: {exc}") from None
    transport = spec.agents.transport
    rates = []
    for point in expand(spec):
        planned = predict_point(spec, point, source, machines)
        try:
            rates.append(calibrate.need(planned.prediction, topology_of(point.lab), transport, calibration).max_rate)
        except KeyError as exc:
            raise SpecError(f"{source}: lab.links.bandwidth: auto: {exc.args[0]}") from None
    rate = units.parse_rate(calibrate.rate_floor(min(max(min(rates), AUTO_RANGE[0]), AUTO_RANGE[1])))
    links = spec.lab.links.model_copy(update={"bandwidth": rate})
    return spec.model_copy(update={"lab": spec.lab.model_copy(update={"links": links}), "auto_bandwidth": False})
