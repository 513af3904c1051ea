"""A flow-level, event-driven simulation of the schedules the agents run.

What it honours, as agent/engine.py and the kernel's sockets do:
- per-range order, chunk by chunk (messages of `chunk_bytes`): a chunk of a step-s send
  leaves once every earlier receive into its range has been applied at its sender; an
  arrived chunk of step s is applied once every earlier receive into, and send out of, its
  range is done at its receiver, and once the receiver has entered its iteration;
- buffers: a transfer's bytes cross the wire ahead of being applied, up to
  `receive_buffer_bytes` (the receiver's socket buffer and the agent's staging), and a rank
  counts a send as written once every chunk of it may leave and at most
  `send_buffer_bytes` of it wait to (its socket's send buffer): its next step's sends
  start then (the sends of one step run at once), and queue behind what is left of the
  earlier ones to the same peer;
- a rendezvous (`rendezvous`, the tcp transport's READY): a transfer Schedule.rendezvous
  marks (into a rank that heard, in an earlier step, from a rank not sending to it now)
  leaves only once its receiver has applied those earlier receives and its word has come
  back (its α and the path's delay), so a rank a step ahead does not share a downlink with
  the step before (halving-doubling on star,8 at 4 MiB: 1.75 S/B, eager 2.5);
- partitions start by priority, at most `credit_bytes` of them in flight per rank (a
  partition is in flight until its sends have arrived and its receives are applied);
- iterations back to back: a rank enters the next once it is done with every partition of
  the last and has computed `compute_s`; so one rank's next iteration overlaps another's
  last, as in a run (traces of halving-doubling on nine ranks: the seven that take no part
  in its first and last step start the next iteration a gradient's time early);
- every transfer waits α, the agents' work on a message, plus its path's link delay once
  its first chunk may leave; then it streams. A rank writes a step's messages one after
  another (its j-th waits (j + 1)·α), and where more ranks send in a step than the agents
  have cores (`Network.cores`), they take turns where their CPU work cannot hide behind
  their bytes: each α stretches by up to senders / cores (`_stretch`). So the first
  messages flow while the rank prepares the rest, and a zero-byte step of T messages from
  S ranks lasts about T·α / min(cores, S). Measured on a 2-core machine, α fitted to a
  zero-byte ring over 8, 9 and 16 servers this way came out 0.6-0.95 ms, and a ping-pong
  between two idle servers 0.74-1.1 ms (experiment/calibrate.py).

What it leaves out, on purpose: TCP's slow start and losses, and the CPU beyond α (a
workload's compute does not take cores from the agents' messages). The max-min
split is what the agents pace their connections at (shares.py): TCP alone does not reach it
where connections cross two bottlenecks.

Bandwidth: each link direction carries `Network.payload_rate`, shared max-min fairly by the
connections crossing it (one per sender and peer address, as the agents open one
connection per address and multiplex their streams on it; a connection's rate is split
evenly among its transfers that can send). See `routes` for ECMP.

Granularity: a transfer is one fluid flow, not one per message. It sends up to its gate
(the end of the last chunk its dependencies and its buffer allow) in one piece, and an
event happens only when something changes: a transfer arrives or reaches its gate, a
waiting one's next chunk clears or its receiver applies more (computed from the rates of
the transfers it waits for), a latency ends, a rank enters an iteration. Transfers whose
inputs are complete (a mesh step, most of a ring step) therefore cost one or two events
however many messages they carry; only transfers that forward what is still arriving
(pipelined trees, a parameter server's pull) step chunk by chunk.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule
from orchestrator.cost.fairness import MaxMin
from orchestrator.cost.network import Network
from orchestrator.cost.ranges import Ranges
from orchestrator.cost.routes import Routes

# What a message of a transfer is when the caller does not say: the agents' default
# (agent/plan.py DEFAULT_CHUNK_BYTES; the model may not import the agent).
DEFAULT_CHUNK_BYTES = 512 * 1024
# Bytes of a transfer that may cross the wire ahead of its receiver applying them: the
# kernel's receive buffer, autotuned up to tcp_rmem's maximum (16 MiB on these machines),
# and the tcp transport's staging of chunks that may not land yet (32 MiB).
DEFAULT_RECEIVE_BUFFER_BYTES = 16 * 2**20
# Bytes of a send the kernel takes before they leave: the tcp transport's fixed socket
# buffer (agent/transports SEND_BUFFER_BYTES; callers pass the transport's own).
DEFAULT_SEND_BUFFER_BYTES = 3 * 2**20
_TIME_SLACK = 1e-9  # events this close (relative to the time to the next one) are simultaneous
# Flow updates (live transfers summed over events) one prediction may take: the event loop's
# time is proportional to them, 17-18 µs each on this project's 2-core machines (a ring of
# 64 at 25 MB, a tree on fattree,4), so about 20 s for MAX_WORK (a ring's events grow with
# its transfers and so do the transfers live at each: n³).
MAX_WORK = 1_200_000
_SHARED_SETS = 4096  # sets of connections whose rates are kept (each a list as long as the set)
_MAX_DEPTH = 200  # transfers one wait may chain through before the estimate gives up (safely)


class ModelTooLarge(ValueError):
    """A prediction that would take longer than one may (MAX_WORK flow updates)."""


@dataclass(eq=False)
class Flow:
    """One transfer of a schedule as the simulation runs it. Positions are in elements of
    the buffer, progress in bytes."""

    partition: int  # iteration × partitions per iteration + the partition
    step: int
    src: int
    dst: int
    lo: int
    hi: int
    chunk: int  # elements per message
    itemsize: int
    connection: int
    lead: float  # seconds from its first clear chunk to its first byte: (j + 1)·α (stretched) + path delay
    index: int = 0  # creation order: every transfer it waits for comes earlier
    send_after: list = field(default_factory=list)  # (flow, lo, hi): applied at the sender first
    apply_after: list = field(default_factory=list)  # receives at the receiver: applied first
    written_after: list = field(default_factory=list)  # the receiver's own sends: written first
    sent: float = 0.0  # bytes on the wire so far
    gate: float = 0.0  # bytes it may have sent now
    rate: float = 0.0
    applied: int = -1  # element offset up to which the receiver has applied it (whole chunks)
    handed: int = -1  # element offset up to which its sender has written it into the socket
    flowing_at: float | None = None  # when its bytes may flow (once its first chunk cleared)
    written: bool = False  # its sender has handed it over: its next step may start
    arrived: float | None = None  # when its last byte crossed
    finished: float | None = None  # when its last chunk was applied
    held: bool = False  # its receiver has not entered its iteration yet
    ready_to: int = 0  # how far its receiver may apply it this event (set with `applied`)
    # rendezvous: when its receiver had entered its step (every receive of an earlier step of
    # the partition applied; None: not yet), and the receiver's word's way back (α + delay)
    ready_at: float | None = None
    back: float = 0.0
    meets: bool = False  # it waits for its receiver at all (Schedule.rendezvous)

    size: float = 0.0  # bytes
    tolerance: float = 0.0  # bytes of float error below which it counts as there

    def __post_init__(self) -> None:
        self.size = float((self.hi - self.lo) * self.itemsize)
        self.tolerance = 1e-3 + 1e-9 * self.size
        if self.applied < 0:
            self.applied = self.lo
        if self.handed < 0:
            self.handed = self.lo

    def whole(self, offset: int) -> int:
        """`offset` down to a message boundary (hi stays hi)."""
        return offset if offset >= self.hi else self.lo + (offset - self.lo) // self.chunk * self.chunk

    def whole_up(self, offset: int) -> int:
        """The end of the message holding element `offset` − 1: what must be there for it."""
        return min(self.hi, self.lo + -(-(offset - self.lo) // self.chunk) * self.chunk)

    def arrived_to(self) -> int:
        """Element offset up to which its messages have crossed the wire."""
        if self.sent >= self.size - self.tolerance:
            return self.hi
        return min(self.hi, self.lo + int((self.sent + self.tolerance) // (self.chunk * self.itemsize)) * self.chunk)

    def bytes_to(self, offset: int) -> float:
        """Bytes it must have sent for its messages to cover [lo, offset)."""
        chunks = math.ceil((offset - self.lo) / self.chunk)
        return min(self.size, chunks * self.chunk * self.itemsize)

    def limit(self, after: list) -> int:
        """How far (element offset) the transfers in `after` allow it, message by message, by
        how far each is applied at its receiver (`_Run._update` has this loop written out)."""
        limit = self.hi
        for other, lo, hi in after:
            reached = other.applied
            if reached < hi:
                reached = reached if reached > lo else lo
                if reached < limit:
                    limit = reached
        return self.whole(limit)


def peer_counts(schedules: Sequence[tuple[Partition, Schedule]]) -> dict[int, int]:
    """Each rank's distinct peers over the run (those it sends to or receives from)."""
    peers: dict[int, set[int]] = {}
    for _, schedule in schedules:
        for step in schedule.steps:
            for t in step:
                if t.src != t.dst:
                    peers.setdefault(t.src, set()).add(t.dst)
                    peers.setdefault(t.dst, set()).add(t.src)
    return {rank: len(others) for rank, others in peers.items()}


