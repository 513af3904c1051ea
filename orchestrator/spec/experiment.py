"""The experiment file: a lab, the agents' algorithms and workload, a fault timeline and sweeps.

    name: smoke                                  # names the results directory
    plugins: [my_alg.py]                         # files registering algorithms (README "Your own algorithm")
    lab: ../topologies/bcube-4-1.yaml            # a lab file (relative to this file) or a lab mapping
    agents:
      via: nsenter                               # nsenter | ssh | exec (deploy.VIA)
      algorithms:                                # the algorithm axis of the sweep
        - ring
        - {name: ps, options: {shards: 2}, ps: [h3]}      # separate parameter servers on h3
        - {name: ps, label: ps-coloc, options: {colocated: true}}
      workload: {kind: back-to-back, size: 4MB}  # or model, tensors, digits (WORKLOAD_KINDS)
    iterations: 5
    warmup: 1                                    # first iterations left out of the statistics
    partitioning: {partition_bytes: 1MB, credit_bytes: 4MB}   # ByteScheduler
    faults: {seed: 1, events: [{action: link-down, target: h00-l0s0, at_iteration: 2, for: 1s}]}
    monitoring: true                             # a Prometheus for the lab while it runs
    sweep:                                       # crossed with agents.algorithms, in this order
      topologies: [bcube,2,1, {kind: star, servers: 4}]
      link_rates: [100Mbit, 1Gbit]
      sizes: [1MB, 4MB]                          # the workload's gradient size
      partitionings: [{partition_bytes: 1MB}, {partition_bytes: 1MB, credit_bytes: 2MB}]  # replaces `partitioning`

`load_experiment` reads it through spec/loader.py, so errors read like a lab file's:
`smoke.yaml: agents.workload.size: ...`; a lab given as a path is read as a lab file and
its errors name that file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationInfo, field_validator,
                      model_validator)

from orchestrator import units
from orchestrator.spec.queues import Setting as QueueSetting
from orchestrator.spec.compute import ComputeSpec
from orchestrator.spec.lab import Bytes, LabSpec, Name, NodeName, Rate, TopologySpec
from orchestrator.spec.timeline import Timeline

MAX_ITERATIONS = 100_000
MAX_POINTS = 1000  # sweep points × algorithms: beyond this an experiment file is a typo
VIA = ("nsenter", "ssh", "exec")  # deploy.VIA; spec/ may not import deploy (it imports the driver)

Size = Annotated[Bytes, PlainSerializer(lambda b: b)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- workloads: one model per kind, told apart by `kind` ----------------------------------------
class BackToBack(_Strict):
    """NCCL-tests' loop: allreduces with nothing in between, one tensor of `size` bytes."""

    kind: Literal["back-to-back"]
    size: Size = Field(description="gradient bytes, e.g. 4MB")


class ModelWorkload(_Strict):
    """A real model's gradient layout (orchestrator/data/models.json) at a scale, with
    emulated compute; `size` instead of `scale` picks the scale that gives that many bytes."""

    kind: Literal["model"]
    model: Literal["resnet50", "vgg19", "alexnet", "bert-base", "gpt2-small"]
    scale: Optional[float] = Field(None, gt=0, le=1000, description="element counts × scale, e.g. 0.1")
    size: Optional[Size] = Field(None, description="gradient bytes, e.g. 25MB (instead of scale)")
    compute: ComputeSpec = Field(default_factory=ComputeSpec, description="emulated compute per iteration, e.g. "
                                 "50ms, or stragglers: {distribution: lognormal, mean: 50ms, sd: 20ms}")

    @model_validator(mode="after")
    def _scale_or_size(self) -> "ModelWorkload":
        if (self.scale is None) == (self.size is None):
            raise ValueError("give exactly one of scale (e.g. 0.1) and size (e.g. 25MB)")
        return self


class TensorsWorkload(_Strict):
    """A custom gradient layout: element counts, input to output, with emulated compute."""

    kind: Literal["tensors"]
    tensors: list[Annotated[int, Field(strict=True, ge=1, le=1 << 30)]] = Field(min_length=1, max_length=10_000)
    compute: ComputeSpec = Field(default_factory=ComputeSpec, description="as the model kind's")


class DigitsWorkload(_Strict):
    """The digits MLP trained for real (scikit-learn's bundled data): every algorithm must
    end with bit-identical parameters."""

    kind: Literal["digits"]
    hidden: int = Field(32, strict=True, ge=1, le=4096)
    lr: float = Field(0.5, gt=0, le=100)
    batch: int = Field(32, strict=True, ge=1, le=1797)
    seed: int = Field(0, strict=True, ge=0)


