"""The lab file: one YAML document describing a network and its servers.

Only `name` and `topology` are required:

    name: bcube-4-1
    topology: {kind: bcube, n: 4, k: 1}          # Guo et al. notation: n^(k+1) servers
    links: {bandwidth: 100Mbit, delay: 0ms, jitter: 0ms, loss: 0, queue: 1000, mtu: 1500}
    servers: {runtime: docker, image: testbed/server:latest, cpus: 0.5, memory: 512M, tcp_congestion: cubic}
    rdma: none                                   # or softroce
    management: {subnet: auto}                   # out-of-band network, e.g. 198.18.5.0/24
    addressing: {data: 10.0.0.0/8, links: 172.16.0.0/12}
"""

from __future__ import annotations

import ipaddress
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator import files, units
from orchestrator.spec import queues

# Lab names become parts of directory and namespace names; the CLI checks every lab name it
# is given against the same rule.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,23}$"
NAME_RULE = "lower-case letters, digits and '-', at most 24 characters"
Name = Annotated[str, Field(pattern=NAME_PATTERN, description=NAME_RULE)]


def _wrap(parser):
    def validate(value: Any) -> Any:
        if value is None:
            return value
        return parser(value)

    return validate


# -- what the kernel and Docker take, through our code -----------------------------------------
# Measured through emulation/kernel.py (pyroute2 0.9.7, Linux 6.18) unless said otherwise.
# HTB: pyroute2 sends TCA_HTB_RATE64 from 2^32 bytes/s up, so the kernel takes up to 2^64-1
# bytes/s (pyroute2 fails to pack beyond, ~2^67 bit/s; `tc` shows 0bit from 2^64 bit/s). The
# floor comes from shape()'s bucket of at least two frames (kernel.bucket_bytes; 131,098 bytes
# at MTU 65535), which HTB holds as u32 ticks of 64 ns: below 3,815 bit/s it no longer fits.
# We take a round 10kbit, and 1Tbit: the largest unit we parse, measured to build and read
# back exactly, and >100x what a veth carried here (8.7 Gbit/s).
MIN_RATE, MAX_RATE = 10_000, 10**12
# netem: delay and jitter are u32 ticks of 64 ns, at most 274.9 s (measured: pyroute2 refuses
# beyond). 60 s one way is already past TCP giving up on a connection (6 SYN retries, 127 s).
MAX_NETEM_DELAY = 60.0
# Queue in packets: pfifo's limit is an s32 in pyroute2, netem's limit and txqueuelen are u32;
# a million is far beyond any sensible buffer. A full queue holds queue × mtu bytes per link
# direction; 1 GiB of it is already an absurd buffer.
MAX_QUEUE, MAX_QUEUE_BYTES = 1_000_000, 1 << 30
# veth takes MTUs 68..65535 (measured); 576 is the datagram every IPv4 host must accept.
MIN_MTU, MAX_MTU = 576, 65535
# dockerd refuses memory limits under 6 MiB (linuxMinMemory); more than 1 TiB per emulated
# server is a typo. Whether the host has it is checked at `up`, not here.
MIN_MEMORY, MAX_MEMORY = 6 << 20, 1 << 40
# CFS quota needs >= 1 ms per 100 ms period (Docker's --cpus minimum 0.01); dockerd refuses more
# CPUs than the host has, which only `up` can know, so the schema only refuses nonsense.
MIN_CPUS, MAX_CPUS = 0.01, 1024
# TCP_CA_NAME_MAX is 16 bytes with the NUL (include/net/tcp.h).
MAX_CONGESTION_NAME = 15
MAX_INITCWND = 1000  # segments: a first window of 1.4 MB; anything bigger is a typo
# distribution/reference's grammar: [domain[:port]/]path-component[/...][:tag][@digest], path
# components lower-case alphanumerics joined by '.', '_', '__' or dashes; names <= 255 chars.
_IMAGE_DOMAIN = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = re.compile(
    rf"(?P<name>(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)
MAX_IMAGE_NAME = 255


def _format_size(size: float) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}B"


def _format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _within(low: float, high: float, show: Callable[[Any], str], advice: str) -> AfterValidator:
    """Refuse values outside [low, high] with the range and what to do, in the field's units."""

    def check(value: Any) -> Any:
        if value is not None and not low <= value <= high:
            raise ValueError(f"must lie between {show(low)} and {show(high)} (got {show(value)}): {advice}")
        return value

    return AfterValidator(check)