# Peers a rank's α holds: a ring's (the one it sends to, the one it hears from), on which α is
# measured (experiment/calibrate.py)
BASE_PEERS = 2


def alphas(network: Network, schedules: Sequence[tuple[Partition, Schedule]]) -> dict[int, float]:
    """Each rank's α: the network's, and `peer_latency` for every peer past BASE_PEERS."""
    if network.peer_latency <= 0:
        return {}
    return {rank: network.latency + network.peer_latency * max(0, count - BASE_PEERS)
            for rank, count in peer_counts(schedules).items()}


def _stretch(network: Network, step, itemsize: int, alpha: dict[int, float] | None = None) -> float:
    """How much longer than α a message of `step` takes where its S senders share C cores
    (`network.cores`; None: a core per rank). Each sender needs m·α of CPU (its messages) and
    w for its busiest NIC's bytes; the CPU work overlaps the bytes, so the step takes
    max(m·α + w, S·m·α / C): the CPU is the bound only when all of it cannot fit beside the
    bytes. A sender's last message leaves at m·α·stretch and its bytes (w/m) follow, the
    others' bytes having gone meanwhile; so, as a stretch of α: max(1, S/C − w / (m²·α)). A
    zero-byte ring of 9 on 2 cores: 4.5; a 4 MiB one: 1 (its CPU hides behind the bytes: 4 MiB
    rings and meshes on 9 servers ran at 0.90 × a model that stretched α by S/C whatever the
    bytes). A 64 KiB mesh of 8 takes what a zero-byte one does (11.2 and 11.4 ms measured): its
    CPU does not hide behind its bytes, and w / (m·α) took 6/7 of its bytes' time off it."""
    cores = network.cores
    senders = {t.src for t in step}
    if not cores or len(senders) <= cores or (network.latency <= 0 and not alpha):
        return 1.0
    messages: dict[int, int] = {}
    nic_bytes: dict[tuple, int] = {}
    for t in step:
        messages[t.src] = messages.get(t.src, 0) + 1
        nic_bytes[(t.src, t.nic)] = nic_bytes.get((t.src, t.nic), 0) + (t.end - t.offset) * itemsize
    cpu, count = max((m * (alpha or {}).get(rank, network.latency), m) for rank, m in messages.items())
    if cpu <= 0:
        return 1.0
    wire = max(nic_bytes.values()) / network.payload_rate
    return max(1.0, len(senders) / cores - wire / (count * cpu))