WorkloadSpec = Annotated[Union[BackToBack, ModelWorkload, TensorsWorkload, DigitsWorkload],
                         Field(discriminator="kind")]
# kinds whose gradient size a sweep may set (through their `size` field)
SIZED_KINDS = ("back-to-back", "model")


# -- agents ---------------------------------------------------------------------------------------
class AlgorithmSpec(_Strict):
    name: str = Field(description="an algorithm of collectives/registry.ALGORITHMS")
    label: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]{0,39}$",
                                 description="how results name it (default: name); lower case, digits, . _ -")
    options: dict[str, Any] = Field(default_factory=dict, description="e.g. {shards: 4, colocated: true}")
    ps: list[str] = Field(default_factory=list, max_length=4096,
                          description="servers that run parameter servers, not workers (ps only)")
    framework: Optional[str] = Field(None, description="run by a framework instead of the agents, e.g. torch: "
                                     "PyTorch's gloo on the same servers, priced as the algorithm `name`")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from orchestrator.collectives.registry import ALGORITHMS  # pure: a table of names

        if name not in ALGORITHMS:
            raise ValueError(f"{units.shown(name)} is no algorithm: use one of {', '.join(ALGORITHMS)}")
        return name

    @field_validator("options")
    @classmethod
    def _options_fit(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Validated by the algorithm's own options model (unknown keys, bad booleans and
        out-of-range counts refused here, before a plan is sized by them)."""
        from orchestrator.collectives.registry import check_options  # pure: the table of algorithms

        name = info.data.get("name")
        return options if name is None else check_options(name, options)

    @model_validator(mode="after")
    def _framework_runs_it(self) -> "AlgorithmSpec":
        """A framework runs its own collective: `name` must be the algorithm it executes
        (what prices it), with no options or parameter servers of ours."""
        if self.framework is None:
            return self
        from orchestrator import frameworks  # a table of names; no I/O

        try:
            framework = frameworks.get(self.framework)
        except ValueError as exc:
            raise ValueError(f"framework: {exc}") from None
        if self.name not in framework.runs:
            raise ValueError(f"framework {framework.name} runs {' or '.join(framework.runs)}, not {self.name}: "
                             f"write {{name: {framework.runs[0]}, framework: {framework.name}}}")
        if self.options or self.ps:
            raise ValueError(f"framework {framework.name} takes no options or ps of the project's algorithms: "
                             "leave them out")
        return self

    @property
    def key(self) -> str:
        """How results name it: the label, else the name (`torch-ring` when a framework runs it)."""
        return self.label or (f"{self.framework}-{self.name}" if self.framework else self.name)


def _algorithm(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class AgentsSpec(_Strict):
    via: Literal["nsenter", "ssh", "exec"] = Field("nsenter", description="how agents are deployed")
    algorithms: list[Annotated[AlgorithmSpec, BeforeValidator(_algorithm)]] = Field(
        default_factory=list, max_length=100, description="the algorithm axis (with jobs: left out, each job names its own)")
    workload: WorkloadSpec
    transport: str = Field("tcp", description="how agents move chunks: tcp (at the kernel's cost), grpc (Data.Push) or rdma "
                           "(RoCE v2 queue pairs; a lab with rdma: softroce)")

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, name: str) -> str:
        from orchestrator.agent import transports  # a table of names; no I/O

        transports.get(name)  # its ValueError names the ones there are
        return name

    @field_validator("algorithms")
    @classmethod
    def _distinct(cls, algorithms: list[AlgorithmSpec]) -> list[AlgorithmSpec]:
        seen: set[str] = set()
        for algorithm in algorithms:
            if algorithm.key in seen:
                raise ValueError(f"{algorithm.key} is listed twice: give each a distinct label")
            seen.add(algorithm.key)
        return algorithms


class PartitioningSpec(_Strict):
    """ByteScheduler: partitions of at most `partition_bytes`, input layers first, with at
    most `credit_bytes` of them in flight per rank (0: all)."""

    partition_bytes: Optional[Size] = Field(None, description="e.g. 1MB")
    credit_bytes: Annotated[int, BeforeValidator(lambda v: 0 if v in (0, "0") else units.parse_size(v))] = 0


# -- several jobs on one fabric -------------------------------------------------------------------
PLACEMENTS = ("packed", "spread", "random")


class PlacementSpec(_Strict):
    """How many servers a job takes and where: `packed` the next free ones in server order,
    `spread` free ones evenly over the free list, `random` drawn with `seed`."""

    count: int = Field(strict=True, ge=1, le=4096)
    placement: Literal["packed", "spread", "random"] = "packed"
    seed: int = Field(0, strict=True, ge=0)


class StartSpec(_Strict):
    """When a job starts, with the others: `at` seconds after the first, or `after` another
    job has ended."""

    at: Optional[Annotated[float, BeforeValidator(units.parse_duration)]] = Field(None, ge=0, description="e.g. 2s")
    after: Optional[str] = Field(None, description="the name of another job")

    @model_validator(mode="after")
    def _one(self) -> "StartSpec":
        if (self.at is None) == (self.after is None):
            raise ValueError("give exactly one of at (e.g. 2s) and after (another job's name)")
        return self


def _job_algorithm(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class JobSpec(_Strict):
    """One job of several sharing the lab's fabric: its own servers, algorithm and workload
    (default the experiment's), run alone and then together with the others."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,11}$",
                               description="a lower case letter, then letters or digits, at most 12")]
    servers: Union[list[NodeName], PlacementSpec] = Field(description="servers by name, or {count, placement, seed}")
    algorithm: Annotated[AlgorithmSpec, BeforeValidator(_job_algorithm)]
    workload: Optional[WorkloadSpec] = None
    faults: Timeline = Field(default_factory=Timeline, description="this job's fault timeline, by its iterations "
                             "(a server fault targets one of its own servers)")
    iterations: Optional[int] = Field(None, strict=True, ge=1, le=MAX_ITERATIONS, description="default the experiment's")
    start: StartSpec = Field(default_factory=lambda: StartSpec(at=0.0), description="{at: 2s} or {after: a}")

    @field_validator("servers")
    @classmethod
    def _some(cls, servers):
        if isinstance(servers, list) and len(set(servers)) != len(servers):
            raise ValueError("a server is listed twice")
        if isinstance(servers, list) and not servers:
            raise ValueError("give at least one server, or {count: N, placement: packed}")
        return servers