def _whole_microseconds(value: float) -> float:
    # shape() hands netem whole microseconds: a smaller non-zero value would silently become 0.
    if 0 < value < 1e-6:
        raise ValueError(f"must be 0 or at least 1us (got {value * 1e9:g}ns): netem counts microseconds")
    return value


Rate = Annotated[
    int,
    BeforeValidator(_wrap(units.parse_rate)),
    _within(MIN_RATE, MAX_RATE, units.format_rate, "the range HTB shapes here; write e.g. 100Mbit or 10Gbit"),
    PlainSerializer(units.format_rate),
]
Seconds = Annotated[
    float,
    BeforeValidator(_wrap(units.parse_duration)),
    PlainSerializer(lambda s: f"{s * 1000:g}ms"),
]
NetemTime = Annotated[
    Seconds,
    _within(0.0, MAX_NETEM_DELAY, _format_seconds, "netem delays one link by at most that; e.g. 2ms"),
    AfterValidator(_whole_microseconds),
]
Bytes = Annotated[int, BeforeValidator(_wrap(units.parse_size))]
Percent = Annotated[float, BeforeValidator(_wrap(units.parse_percent))]
Network = Annotated[ipaddress.IPv4Network, PlainSerializer(str)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BCubeSpec(_Strict):
    """BCube(n, k) in Guo et al.'s notation: k+1 levels, n^(k+1) servers, (k+1)·n^k switches."""

    kind: Literal["bcube"]
    n: int = Field(strict=True, ge=2, le=64, description="switch port count")
    k: int = Field(strict=True, ge=0, le=7, description="highest level (k+1 levels)")


class FatTreeSpec(_Strict):
    """Al-Fares fat-tree: k pods, k^3/4 hosts, 5k^2/4 switches."""

    kind: Literal["fattree"]
    k: int = Field(strict=True, ge=2, le=64, description="switch port count, even")

    @field_validator("k")
    @classmethod
    def _even(cls, k: int) -> int:
        if k % 2:
            raise ValueError(f"must be even (got {k}): a fat-tree splits switch ports in halves")
        return k


class TorusSpec(_Strict):
    """k-ary d-cube, server-centric: every server links to its ±1 neighbours in each dimension."""

    kind: Literal["torus"]
    k: int = Field(strict=True, ge=2, le=64, description="nodes per dimension")
    d: int = Field(strict=True, ge=1, le=6, description="dimensions")


class BiGraphSpec(_Strict):
    """EFLOPS BiGraph: switches split in two halves, complete bipartite between them."""

    kind: Literal["bigraph"]
    switches: int = Field(strict=True, ge=2, le=128, description="switch count, even")
    servers_per_switch: int = Field(strict=True, ge=1, le=128)

    @field_validator("switches")
    @classmethod
    def _even(cls, switches: int) -> int:
        if switches % 2:
            raise ValueError(f"must be even (got {switches}): BiGraph has two equal halves")
        return switches


class LeafSpineSpec(_Strict):
    kind: Literal["leafspine"]
    leaves: int = Field(strict=True, ge=1, le=256)
    spines: int = Field(strict=True, ge=1, le=64)
    servers_per_leaf: int = Field(strict=True, ge=1, le=253)


class StarSpec(_Strict):
    """Servers on one L2 switch: the control case for every algorithm."""

    kind: Literal["star"]
    servers: int = Field(strict=True, ge=1, le=4000)


MAX_GRAPH_NODES, MAX_GRAPH_LINKS = 8192, 32768
NODE_NAMES = "node names are a lower case letter, then letters, digits or _, at most 10 (Linux interface names)"
NodeName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,9}$", description=NODE_NAMES)]


class GraphLinkSpec(_Strict):
    """One link of a graph: its two nodes and, optionally, a rate, delay and queue of its own."""

    a: NodeName
    b: NodeName
    bandwidth: Rate | None = None
    delay: NetemTime | None = None
    queue: int | None = Field(None, strict=True, ge=1, le=MAX_QUEUE, description="packets, e.g. 100")