def _reach(flow: Flow, offset: int, memo: dict, depth: int = 0) -> float:
    """Seconds until `flow` is applied up to `offset` at the current rates: math.inf when
    that waits on something whose own event comes first (or the chain is too long to follow;
    `memo["deep"]` then says so)."""
    offset = flow.whole_up(offset)  # it applies whole messages
    if flow.applied >= offset:
        return 0.0
    key = (flow.index, offset)
    if key in memo:
        return memo[key]
    memo[key] = math.inf  # a cycle cannot happen (waits point back), but stay finite in work
    if flow.held or depth > _MAX_DEPTH:
        memo["deep"] = memo.get("deep", False) or depth > _MAX_DEPTH
        return math.inf
    need = flow.bytes_to(offset)
    if flow.sent >= need - flow.tolerance:
        wait = 0.0
    elif flow.rate > 0 and flow.gate >= need - flow.tolerance:
        wait = (need - flow.sent) / flow.rate
    else:
        return math.inf
    for other, lo, hi in flow.apply_after:
        if other.applied < hi and max(other.applied, lo) < offset:
            wait = max(wait, _reach(other, min(hi, offset), memo, depth + 1))
            if math.isinf(wait):
                break
    for other, lo, hi in flow.written_after:
        if not math.isinf(wait) and other.handed < hi and max(other.handed, lo) < offset:
            wait = max(wait, _handed_in(other, min(hi, offset), memo["send_buffer"]))
    memo[key] = wait
    return wait


def _handed_in(flow: Flow, offset: int, send_buffer: float) -> float:
    """Seconds until its sender has written `flow` up to `offset` at its current rate
    (math.inf: it waits for its data, whose own event comes first)."""
    offset = flow.whole_up(offset)  # it writes whole messages
    if flow.handed >= offset:
        return 0.0
    need = flow.bytes_to(offset) - send_buffer
    if flow.sent >= need - flow.tolerance:
        return math.inf  # the socket has room: its data is what it waits for
    if flow.rate > 0 and flow.gate >= need - flow.tolerance:
        return (need - flow.sent) / flow.rate
    return math.inf


@dataclass
class Simulation:
    """The outcome: when the last transfer was applied, and every flow with its times."""

    seconds: float
    flows: list[Flow]
    link_bytes: list[float]  # per allreduce, by link direction index of `routes.directions`
    routes: Routes
    events: int
    exits: list[dict[int, float]]  # per iteration, when each rank left it
    work: int = 0  # flow updates it took (what its time grows with; MAX_WORK bounds it)

    @property
    def period(self) -> float:
        """Seconds per allreduce back to back, as a run measures it (experiment/results.py
        sync_times): from the slowest rank's exit of the first iteration to its exit of the
        last, over the iterations between; one allreduce's time when only one ran."""
        ends = [max(exits.values(), default=0.0) for exits in self.exits]
        return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else self.seconds


