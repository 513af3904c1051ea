"""Sweep expansion, pure: an experiment → its lab variants and run points, before anything runs.

A lab variant is the experiment's lab with one topology, link rate, queue and congestion
control of the sweep (the lab's own where the sweep leaves an axis out); a run point is a variant × a size × an
algorithm (× a ByteScheduler partitioning where the sweep has them). The order is the order
written: topologies, then link rates, then sizes, then partitionings, then algorithms, so points of one lab variant are contiguous and one lab serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from orchestrator import frameworks, units
from orchestrator.errors import SpecError
from orchestrator.spec.loader import describe, one_line
from orchestrator.spec.experiment import AlgorithmSpec, ExperimentSpec, PartitioningSpec
from orchestrator.spec.lab import LabSpec

_SUFFIX_ROOM = 4  # "-v99": a lab name is at most 24 characters


@dataclass(frozen=True)
class LabVariant:
    index: int
    lab: LabSpec
    queue: str | None = None  # the sweep's queue (its label), where the sweep has them
    congestion: str | None = None  # the sweep's servers.tcp_congestion, where it has them

    @property
    def topology(self) -> str:
        """`star-4`, `bcube-2-1`: the kind and its parameters (a graph's own short label)."""
        own = getattr(self.lab.topology, "label", None)  # a kind whose parameters are no label
        if own is not None:
            return own
        params = self.lab.topology.model_dump(exclude={"kind"})
        return "-".join([self.lab.topology.kind, *(str(v) for v in params.values())])

    @property
    def link_rate(self) -> str:
        return units.format_rate(self.lab.links.bandwidth)


@dataclass(frozen=True)
class RunPoint:
    id: str
    variant: LabVariant
    algorithm: AlgorithmSpec
    workload: object  # the workload spec with the sweep's size applied
    size_bytes: int | None  # the gradient bytes the sweep set, else the workload's own (if it has one)
    partitioning: PartitioningSpec = PartitioningSpec()  # the sweep's, else the experiment's
    # with jobs: the job, whether it runs alone or together with the others, and the
    # sweep's placement (None: each job's own)
    job: str | None = None
    mode: str | None = None
    placement: str | None = None
    iterations: int | None = None  # a job's own count (None: the experiment's)

    @property
    def lab(self) -> LabSpec:
        return self.variant.lab

    @property
    def group(self) -> tuple | None:
        """Jobs that run together, as one group: (lab variant, placement); None otherwise."""
        return (self.variant.index, self.placement) if self.mode == "together" else None

    def describe(self) -> dict:
        variant = self.variant
        swept = {**({"queue": variant.queue} if variant.queue else {}),
                 **({"tcp_congestion": variant.congestion} if variant.congestion else {})}
        return {"id": self.id, "lab": self.lab.name, "topology": self.variant.topology,
                "link_rate": self.variant.link_rate, **swept, "size_bytes": self.size_bytes,
                "algorithm": self.algorithm.key, "algorithm_name": self.algorithm.name,
                "options": self.algorithm.options, "ps": self.algorithm.ps,
                "partitioning": self.partitioning.model_dump(mode="json"),
                **({"job": self.job, "mode": self.mode, "placement": self.placement} if self.job else {})}


def variants(spec: ExperimentSpec) -> list[LabVariant]:
    """Every topology × link rate × queue × congestion control of the sweep, named apart when
    there is more than one."""
    sweep = spec.sweep
    topologies = sweep.topologies or [spec.lab.topology]
    rates = sweep.link_rates or [spec.lab.links.bandwidth]
    queue_settings = sweep.queues or [None]
    congestions = sweep.tcp_congestion or [None]
    servers = _servers_for_frameworks(spec)
    combos = [(t, r, q, c) for t in topologies for r in rates for q in queue_settings for c in congestions]
    out = []
    for index, (topology, rate, queue, congestion) in enumerate(combos):
        name = spec.lab.name if len(combos) == 1 else f"{spec.lab.name[:24 - _SUFFIX_ROOM]}-v{index}"
        links = {"bandwidth": rate}
        if queue is not None:
            links.update(discipline=queue.discipline, **({"queue": queue.packets} if queue.packets else {}))
        lab = spec.lab.model_copy(update={
            "name": name, "topology": topology, "links": spec.lab.links.model_copy(update=links),
            "servers": servers.model_copy(update={"tcp_congestion": congestion}) if congestion else servers})
        try:  # validated again, whole: a sweep's value may not fit another axis's lab
            whole = LabSpec.model_validate(lab.model_dump())
        except ValidationError as exc:
            axes = [getattr(topology, "kind", None), units.format_rate(rate), queue and queue.label, congestion]
            raise SpecError(one_line(f"sweep: lab {name} ({', '.join(str(a) for a in axes if a)}): "
                                     f"{describe(LabSpec, exc)}")) from None
        out.append(LabVariant(index, whole, queue.label if queue is not None else None, congestion))
    return out


def _servers_for_frameworks(spec: ExperimentSpec):
    """The lab's servers, in the image a framework of the experiment needs on Docker (ours
    with torch: built on demand) when the lab runs the default image; a lab that names its
    own image keeps it (it must hold the framework)."""
    servers = spec.lab.servers
    needed = sorted({frameworks.get(a.framework).image for a in spec.agents.algorithms
                     if a.framework is not None} - {None})
    if servers.runtime != "docker" or not needed or servers.image != type(servers).model_fields["image"].default:
        return servers
    return servers.model_copy(update={"image": needed[0]})  # one today; two frameworks' images would need a merge


def expand(spec: ExperimentSpec) -> list[RunPoint]:
    """The run points in the order they run; ids are unique, readable and stable."""
    if spec.jobs:
        return _expand_jobs(spec)
    workload = spec.agents.workload
    sizes: list[int | None] = list(spec.sweep.sizes) or [getattr(workload, "size", None)]
    partitionings = list(spec.sweep.partitionings) or [spec.partitioning]
    points = []
    for variant in variants(spec):
        for size in sizes:
            sized = workload
            if spec.sweep.sizes:  # a model's size replaces its scale
                sized = workload.model_copy(update={"size": size, **({"scale": None} if "scale" in type(workload).model_fields else {})})
            for partitioning in partitionings:
                for algorithm in spec.agents.algorithms:
                    parts = [f"{len(points):03d}", variant.topology, variant.link_rate.lower(),
                             *filter(None, (variant.queue, variant.congestion))]
                    if size is not None:
                        parts.append(_size_slug(size))
                    if spec.sweep.partitionings:
                        parts.append(partitioning_slug(partitioning))
                    parts.append(algorithm.key)
                    points.append(RunPoint("-".join(parts), variant, algorithm, sized, size, partitioning))
    return points


def _expand_jobs(spec: ExperimentSpec) -> list[RunPoint]:
    """Per lab variant and placement: every job alone, one after another, then all of them
    together (a group the runner starts at once)."""
    points: list[RunPoint] = []
    for variant in variants(spec):
        for placement in spec.sweep.placements or [None]:
            for mode in ("alone", "together"):
                for job in spec.jobs:
                    workload = job.workload or spec.agents.workload
                    parts = [f"{len(points):03d}", variant.topology, variant.link_rate.lower(),
                             *filter(None, (variant.queue, variant.congestion))]
                    if placement:
                        parts.append(placement)
                    parts += [job.name, mode]
                    points.append(RunPoint("-".join(parts), variant, job.algorithm, workload,
                                           getattr(workload, "size", None), spec.partitioning, job=job.name, mode=mode,
                                           placement=placement, iterations=job.iterations))
    return points


def partitioning_slug(partitioning: PartitioningSpec) -> str:
    """`p1mib-c4mib`, `pnone-call`: partition size and credit (0: all in flight)."""
    size = partitioning.partition_bytes
    credit = partitioning.credit_bytes
    return f"p{_size_slug(size) if size else 'none'}-c{_size_slug(credit) if credit else 'all'}"


def _size_slug(size: int) -> str:
    for unit, scale in (("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size}b"