# -- sweeps ---------------------------------------------------------------------------------------
def _topology(value: Any) -> Any:
    """`bcube,2,1` as the lab shorthand writes it, or a topology mapping."""
    from orchestrator.topology.kinds import shorthand  # a table of parameter names; no I/O

    if not isinstance(value, str):
        return _checked_topology(value)
    kind, *numbers = value.split(",")
    names = shorthand().get(kind.strip())
    if names is None:
        raise ValueError(f"{units.shown(value)}: unknown kind: use one of {', '.join(shorthand())}")
    if len(numbers) != len(names):
        quote = " (in a [...] list, quote it: YAML splits at the commas)" if not numbers else ""
        raise ValueError(f"{units.shown(value)}: {kind} takes {len(names)} numbers: {kind},"
                         f"{','.join(n.upper() for n in names)}{quote}")
    try:
        mapping = {"kind": kind.strip(), **{n: int(v) for n, v in zip(names, numbers)}}
    except ValueError:
        raise ValueError(f"{units.shown(value)}: parameters must be whole numbers") from None
    return _checked_topology(mapping, value)


def _checked_topology(mapping: Any, written: Any = None) -> Any:
    """The topology validated here, so that an error names the parameter (a list of tagged
    unions loses it in pydantic's location): `{'kind': 'bcube', ...}: n: must lie ...`."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(TopologySpec).validate_python(mapping)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"][1:])  # [0] is the union's tag
        message = error["msg"].removeprefix("Value error, ")
        raise ValueError(f"{units.shown(written if written is not None else mapping, 60)}: "
                         f"{where + ': ' if where else ''}{message}") from None


class SweepSpec(_Strict):
    """Axes crossed with each other and with agents.algorithms, each in the order written;
    an axis left out keeps the lab's (or workload's) one value."""

    topologies: list[Annotated[TopologySpec, BeforeValidator(_topology)]] = Field(default_factory=list, max_length=100)
    link_rates: list[Rate] = Field(default_factory=list, max_length=100)
    sizes: list[Size] = Field(default_factory=list, max_length=100)
    partitionings: list[PartitioningSpec] = Field(default_factory=list, max_length=100,
                                                  description="ByteScheduler settings, each replacing `partitioning`")
    placements: list[Literal["packed", "spread", "random"]] = Field(
        default_factory=list, max_length=3, description="with jobs: each replaces every {count} job's placement")
    queues: list[QueueSetting] = Field(default_factory=list, max_length=20,
                                         description="each replaces links.queue, e.g. [1000, {packets: 1000, "
                                                     "discipline: red, min: 20, max: 20, nodrop: true}]")
    tcp_congestion: list[Annotated[str, Field(pattern=r"^[a-z0-9_]+$", max_length=15)]] = Field(
        default_factory=list, max_length=10, description="each replaces servers.tcp_congestion, e.g. [cubic, dctcp]")


# -- the file -------------------------------------------------------------------------------------
AUTO_PLACEHOLDER = "1Gbit"


class ExperimentSpec(_Strict):
    name: Name
    description: str = Field("", max_length=2000)
    plugins: list[str] = Field([], max_length=16, description="files registering algorithms, relative to this file "
                               "(loaded before agents.algorithms is read)")
    lab: LabSpec
    agents: AgentsSpec
    iterations: int = Field(5, strict=True, ge=1, le=MAX_ITERATIONS)
    warmup: int = Field(0, strict=True, ge=0, le=MAX_ITERATIONS, description="first iterations left out of the statistics")
    partitioning: PartitioningSpec = PartitioningSpec()
    faults: Timeline = Timeline()
    monitoring: bool = Field(False, strict=True)
    timeout: Annotated[float, BeforeValidator(units.parse_duration)] = Field(
        600.0, gt=0, description="per run of one algorithm, e.g. 600s")
    sweep: SweepSpec = SweepSpec()
    jobs: list[JobSpec] = Field(default_factory=list, max_length=16,
                                description="several jobs on one fabric, each alone and then all together")
    # `lab.links.bandwidth: auto`: the highest rate this machine carries faithfully, chosen at
    # plan time from its calibration (experiment/plan.py); the lab holds AUTO_PLACEHOLDER till then
    auto_bandwidth: bool = Field(False, exclude=True, json_schema_extra={"hidden": True})

    @model_validator(mode="before")
    @classmethod
    def _auto_bandwidth(cls, data: Any) -> Any:
        links = data.get("lab", {}).get("links") if isinstance(data, dict) and isinstance(data.get("lab"), dict) else None
        if isinstance(links, dict) and links.get("bandwidth") == "auto":
            if data.get("sweep", {}).get("link_rates") if isinstance(data.get("sweep"), dict) else False:
                raise ValueError("lab.links.bandwidth: auto picks one rate; sweep.link_rates names several: keep one")
            data = {**data, "lab": {**data["lab"], "links": {**links, "bandwidth": AUTO_PLACEHOLDER}},
                    "auto_bandwidth": True}
        return data

    @model_validator(mode="after")
    def _fits_together(self) -> "ExperimentSpec":
        if self.warmup >= self.iterations:
            raise ValueError(f"warmup ({self.warmup}) must be less than iterations ({self.iterations}): "
                             "some iterations must be measured")
        kind = self.agents.workload.kind
        if self.sweep.sizes and kind not in SIZED_KINDS:
            raise ValueError(f"sweep.sizes: the {kind} workload has a fixed size; sizes apply to "
                             f"{' and '.join(SIZED_KINDS)}")
        self._frameworks_fit()
        self._jobs_fit()
        from orchestrator.agent import transports  # a table of names; no I/O

        if why := transports.lacks(self.agents.transport, self.lab.rdma, "lab.rdma"):
            raise ValueError(f"agents.transport: {why}")
        links = self.lab.links
        labels = [setting.label for setting in self.sweep.queues]
        for index, label in enumerate(labels):
            if label in labels[:index]:
                raise ValueError(f"sweep.queues.{index}: the same queue as sweep.queues.{labels.index(label)} "
                                 f"({label}): give each once")
        for index, setting in enumerate(self.sweep.queues):  # each as the lab would take it
            links.check_discipline(setting.discipline, setting.packets, f"sweep.queues.{index}", self.lab.needs_netem)
        points = (max(1, len(self.sweep.topologies)) * max(1, len(self.sweep.link_rates))
                  * max(1, len(self.sweep.queues)) * max(1, len(self.sweep.tcp_congestion))
                  * max(1, len(self.sweep.sizes)) * max(1, len(self.sweep.partitionings))
                  * (len(self.agents.algorithms) or 2 * len(self.jobs)) * max(1, len(self.sweep.placements)))
        if points > MAX_POINTS:
            raise ValueError(f"the sweep expands to {points} runs, more than {MAX_POINTS}: split the experiment")
        return self

    def _jobs_fit(self) -> None:
        """Jobs replace the algorithm axis; what they do not take yet is refused here."""
        if not self.jobs:
            if not self.agents.algorithms:
                raise ValueError("agents.algorithms: give at least one algorithm (or jobs: several jobs, each with its own)")
            if self.sweep.placements:
                raise ValueError("sweep.placements: placements place jobs: give jobs:, or leave placements out")
            return
        if self.agents.algorithms:
            raise ValueError("agents.algorithms: with jobs:, each job names its algorithm: leave agents.algorithms out")
        if len(self.jobs) < 2:
            raise ValueError("jobs: one job is an experiment without jobs: list two or more")
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("jobs: two jobs have one name: give each its own")
        for index, job in enumerate(self.jobs):
            if job.start.after is not None and (job.start.after not in names or job.start.after == job.name):
                raise ValueError(f"jobs.{index}.start.after: {units.shown(job.start.after)} is no other job: use one of "
                                 f"{', '.join(n for n in names if n != job.name)}")
            if job.iterations is not None and job.iterations <= self.warmup:
                raise ValueError(f"jobs.{index}.iterations: {job.iterations} leaves nothing after the warm-up "
                                 f"({self.warmup}): give more")
        seen: set[str] = set()
        for job in self.jobs:  # a chain of `after`s must reach a job that starts on its own
            walk, name = set(), job.name
            by_name = {j.name: j for j in self.jobs}
            while name is not None and name not in seen:
                if name in walk:
                    raise ValueError(f"jobs: {' and '.join(sorted(walk))} wait for each other in a circle: one of them "
                                     "must start on its own (start: {at: 0s})")
                walk.add(name)
                name = by_name[name].start.after
            seen |= walk
        if self.faults.events:
            raise ValueError("faults: with jobs:, each job has its own timeline (jobs.N.faults): move the events there")
        for field, given in (("sweep.sizes", self.sweep.sizes),
                             ("sweep.partitionings", self.sweep.partitionings),
                             ("partitioning", self.partitioning.partition_bytes or self.partitioning.credit_bytes)):
            if given:
                raise ValueError(f"{field}: not taken with jobs: yet: leave it out")
        for index, job in enumerate(self.jobs):
            compute = getattr(job.workload or self.agents.workload, "compute", None)
            if compute is not None and compute.varies:
                where = f"jobs.{index}.workload" if job.workload else "agents.workload"
                raise ValueError(f"{where}.compute: stragglers are not taken with jobs: yet: give one duration")
            if job.algorithm.framework is not None:
                raise ValueError(f"jobs.{index}.algorithm: a framework's job is not taken yet: use the project's "
                                 "algorithms")
            if job.algorithm.ps:
                raise ValueError(f"jobs.{index}.algorithm.ps: a job's parameter servers are not taken yet: use "
                                 "colocated ones (options: {colocated: true})")

    def _frameworks_fit(self) -> None:
        """What a framework's points cannot take, refused before anything is planned."""
        from orchestrator import frameworks  # a table of names; no I/O

        for index, algorithm in enumerate(self.agents.algorithms):
            if algorithm.framework is None:
                continue
            framework = frameworks.get(algorithm.framework)
            where = f"agents.algorithms.{index}: framework {framework.name}"
            kind = self.agents.workload.kind
            if kind not in framework.workloads:
                raise ValueError(f"{where} runs the {', '.join(framework.workloads)} workloads, not {kind}")
            if self.faults.events:
                raise ValueError(f"{where} runs without the agents' fault timeline: put its runs in an experiment "
                                 "without faults")
            if self.partitioning.partition_bytes or self.sweep.partitionings:
                raise ValueError(f"{where} reduces the whole gradient at once: leave partitioning out")


def load_experiment(path: str | Path) -> ExperimentSpec:
    """The validated experiment of the file at `path`.

    `lab:` as a string is a lab file relative to the experiment file's directory, read (and
    its errors named) as a lab file; as a mapping it is validated in place."""
    from orchestrator import plugins
    from orchestrator.errors import PluginError, SpecError
    from orchestrator.spec.loader import display_path, load, read_yaml, validate

    path = Path(path)
    data = read_yaml(path)
    plugins.load_entry_points()
    try:
        plugins.load_for_experiment(data.get("plugins"), path)
    except PluginError as exc:
        raise SpecError(f"{display_path(path)}: {exc}") from None
    lab = data.get("lab")
    if isinstance(lab, str):
        if not lab.strip():
            raise SpecError(f"{display_path(path)}: lab: empty: give a lab file or a lab mapping")
        try:
            data = {**data, "lab": load(LabSpec, path.parent / lab).model_dump(mode="json")}
        except SpecError as exc:  # the lab file's own line, said as part of this file's `lab:`
            raise SpecError(f"{display_path(path)}: lab: {exc}") from None
    return validate(ExperimentSpec, data, str(path))