class _Run:
    def __init__(
        self,
        routes: Routes,
        schedules: Sequence[tuple[Partition, Schedule]],
        nodes: Sequence[str],
        network: Network,
        chunk_bytes: int,
        credit_bytes: int,
        itemsize: int,
        max_work: int = MAX_WORK,
        receive_buffer_bytes: int = DEFAULT_RECEIVE_BUFFER_BYTES,
        send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
        iterations: int = 1,
        compute_s: "float | Callable[[int, int], float]" = 0.0,
        rendezvous: "bool | Sequence[bool]" = False,
    ) -> None:
        self.routes = routes
        self.network = network
        self.capacity = routes.capacities(network)  # per link direction: links.overrides
        self.credit = credit_bytes
        self.buffer = float(receive_buffer_bytes)
        self.send_buffer = float(send_buffer_bytes)
        self.flows: list[Flow] = []
        # per schedule: do its sends take the rendezvous (jobs together: each its own)
        meets_by = [rendezvous] * len(schedules) if isinstance(rendezvous, bool) else list(rendezvous)
        if len(meets_by) != len(schedules):
            raise ValueError(f"rendezvous: one flag per schedule ({len(schedules)}), got {len(meets_by)}")
        self.rendezvous = rendezvous = any(meets_by)
        self.alpha = alphas(network, schedules)  # rank → its α, when peers cost (else network.latency)
        self.connections: dict[tuple[int, object], int] = {}  # (rank, peer address) → index
        self.usage: list = []
        # by flow index: the later flows that read its `applied` (their send_after and
        # apply_after) and its `handed` (their written_after), to update again when those
        # move; and 1 while it is in `pending` or not live (not started, or applied). Kept
        # off Flow: more attributes would cost every attribute access on it (Python shares
        # an instance dict's keys among a class's instances only up to 30 of them)
        self.on_applied: list[list[int]] = []
        self.on_handed: list[list[int]] = []
        self.queued = bytearray()
        chunk = max(1, chunk_bytes // itemsize)
        ranks = schedules[0][1].ranks if schedules else 0
        if len(nodes) < ranks:
            raise ValueError(f"{ranks} ranks but only {len(nodes)} nodes to place them on")
        self.sends: dict[tuple[int, int], list[list[Flow]]] = {}  # (partition, rank) → sends by step
        self.receives_left: dict[tuple[int, int], int] = {}  # (partition, rank) → receives not applied
        self.sends_left: dict[tuple[int, int], int] = {}  # (partition, rank) → sends not arrived
        self.per_iteration = len(schedules)
        self.iterations = iterations
        # seconds of compute before each next iteration; or per (iteration, rank), stragglers'
        # drawn times, then before the first iteration too
        self.compute = compute_s
        self.cost = [part.length * itemsize for part, _ in schedules] * iterations
        # per schedule, the sends that wait for their receivers: the same in every iteration
        meetings = [schedule.rendezvous() if meets else set() for (_, schedule), meets in zip(schedules, meets_by)]
        for i in range(iterations):  # iteration i's partition p is index i·P + p
            for p, (_, schedule) in enumerate(schedules):
                self._add(i * self.per_iteration + p, schedule, nodes, chunk, itemsize, meetings[p])
        self.ranks = ranks
        self.fair = MaxMin(self.usage, self.capacity)
        # connections active together → their rates: a ring's steps share a few such sets
        self.shared: dict[tuple[int, ...], list[float]] = {}
        # per rank: partitions by priority, iteration after iteration; the next to start,
        # bytes in flight; the iteration it is in and its partitions left there
        order = sorted(range(len(schedules)), key=lambda p: (schedules[p][0].priority, p))
        self.queue = {r: [i * self.per_iteration + p for i in range(iterations) for p in order] for r in range(ranks)}
        self.next = dict.fromkeys(range(ranks), 0)
        self.in_flight = dict.fromkeys(range(ranks), 0)
        self.entered = dict.fromkeys(range(ranks), 0)
        self.remaining = dict.fromkeys(range(ranks), self.per_iteration)
        self.exits: list[dict[int, float]] = [{} for _ in range(iterations)]  # iteration → rank → when it left
        self.timers: list[tuple[float, int]] = []  # (time, rank): the rank enters its next iteration then
        self.dirty = 0  # lowest flow index whose inputs changed since the last update
        self.admitting: set[int] = set()  # ranks inside _admit, and those asked again meanwhile
        self.again: set[int] = set()
        self.cursor: dict[tuple[int, int], int] = {}
        self.left: dict[tuple[int, int], int] = {}  # (partition, rank) → sends of its step not written
        self.open: set[tuple[int, int]] = set()  # (partition, rank) started and not done
        self.live: dict[int, Flow] = {}  # id → started flows not yet applied, in start order
        self.live_order: list[int] = []  # their indices, sorted
        # indices of live flows whose inputs changed since their last update (a heap): an
        # update is a function of the flow's bytes sent, its receiver's iteration and what
        # the flows it waits for have applied and handed over, so the others are as they were
        self.pending: list[int] = []
        self.now = 0.0
        self.events = 0
        self.work = 0  # flow updates so far: what the event loop's time grows with
        self.max_work = max_work
        # (partition, rank) → its receives' steps in order, and per step the receives not
        # applied by sender; the index of the first step with some left
        self.receive_steps: dict[tuple[int, int], list[int]] = {}
        self.receives_at: dict[tuple[int, int], dict[int, dict[int, int]]] = {}
        self.entered_index: dict[tuple[int, int], int] = {}
        self.blocked: dict[tuple[int, int], set[Flow]] = {}  # flows waiting for their receiver's step
        self.into: dict[tuple[int, int], list[Flow]] = {}  # (partition, rank) → the transfers it receives
        self.entered_at: dict[tuple[int, int], float] = {}  # (rank, iteration) → when it entered (else 0)
        for flow in self.flows if rendezvous else ():
            by_src = self.receives_at.setdefault((flow.partition, flow.dst), {}).setdefault(flow.step, {})
            by_src[flow.src] = by_src.get(flow.src, 0) + 1
            self.into.setdefault((flow.partition, flow.dst), []).append(flow)
        for key, counts in self.receives_at.items():
            self.receive_steps[key] = sorted(counts)
            self.entered_index[key] = 0
        self.senders_at: dict[tuple[int, int, int], frozenset] = {
            (p, dst, step): frozenset(by_src) for (p, dst), counts in self.receives_at.items()
            for step, by_src in counts.items()}

    def _ready_time(self, flow: Flow) -> float:
        """When `flow`'s receiver entered its step (`_receiver_ready` holds): it had entered
        the iteration and applied the earlier receives the step waits for."""
        when = self.entered_at.get((flow.dst, flow.partition // self.per_iteration), 0.0)
        now = self.senders_at.get((flow.partition, flow.dst, flow.step), ())
        for other in self.into.get((flow.partition, flow.dst), ()):
            if other.step < flow.step and other.src not in now and other.finished is not None:
                when = max(when, other.finished)
        return when

    def _receiver_ready(self, flow: Flow) -> bool:
        """Whether `flow`'s receiver has applied every receive of the partition's earlier steps
        from other senders than its own (those from its own sender come first on their
        connection anyway): the receiver's READY for its step has gone out."""
        key = (flow.partition, flow.dst)
        steps = self.receive_steps.get(key, [])
        counts, i = self.receives_at.get(key, {}), self.entered_index.get(key, 0)
        while i < len(steps) and not any(counts[steps[i]].values()):
            i += 1
        self.entered_index[key] = i
        now = self.senders_at.get((flow.partition, flow.dst, flow.step), ())
        for step in steps[i:]:
            if step >= flow.step:
                return True
            if any(n for src, n in counts[step].items() if src not in now):
                return False
        return True

    def _add(self, p: int, schedule: Schedule, nodes: Sequence[str], chunk: int, itemsize: int,
             meeting: set[tuple[int, int, int]]) -> None:
        """The flows of partition `p`, each with the earlier ones it waits for (see `ranges`);
        `meeting`: (step, src, dst) of its sends that take the rendezvous."""
        routes, network = self.routes, self.network
        received: dict[int, Ranges] = {}  # rank → latest receives by range
        written: dict[int, Ranges] = {}  # rank → sends by range since its latest receive there
        for step_no, step in enumerate(schedule.steps):
            flows = []
            stretch = _stretch(network, step, itemsize, self.alpha)
            earlier: dict[int, int] = {}  # rank → its messages earlier in this step
            for t in step:
                position = earlier.get(t.src, 0)
                earlier[t.src] = position + 1
                alpha = self.alpha.get(t.src, network.latency) * stretch
                usage, hops = routes.usage(nodes[t.src], nodes[t.dst], t.nic)
                key = (t.src, routes.address(nodes[t.dst], t.nic))
                connection = self.connections.setdefault(key, len(self.connections))
                if connection == len(self.usage):
                    self.usage.append(usage)
                flow = Flow(p, step_no, t.src, t.dst, t.offset, t.end, chunk, itemsize, connection,
                            alpha * (position + 1) + network.delay * hops, len(self.flows) + len(flows))
                flow.back = self.alpha.get(t.dst, network.latency) + network.delay * hops
                flow.meets = (step_no, t.src, t.dst) in meeting
                flow.send_after = received.setdefault(t.src, Ranges()).touching(t.offset, t.end)
                flow.apply_after = received.setdefault(t.dst, Ranges()).touching(t.offset, t.end)
                flow.written_after = written.setdefault(t.dst, Ranges()).touching(t.offset, t.end)
                self.on_applied.append([])
                self.on_handed.append([])
                self.queued.append(1)
                for other, _, _ in flow.send_after:
                    self.on_applied[other.index].append(flow.index)
                for other, _, _ in flow.apply_after:
                    self.on_applied[other.index].append(flow.index)
                for other, _, _ in flow.written_after:
                    self.on_handed[other.index].append(flow.index)
                flows.append(flow)
            for flow in flows:  # after the whole step: its transfers do not wait on each other
                received[flow.dst].put(flow.lo, flow.hi, step_no, flow)
                written[flow.dst].clear(flow.lo, flow.hi)
                written.setdefault(flow.src, Ranges()).add(flow.lo, flow.hi, flow)
                by_step = self.sends.setdefault((p, flow.src), [])
                if not by_step or by_step[-1][0].step != step_no:
                    by_step.append([])
                by_step[-1].append(flow)
                self.receives_left[(p, flow.dst)] = self.receives_left.get((p, flow.dst), 0) + 1
                self.sends_left[(p, flow.src)] = self.sends_left.get((p, flow.src), 0) + 1
            self.flows += flows

    # -- program order, credit and iterations ---------------------------------------------
    def _admit(self, rank: int) -> None:
        """Start the rank's next partitions, as credit and its iteration allow. A partition it
        has nothing to do in is done at once and admits the next: asked again while at it,
        it goes round once more instead of recursing (a thousand empty partitions)."""
        if rank in self.admitting:
            self.again.add(rank)
            return
        self.admitting.add(rank)
        try:
            while True:
                self.again.discard(rank)
                self._admit_once(rank)
                if rank not in self.again:
                    return
        finally:
            self.admitting.discard(rank)

    def _admit_once(self, rank: int) -> None:
        queue = self.queue[rank]
        while self.next[rank] < len(queue):
            p = queue[self.next[rank]]
            if p // self.per_iteration > self.entered[rank]:
                return  # the next iteration's: the rank enters it once done with this one
            cost = self.cost[p]
            if self.credit and self.in_flight[rank] and self.in_flight[rank] + cost > self.credit:
                return
            self.next[rank] += 1
            self.in_flight[rank] += cost
            self.open.add((p, rank))
            self.cursor[(p, rank)] = -1
            self._next_step(p, rank)

    def _next_step(self, p: int, rank: int) -> None:
        steps = self.sends.get((p, rank), [])
        self.cursor[(p, rank)] += 1
        index = self.cursor[(p, rank)]
        if index < len(steps):
            self.left[(p, rank)] = len(steps[index])
            for flow in steps[index]:
                self.live[id(flow)] = flow
                bisect.insort(self.live_order, flow.index)
                self.dirty = min(self.dirty, flow.index)
                self.queued[flow.index] = 0
                self._touch(flow)
        else:
            self.left[(p, rank)] = 0
            self._maybe_done(p, rank)

    def _maybe_done(self, p: int, rank: int) -> None:
        """Partition `p` is done for `rank` once its sends are written and have arrived (the
        receiver's acknowledgement) and its receives are applied."""
        key = (p, rank)
        if key not in self.open or self.left.get(key) or self.receives_left.get(key, 0) or self.sends_left.get(key, 0):
            return
        if self.cursor[key] < len(self.sends.get(key, [])):
            return
        self.open.discard(key)
        self.in_flight[rank] -= self.cost[p]
        self.remaining[rank] -= 1
        if self.remaining[rank] == 0:  # the rank leaves this iteration, and enters the next after its compute
            iteration = self.entered[rank]
            self.exits[iteration][rank] = self.now
            if iteration + 1 < self.iterations:
                self.remaining[rank] = self.per_iteration
                self.timers.append((self.now + self._compute(iteration + 1, rank), rank))
                self._enter_due()
        self._admit(rank)

    def _compute(self, iteration: int, rank: int) -> float:
        return self.compute(iteration, rank) if callable(self.compute) else self.compute

    def _enter_due(self) -> None:
        """Ranks whose compute before their next iteration is over enter it."""
        due = [(at, rank) for at, rank in self.timers if at <= self.now]
        self.timers = [(at, rank) for at, rank in self.timers if at > self.now]
        for _, rank in due:
            self.entered[rank] += 1
            self.entered_at[(rank, self.entered[rank])] = self.now
            for flow in self.live.values():  # what was held for it may be applied now
                if flow.dst == rank:
                    self.dirty = min(self.dirty, flow.index)
                    self._touch(flow)
            self._admit(rank)

    def _written(self, flow: Flow) -> None:
        flow.written = True
        key = (flow.partition, flow.src)
        self.left[key] -= 1
        if self.left[key] == 0:
            self._next_step(*key)

    def _arrived(self, flow: Flow) -> None:
        flow.sent, flow.arrived = flow.size, self.now
        key = (flow.partition, flow.src)
        self.sends_left[key] -= 1
        self._maybe_done(*key)

    def _applied(self, flow: Flow) -> None:
        flow.finished = self.now
        del self.live[id(flow)]
        self.queued[flow.index] = 1  # never updated again
        order = self.live_order
        del order[bisect.bisect_left(order, flow.index)]
        key = (flow.partition, flow.dst)
        self.receives_left[key] -= 1
        if self.rendezvous:
            counts = self.receives_at[key][flow.step]
            counts[flow.src] -= 1
            if counts[flow.src] == 0:
                for waiting in self.blocked.pop(key, ()):
                    if waiting.ready_at is None and id(waiting) in self.live:  # (one let go meanwhile: not again)
                        self.dirty = min(self.dirty, waiting.index)
                        self._touch(waiting)
        self._maybe_done(*key)

    # -- the event loop -------------------------------------------------------------------
    def _touch(self, flow: Flow) -> None:
        """Update `flow` in the next pass: something it depends on changed."""
        if not self.queued[flow.index]:
            self.queued[flow.index] = 1
            heapq.heappush(self.pending, flow.index)

    def _update(self) -> bool:
        """Apply what has arrived and may be applied, hand over what may be written, and set
        the gate of every live flow whose inputs changed (`pending`, in creation order: what
        one waits for comes first, and a flow whose `applied` or `handed` moves puts the later
        ones that read it there). True when a transfer was written or applied: what is live
        may have changed."""
        changed = []
        pending, flows, live = self.pending, self.flows, self.live
        entered, per_iteration, send_buffer, buffer = self.entered, self.per_iteration, self.send_buffer, self.buffer
        pop, push = heapq.heappop, heapq.heappush
        queued, on_applied, on_handed = self.queued, self.on_applied, self.on_handed
        while pending:
            index = pop(pending)
            flow = flows[index]
            queued[index] = 0
            if id(flow) not in live:
                continue
            lo, hi, chunk, itemsize = flow.lo, flow.hi, flow.chunk, flow.itemsize
            applied, handed = flow.applied, flow.handed
            flow.held = held = flow.partition // per_iteration > entered[flow.dst]
            if flow.meets and flow.ready_at is None:
                if held or not self._receiver_ready(flow):
                    self.blocked.setdefault((flow.partition, flow.dst), set()).add(flow)
                    continue  # nothing leaves before its receiver has entered the step
                flow.ready_at = self._ready_time(flow)
            if not held:
                limit = hi  # how far its receiver may apply it: earlier receives applied, earlier sends written
                for other, a, b in flow.apply_after:
                    reached = other.applied
                    if reached < b:
                        reached = reached if reached > a else a
                        if reached < limit:
                            limit = reached
                for other, a, b in flow.written_after:
                    reached = other.handed
                    if reached < b:
                        reached = reached if reached > a else a
                        if reached < limit:
                            limit = reached
                if limit < hi:
                    limit = lo + (limit - lo) // chunk * chunk
                flow.ready_to = limit  # kept for this event's gate and wait
                flow.applied = max(applied, min(flow.arrived_to(), limit))
            clear = hi  # the sender holds the data up to here (Flow.limit, written out: the hot loop)
            for other, a, b in flow.send_after:
                reached = other.applied
                if reached < b:
                    reached = reached if reached > a else a
                    if reached < clear:
                        clear = reached
            if clear < hi:
                clear = lo + (clear - lo) // chunk * chunk
            flow.handed = max(handed, min(clear, flow.whole(lo + int((flow.sent + send_buffer + flow.tolerance)
                                                                       // itemsize))))
            room = (flow.applied - lo) * itemsize + buffer  # _room
            if not held:
                room = max(room, (flow.ready_to - lo) * itemsize)
            flow.gate = max(flow.sent, min((clear - lo) * itemsize, room))
            if flow.flowing_at is None and flow.gate > 0:
                flow.flowing_at = self.now + flow.lead
                if flow.ready_at is not None:  # its sender writes once its receiver's word is back
                    flow.flowing_at = max(self.now, flow.ready_at + flow.back) + flow.lead
            if flow.applied != applied:
                for later in on_applied[index]:
                    if not queued[later]:
                        queued[later] = 1
                        push(pending, later)
            if flow.handed != handed:
                for later in on_handed[index]:
                    if not queued[later]:
                        queued[later] = 1
                        push(pending, later)
            if (not flow.written and flow.handed >= hi) or (flow.applied >= hi and flow.arrived is not None):
                changed.append(flow)
        for flow in changed:
            if not flow.written:
                self._written(flow)
            if flow.applied >= flow.hi and flow.arrived is not None and flow.finished is None:
                self._applied(flow)
        return bool(changed)

    def _room(self, flow: Flow) -> float:
        """Bytes of the flow its receiver can take now: what it may apply at once, or what it
        has applied and its buffer."""
        room = (flow.applied - flow.lo) * flow.itemsize + self.buffer
        if not flow.held:
            room = max(room, (flow.ready_to - flow.lo) * flow.itemsize)
        return room

    def _wait(self, flow: Flow, memo: dict) -> float:
        """Seconds until a flow that may not send now can send more, or until it is applied
        whole once arrived (math.inf: another flow's event comes first)."""
        if flow.arrived is not None:
            return _reach(flow, flow.hi, memo)
        if flow.meets and flow.ready_at is None:
            return math.inf  # its receiver's earlier receives, or its entering, come first
        # the gate is the lower of what the sender holds and what the receiver takes: wait for
        # whichever binds to pass the next message boundary beyond it (an earlier guess is safe)
        at = flow.lo + int(flow.gate // flow.itemsize)
        end = flow.whole_up(min(flow.hi, at + 1))
        gate = flow.gate + flow.tolerance
        wait = 0.0
        if (flow.limit(flow.send_after) - flow.lo) * flow.itemsize <= gate:  # its data is not there
            wait = max(wait, self._inputs_in(flow, end, memo))
        if self._room(flow) <= gate:  # its receiver is full: it applies more of what it holds, or
            room = _reach(flow, flow.whole_up(min(flow.hi, flow.applied + 1)), memo)
            if not flow.held:  # what it waits for to apply the next message gets there
                ready = 0.0
                for other, lo, hi in flow.apply_after:
                    if other.applied < hi and max(other.applied, lo) < end and lo < end:
                        ready = max(ready, _reach(other, min(hi, end), memo))
                for other, lo, hi in flow.written_after:
                    if other.handed < hi and max(other.handed, lo) < end and lo < end:
                        ready = max(ready, _handed_in(other, min(hi, end), self.send_buffer))
                room = min(room, ready)
            wait = max(wait, room)
        return wait

    @staticmethod
    def _inputs_in(flow: Flow, end: int, memo: dict) -> float:
        """Seconds until what `flow` forwards is applied at its sender up to `end`."""
        wait = 0.0
        for other, lo, hi in flow.send_after:
            if other.applied < hi and max(other.applied, lo) < end and lo < end:
                wait = max(wait, _reach(other, min(hi, end), memo))
        return wait

    def run(self) -> float:
        if callable(self.compute):  # every rank computes its own time before the first iteration
            for rank in range(self.ranks):
                self.entered[rank] = -1
                self.timers.append((self._compute(0, rank), rank))
            self._enter_due()
        for rank in range(self.ranks):
            self._admit(rank)
        allocated_for: tuple = ()
        stalls = 0
        while self.live or self.timers:
            if not self.live:  # every rank computes: on to the first that is done
                self.now = min(at for at, _ in self.timers)
                self._enter_due()
                continue
            self.events += 1
            self.dirty = 0  # every flow's inputs may have changed since the last event
            while True:  # then only those from the lowest one something happened to (they wait on earlier ones)
                # the work counted as though every live flow from `dirty` on were updated (the
                # budget's meaning), though only those whose inputs changed are (`pending`)
                order = self.live_order
                self.work += len(order) - bisect.bisect_left(order, self.dirty)
                if self.work > self.max_work:
                    raise ModelTooLarge(
                        f"the model re-shared bandwidth {self.events:,} times among up to {len(order):,} "
                        f"transfers ({self.work:,} flow updates) and is not done: more than the "
                        f"{self.max_work:,} one prediction may take; use fewer servers or a larger message size")
                self.dirty = len(self.flows)
                if not self._update():
                    break
            if not self.live:
                continue
            flows = [self.flows[i] for i in self.live_order]  # in creation order
            ready = [f for f in flows if f.flowing_at is not None and f.flowing_at <= self.now
                     and f.sent < f.gate - f.tolerance]
            active = self._served(ready, flows)
            key = tuple(id(f) for f in active)
            if key != allocated_for:
                self._allocate(active)
                allocated_for = key
            moving = {id(f) for f in ready}  # those queued behind another move once it has gone
            memo: dict = {"send_buffer": self.send_buffer}
            dt = math.inf
            for flow in active:
                dt = min(dt, (flow.gate - flow.sent) / flow.rate)
                unsent = flow.size - self.send_buffer - flow.sent
                if not flow.written and unsent > flow.tolerance:  # its last bytes fit its socket's buffer then
                    dt = min(dt, unsent / flow.rate)
                if not flow.written and flow.limit(flow.send_after) < flow.hi:  # or once all of it may leave
                    dt = min(dt, self._inputs_in(flow, flow.hi, memo))
            for flow in flows:
                if id(flow) in moving:
                    continue
                if flow.flowing_at is not None and flow.flowing_at > self.now:
                    dt = min(dt, flow.flowing_at - self.now)
                elif not flow.held or flow.arrived is None:
                    dt = min(dt, self._wait(flow, memo))
            if memo.get("deep") and active:  # a wait too long to follow: the next message boundary is safe
                dt = min(dt, min(min(f.gate - f.sent, f.chunk * f.itemsize) / f.rate for f in active))
            for at, _ in self.timers:
                dt = min(dt, at - self.now)
            if math.isinf(dt):
                raise RuntimeError(f"the model stalled at {self.now:.6f} s with {len(flows)} transfers waiting "
                                   "(a schedule whose ranges can never clear: a bug)")
            stalls = stalls + 1 if dt <= 0 else 0
            if stalls > 10 * len(flows) + 10:
                raise RuntimeError(f"the model makes no progress at {self.now:.6f} s (a bug)")
            horizon = dt * (1 + _TIME_SLACK) + 1e-15
            self.now += dt
            for flow in active:
                if (flow.gate - flow.sent) / flow.rate <= horizon:
                    flow.sent = flow.gate
                else:
                    flow.sent += flow.rate * dt
            for flow in active:
                self._touch(flow)  # its bytes sent moved
                if flow.arrived is None and flow.sent >= flow.size - flow.tolerance:
                    self._arrived(flow)
            self._enter_due()
        unfinished = [f for f in self.flows if f.finished is None]
        if unfinished:
            f = unfinished[0]
            raise RuntimeError(f"{len(unfinished)} transfers never started, e.g. rank {f.src} → {f.dst} "
                               f"in step {f.step} of partition {f.partition} (a bug)")
        return self.now

    @staticmethod
    def _served(ready: list[Flow], flows: list[Flow]) -> list[Flow]:
        """Of the flows that could send, those their connection carries now: a rank writes a
        partition's steps in turn into one socket, so a later step's bytes queue behind what
        is left of an earlier one's to the same peer (partitions' streams interleave)."""
        first: dict[tuple[int, int], int] = {}
        for flow in flows:
            if flow.arrived is None:
                key = (flow.connection, flow.partition)
                first[key] = min(first.get(key, flow.step), flow.step)
        return [flow for flow in ready if first[(flow.connection, flow.partition)] == flow.step]

    def _allocate(self, active: list[Flow]) -> None:
        by_connection: dict[int, list[Flow]] = {}
        for flow in active:
            by_connection.setdefault(flow.connection, []).append(flow)
        connections = tuple(by_connection)
        rates = self.shared.get(connections)
        if rates is None:
            if len(self.shared) >= _SHARED_SETS:
                self.shared.clear()
            rates = self.shared[connections] = self.fair.rates(connections)
        for connection, rate in zip(connections, rates):
            share = rate / len(by_connection[connection])
            for flow in by_connection[connection]:
                flow.rate = share
        moving = {id(flow) for flow in active}
        for flow in self.live.values():
            if id(flow) not in moving:
                flow.rate = 0.0
        for flow in active:
            if flow.rate <= 0:
                raise RuntimeError(f"rank {flow.src} → {flow.dst} got no bandwidth (a bug)")

    def link_bytes(self) -> list[float]:
        out = [0.0] * len(self.routes.directions)
        for flow in self.flows:
            for link, share in self.usage[flow.connection]:
                out[link] += flow.size * share / self.iterations  # per allreduce
        return out


def simulate(
    routes: Routes,
    schedules: Sequence[tuple[Partition, Schedule]],
    nodes: Sequence[str],
    network: Network,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    credit_bytes: int = 0,
    itemsize: int = 4,
    max_work: int = MAX_WORK,
    receive_buffer_bytes: int = DEFAULT_RECEIVE_BUFFER_BYTES,
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
    iterations: int = 1,
    compute_s: "float | Callable[[int, int], float]" = 0.0,
    rendezvous: "bool | Sequence[bool]" = False,
) -> Simulation:
    """Simulate `iterations` allreduces of [(Partition, Schedule)] (priority order) back to
    back, with rank r on server `nodes[r]` of `routes.topology`: each rank enters the next
    once it has left the last and computed `compute_s` (or `compute_s(iteration, rank)`, from the
    first iteration on: stragglers), as the agents do. The buffers: how far
    a transfer may run ahead of its receiver applying it, and how much of it its sender may
    hand over before it leaves (both 0: a transfer flows only as fast as it is applied, and a
    rank's next step waits for its sends to arrive). `rendezvous`: whether the sends
    Schedule.rendezvous marks wait for their receivers, for all schedules or one flag per
    schedule (jobs run together, each as its own prediction chose). ModelTooLarge beyond
    `max_work` flow updates."""
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    if receive_buffer_bytes < 0 or send_buffer_bytes < 0:
        raise ValueError("buffer sizes must not be negative")
    run = _Run(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize, max_work, receive_buffer_bytes,
               send_buffer_bytes, iterations, compute_s, rendezvous)
    seconds = run.run()
    return Simulation(seconds, run.flows, run.link_bytes(), routes, run.events, run.exits, run.work)