def _graph_link(value: Any) -> Any:
    """A link as `[a, b]` or `a-b`, or a mapping with a bandwidth."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"a": value[0], "b": value[1]}
    if isinstance(value, str) and value.count("-") == 1:
        a, b = value.split("-")
        return {"a": a, "b": b}
    return value


class GraphSpec(_Strict):
    """Any network (topology/graph.py): servers (one NIC per link; those under `relays`
    forward), l2 and l3 switches, links. `file:` reads them from GraphML or networkx
    node-link JSON beside the lab file instead (a server's `relay: true` lists it)."""

    kind: Literal["graph"]
    servers: tuple[NodeName, ...] = Field(min_length=1, max_length=4096, description=NODE_NAMES)
    l2: tuple[NodeName, ...] = Field((), max_length=MAX_GRAPH_NODES, description=NODE_NAMES)
    l3: tuple[NodeName, ...] = Field((), max_length=MAX_GRAPH_NODES, description=NODE_NAMES)
    links: tuple[Annotated[GraphLinkSpec, BeforeValidator(_graph_link)], ...] = Field(
        min_length=1, max_length=MAX_GRAPH_LINKS, description="[a, b], a-b or {a, b, bandwidth, delay, queue}")
    relays: tuple[NodeName, ...] = Field((), max_length=4096, description="servers that forward packets not "
                                         "theirs (as BCube's); no other server does")

    @property
    def label(self) -> str:
        """`graph-8s-1a2b3c4d`: its servers and a digest of the whole graph, for run ids and keys."""
        import hashlib

        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:8]
        return f"graph-{len(self.servers)}s-{digest}"

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or "file" not in data:
            return data
        extra = set(data) - {"kind", "file"}
        if extra:
            raise ValueError(f"file: gives the whole graph; drop {', '.join(sorted(map(str, extra)))}")
        directory = (info.context or {}).get("directory", Path("."))
        return {"kind": "graph", **read_graph_file(directory, data["file"])}

    @model_validator(mode="after")
    def _routable(self) -> "GraphSpec":
        from orchestrator.errors import TopologyError
        from orchestrator.topology import graph  # pure: the builder's own rules, said as one line

        try:
            graph.check(list(self.servers), list(self.l2), list(self.l3), [(link.a, link.b) for link in self.links],
                        self.relays)
        except TopologyError as exc:
            raise ValueError(str(exc)) from None
        return self


MAX_GRAPH_FILE_BYTES = 4 << 20


def read_graph_file(directory: Path, name: Any) -> dict:
    """servers, l2, l3 and links of a GraphML (.graphml, .xml) or networkx node-link JSON
    (.json) file: every node's `role` is server, l2 or l3 (a server's `relay: true` makes it
    forward); a link's optional `bandwidth`,
    `delay` and `queue` are its own (e.g. 50Mbit, 2ms, 100). ValueError (one line) for anything else."""
    import json

    import networkx as nx

    if not isinstance(name, str) or not name.strip():
        raise ValueError("file: give a .graphml or .json file beside the lab file")
    path = directory / name
    if Path(name).is_absolute():
        raise ValueError(f"file: {name} is an absolute path: name it relative to the lab file")
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ValueError(f"file: {name}: no such file (relative to the lab file)") from None
    if not resolved.is_relative_to(Path(directory).resolve()):
        raise ValueError(f"file: {name} leaves the lab file's directory (through .. or a symlink): keep it beside it")
    try:
        text = files.read_regular(resolved, MAX_GRAPH_FILE_BYTES)
    except files.NotRegular:
        raise ValueError(f"file: {name}: not a regular file") from None
    except files.TooLarge as exc:
        raise ValueError(f"file: {name}: {exc.size:,} bytes, more than the {MAX_GRAPH_FILE_BYTES:,} a graph may "
                         "have") from None
    except OSError as exc:
        raise ValueError(f"file: {name}: cannot be read ({exc.strerror})") from None
    try:
        if path.suffix in (".graphml", ".xml"):
            graph = nx.parse_graphml(text)
        elif path.suffix == ".json":
            graph = nx.node_link_graph(json.loads(text), edges="links")
        else:
            raise ValueError("not .graphml, .xml or .json")
    except (ValueError, KeyError, TypeError, nx.NetworkXError, OSError) as exc:
        raise ValueError(f"file: {name}: not a graph this lab reads ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # the XML parser's own errors (ParseError, ExpatError)
        raise ValueError(f"file: {name}: not a graph this lab reads ({type(exc).__name__}: {exc})") from None
    roles: dict[str, list[str]] = {"server": [], "l2": [], "l3": []}
    relays = []
    for node, attributes in graph.nodes(data=True):
        role = attributes.get("role")
        if role not in roles:
            raise ValueError(f"file: {name}: node {node} has role {role!r}: give each node role server, l2 or l3")
        roles[role].append(str(node))
        if attributes.get("relay") not in (None, False, "false"):
            if attributes.get("relay") not in (True, "true"):
                raise ValueError(f"file: {name}: node {node} has relay {attributes.get('relay')!r}: give true or false")
            relays.append(str(node))
    links = []
    for a, b, attributes in graph.edges(data=True):
        link = {"a": str(a), "b": str(b)}
        for key in ("bandwidth", "delay", "queue"):
            if attributes.get(key) is not None:
                link[key] = attributes[key]
        links.append(link)
    return {"servers": roles["server"], "l2": roles["l2"], "l3": roles["l3"], "links": links, "relays": relays}


# -- the lab-file model of each topology kind ----------------------------------------------------
# Paired with the kind's record (topology/kinds.py) by `orchestrator.spec.register_topology`;
# the `topology:` union is made from this table whenever a model's schema is built.
TOPOLOGY_SPECS: dict[str, type[BaseModel]] = {}


def kind_name(model: Any) -> str:
    """The kind a topology model's `kind: Literal["name"]` field names; ValueError otherwise."""
    fields = getattr(model, "model_fields", None) if isinstance(model, type) and issubclass(model, BaseModel) else None
    kind = (fields or {}).get("kind")
    names = typing.get_args(kind.annotation) if kind is not None and typing.get_origin(kind.annotation) is Literal else ()
    if len(names) != 1 or not isinstance(names[0], str):
        raise ValueError(f"{getattr(model, '__name__', model)!s}: a topology spec is a pydantic model with a field "
                         "`kind: Literal[\"name\"]`")
    return names[0]


class TopologySpec:
    """The `topology:` of a lab file: one of the registered kinds' models, chosen by `kind`."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return handler(Annotated[Union[tuple(TOPOLOGY_SPECS.values())], Field(discriminator="kind")])

    @staticmethod
    def tagged_models() -> dict[str, type[BaseModel]]:
        """kind → model, for error messages (spec/loader.py)."""
        return dict(TOPOLOGY_SPECS)


for _model in (BCubeSpec, FatTreeSpec, TorusSpec, BiGraphSpec, LeafSpineSpec, StarSpec, GraphSpec):
    TOPOLOGY_SPECS[kind_name(_model)] = _model


def topology_kinds() -> tuple[str, ...]:
    return tuple(TOPOLOGY_SPECS)


MAX_LINK_OVERRIDES = 4096


class LinkOverride(_Strict):
    """One link (both directions) with a rate, delay or queue of its own: a slower uplink, an
    oversubscribed tier, a long-haul link, a shallow buffer."""

    link: str = Field(pattern=r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.]+$", max_length=64,
                      description="NODE-NODE as `testbed status` lists it, e.g. l0s0-h00")
    bandwidth: Rate | None = Field(None, description="e.g. 50Mbit")
    delay: NetemTime | None = Field(None, description="one way, e.g. 2ms (needs sch_netem)")
    queue: int | None = Field(None, strict=True, ge=1, le=MAX_QUEUE, description="packets, e.g. 100")

    @model_validator(mode="after")
    def _something(self) -> "LinkOverride":
        if self.bandwidth is None and self.delay is None and self.queue is None:
            raise ValueError(f"{self.link}: give the link's own bandwidth, delay or queue (or drop the entry)")
        return self


class LinksSpec(_Strict):
    """Every fabric link, both directions. Delay, jitter and loss need sch_netem. `overrides`
    give single links a rate of their own (the cost model and pacing use each link's)."""

    bandwidth: Rate = Field(default=1_000_000_000, description="e.g. 100Mbit, 1Gbit")
    delay: NetemTime = 0.0
    jitter: NetemTime = 0.0
    loss: Percent = 0.0
    queue: int = Field(strict=True, default=1000, ge=1, le=MAX_QUEUE,
                       description="packets, e.g. 1000; or {packets, discipline, ...} (spec/queues.py)")
    discipline: queues.Discipline = Field(default_factory=queues.Fifo,
                                          description="fifo, or {kind: red | codel | fq_codel, ...}")
    mtu: int = Field(strict=True, default=1500, ge=MIN_MTU, le=MAX_MTU, description="bytes; 9000 for jumbo frames")
    overrides: tuple[LinkOverride, ...] = Field((), max_length=MAX_LINK_OVERRIDES,
                                          description="links with a rate, delay or queue of their own, e.g. "
                                                      "[{link: l0-s0, bandwidth: 50Mbit, delay: 2ms, queue: 100}]")

    _hoist_queue = model_validator(mode="before")(queues.hoist_queue)

    @property
    def needs_netem(self) -> bool:
        return self.delay > 0 or self.jitter > 0 or self.loss > 0 or any(o.delay for o in self.overrides)

    @model_validator(mode="after")
    def _discipline_fits(self) -> "LinksSpec":
        self.check_discipline(self.discipline)
        return self

    def check_discipline(self, discipline: queues.Discipline, queue: int | None = None, where: str = "links",
                         netem: bool | None = None) -> None:
        """`discipline` on these links (ValueError, one line): against `queue` (default the
        links' own) and each override's own queue, which it names; `netem`: whether a link has
        delay, jitter or loss (default these links')."""
        netem = self.needs_netem if netem is None else netem
        own = queue or self.queue
        queues.check(discipline, own, self.mtu, netem, where)
        for override in self.overrides:
            if override.queue:
                queues.check(discipline, min(own, override.queue), self.mtu, netem, f"{where} on {override.link}")

    @model_validator(mode="after")
    def _jitter_needs_delay(self) -> "LinksSpec":
        if self.jitter > self.delay:
            raise ValueError("jitter must not exceed delay (netem draws delay ± jitter)")
        for index, override in enumerate(self.overrides):
            _delay_covers_jitter(f"overrides.{index}.delay", override.delay, self.jitter)
        return self

    @model_validator(mode="after")
    def _queue_fits_memory(self) -> "LinksSpec":
        _queue_fits("queue", self.queue, self.mtu)
        for index, override in enumerate(self.overrides):
            _queue_fits(f"overrides.{index}.queue", override.queue, self.mtu)
        return self


def _delay_covers_jitter(where: str, delay: float | None, jitter: float) -> None:
    """A link's own delay against the lab's jitter: netem draws delay ± jitter."""
    if delay is not None and jitter > delay:
        raise ValueError(f"{where}: {_format_seconds(delay)} is less than the links' jitter {_format_seconds(jitter)} "
                         "(netem draws delay ± jitter): raise it")


def _queue_fits(where: str, queue: int | None, mtu: int) -> None:
    """A queue (the lab's, or a link's own) against the memory one full queue may hold."""
    if queue is not None and queue * mtu > MAX_QUEUE_BYTES:
        raise ValueError(f"{where}: {queue} × mtu {mtu} is more than the {_format_size(MAX_QUEUE_BYTES)} one full "
                         f"queue may hold: lower it to at most {MAX_QUEUE_BYTES // mtu} at this mtu")


class ServersSpec(_Strict):
    runtime: Literal["docker", "netns"] = "docker"
    image: str = Field(default="testbed/server:latest", min_length=1)
    cpus: float | None = Field(
        default=None, ge=MIN_CPUS, le=MAX_CPUS, allow_inf_nan=False, description="CPU share per server, e.g. 0.5"
    )
    memory: Annotated[
        Bytes | None,
        _within(MIN_MEMORY, MAX_MEMORY, _format_size, "Docker needs at least 6MiB; e.g. 512M"),
    ] = Field(default=None, description="memory limit per server, e.g. 512M")
    # Pinned, not inherited: hosts differ (Debian defaults to cubic, some clouds to bbr), and
    # on shaped links BBR's probing stalls single flows for ~100 ms, which a synchronous
    # collective pays on every step (ring on star,8 at 200 Mbit: 0.82 × link with bbr, 0.95
    # with cubic).
    tcp_congestion: str = Field(
        default="cubic", pattern=r"^[a-z0-9_]+$", max_length=MAX_CONGESTION_NAME,
        description="TCP congestion control of the servers' data-plane connections, e.g. cubic, reno, bbr, dctcp",
    )
    # ECN asked for on the servers' routes (`features ecn`): what a marking queue needs to
    # mark rather than drop. dctcp negotiates it on its own; other controls only when asked.
    ecn: bool | None = Field(None, description="ask for ECN on every connection (null: with dctcp only)")
    # A data center's first window, not the Internet's (Linux's 10, RFC 6928). Behind a
    # fabric whose queues hold a few hundred milliseconds, a new connection that starts at 10
    # segments spends its first seconds in slow start: a colocated PS of 27 MB on bcube,4,1 at
    # 100 Mbit took 1.8, 1.6, 1.5, 1.3 × the model's time in its first iterations, 1.1 × with
    # 100 (the model, like RDMA, has no slow start). Also the receive window's (initrwnd).
    initcwnd: int | None = Field(
        default=100, ge=1, le=MAX_INITCWND,
        description="initial congestion and receive window of the servers' data routes, in segments "
                    "(null: the kernel's own, 10)",
    )

    # Off, as in many data centers' hosts: a connection idle for longer than its RTO restarts
    # from its initial window otherwise (Linux's default, RFC 2861), and behind an emulated
    # link's queue its round trips are long, so every step of an algorithm whose partner
    # changes from step to step began in slow start (halving-doubling on star,8 at 200 Mbit:
    # 1.24-1.26 × the model's time with it on, 1.10-1.11 off; its 512 KiB chunks arriving at
    # half the link's rate in a step's first 200 ms).
    tcp_slow_start_after_idle: bool = Field(
        default=False,
        description="whether the servers' TCP restarts an idle connection from its initial window "
                    "(net.ipv4.tcp_slow_start_after_idle)",
    )

    @field_validator("cpus", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of CPUs, e.g. 0.5")
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, image: str) -> str:
        # The length check first: the pattern then never sees a long string.
        match = len(image) <= MAX_IMAGE_NAME + 200 and IMAGE_PATTERN.fullmatch(image)
        if not match or len(match["name"]) > MAX_IMAGE_NAME:
            raise ValueError(
                f"{units.shown(image)} is not a Docker image reference: write "
                "[registry/]repository[:tag] in lower case, e.g. testbed/server:latest"
            )
        return image


class ManagementSpec(_Strict):
    """Out-of-band network: a bridge in the root namespace, one `mgmt0` on every server."""

    subnet: Network | Literal["auto"] = Field(
        default="auto", description="'auto' picks a free /24 (or larger) in 198.18.0.0/15"
    )


class AddressingSpec(_Strict):
    """Pools for data-plane addresses; they live inside the lab's namespaces only."""

    data: Network = Field(
        default=ipaddress.IPv4Network("10.0.0.0/8"), description="server-facing subnets"
    )
    links: Network = Field(
        default=ipaddress.IPv4Network("172.16.0.0/12"),
        description="router-to-router /31 links",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> "AddressingSpec":
        if self.data.overlaps(self.links):
            raise ValueError(f"data pool {self.data} overlaps links pool {self.links}")
        return self


class LabSpec(_Strict):
    name: Name
    topology: TopologySpec
    links: LinksSpec = LinksSpec()
    servers: ServersSpec = ServersSpec()
    rdma: Literal["none", "softroce"] = "none"
    management: ManagementSpec = ManagementSpec()
    addressing: AddressingSpec = AddressingSpec()

    @property
    def _graph_links(self) -> tuple:
        return self.topology.links if self.topology.kind == "graph" else ()

    @property
    def needs_netem(self) -> bool:
        """Whether any link is delayed, jittered or lossy (sch_netem): the links' own or a graph link's."""
        return self.links.needs_netem or any(link.delay for link in self._graph_links)

    @model_validator(mode="after")
    def _graph_links_fit(self) -> "LabSpec":
        for index, link in enumerate(self._graph_links):
            _delay_covers_jitter(f"topology.links.{index}.delay", link.delay, self.links.jitter)
            _queue_fits(f"topology.links.{index}.queue", link.queue, self.links.mtu)
            if link.queue is not None or link.delay:  # the lab's discipline on a link's own queue
                queues.check(self.links.discipline, link.queue or self.links.queue, self.links.mtu, bool(link.delay),
                             f"topology.links.{index}: links")
        return self

    @model_validator(mode="after")
    def _management_apart(self) -> "LabSpec":
        subnet = self.management.subnet
        if subnet != "auto":
            for pool_name in ("data", "links"):
                pool = getattr(self.addressing, pool_name)
                if subnet.overlaps(pool):
                    raise ValueError(
                        f"management.subnet {subnet} overlaps addressing.{pool_name} {pool}: "
                        "pick disjoint ranges"
                    )
        return self
