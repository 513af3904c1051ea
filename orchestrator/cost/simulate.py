"""A flow-level, event-driven simulation of the schedules the agents run.

What it honours, as agent/engine.py does:
- per-range order, chunk by chunk (messages of `chunk_bytes`): a chunk of a step-s send
  leaves once every earlier receive into its range has been applied; an incoming chunk of
  step s is applied once every earlier receive into, and send out of, its range is done,
  and until then its sender's stream waits (HTTP/2 flow control; the window is left out);
- a rank writes its sends step after step: a step's sends start once its earlier steps'
  sends are written (the sends of one step run at once);
- partitions start by priority, at most `credit_bytes` of them in flight per rank (a
  partition is in flight until its sends are written and its receives applied);
- every transfer waits α (per-message latency) plus its path's link delay once its first
  chunk may leave, then streams.

What it leaves out, on purpose: HTTP/2 windows, TCP's slow start and losses, and the CPU.
The max-min split is what the agents pace their connections at (shares.py): TCP alone
does not reach it where connections cross two bottlenecks.

Bandwidth: each link direction carries `Network.payload_rate`, shared max-min fairly by the
connections crossing it (one per sender and peer address, as the agents open one gRPC
channel per address and multiplex their streams on it; a connection's rate is split
evenly among its transfers that can send). See `routes` for ECMP.

Granularity: a transfer is one fluid flow, not one per message. It sends up to its gate
(the end of the last chunk its dependencies allow) in one piece, and an event happens only
when something changes the allocation: a transfer finishes or reaches its gate, a waiting
one's next chunk clears (computed from the rates of the transfers it waits for), a latency
ends. Transfers whose inputs are complete (a mesh step, most of a ring step) therefore cost
one or two events however many messages they carry; only transfers that forward what is
still arriving (pipelined trees, a parameter server's pull) step chunk by chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule
from orchestrator.cost.fairness import max_min_rates
from orchestrator.cost.network import Network
from orchestrator.cost.ranges import Ranges
from orchestrator.cost.routes import Routes

# What a message of a transfer is when the caller does not say: the agents' default
# (agent/plan.py DEFAULT_CHUNK_BYTES; the model may not import the agent).
DEFAULT_CHUNK_BYTES = 512 * 1024
_TIME_SLACK = 1e-9  # events this close (relative to the time to the next one) are simultaneous
# Flow updates (live transfers summed over events) one prediction may take: the event loop's
# time is proportional to them, about 20 s for MAX_WORK on this project's 2-core machines
# (a ring's events grow with its transfers and so do the transfers live at each: n³).
MAX_WORK = 4_000_000


class ModelTooLarge(ValueError):
    """A prediction that would take longer than one may (MAX_WORK flow updates)."""


@dataclass(eq=False)
class Flow:
    """One transfer of a schedule as the simulation runs it. Positions are in elements of
    the buffer, progress in bytes."""

    partition: int
    step: int
    src: int
    dst: int
    lo: int
    hi: int
    chunk: int  # elements per message
    itemsize: int
    connection: int
    lead: float  # seconds from its first clear chunk to its first byte: α + path delay
    send_after: list = field(default_factory=list)  # (flow, lo, hi): must be applied first
    apply_after: list = field(default_factory=list)  # at the receiver: applied or written first
    sent: float = 0.0
    gate: float = 0.0  # bytes it may have sent now
    rate: float = 0.0
    flowing_at: float | None = None  # when its bytes may flow (once its first chunk cleared)
    finished: float | None = None

    size: float = 0.0  # bytes
    tolerance: float = 0.0  # bytes of float error below which it counts as there

    def __post_init__(self) -> None:
        self.size = float((self.hi - self.lo) * self.itemsize)
        self.tolerance = 1e-3 + 1e-9 * self.size

    def done_to(self) -> int:
        """Element offset up to which its messages have been applied (whole chunks)."""
        if self.finished is not None:
            return self.hi
        chunk_bytes = self.chunk * self.itemsize
        whole = int((self.sent + self.tolerance) // chunk_bytes)
        return min(self.hi, self.lo + whole * self.chunk)

    def bytes_to(self, offset: int) -> float:
        """Bytes it must have sent for its messages to cover [lo, offset)."""
        chunks = math.ceil((offset - self.lo) / self.chunk)
        return min(self.size, chunks * self.chunk * self.itemsize)

    def blocked_at(self) -> int:
        """Element offset of its first message that may not leave yet (hi if none)."""
        limit = self.hi
        for other, lo, hi in self.send_after + self.apply_after:
            reached = other.done_to()
            if reached < hi:
                limit = min(limit, max(reached, lo))
        if limit >= self.hi:
            return self.hi
        return self.lo + (limit - self.lo) // self.chunk * self.chunk

    def clears_in(self) -> float:
        """Seconds until its blocked message clears at the current rates (inf: unknown yet)."""
        start = self.lo + int(round(self.gate / self.itemsize))
        end = min(start + self.chunk, self.hi)
        wait = 0.0
        for other, lo, hi in self.send_after + self.apply_after:
            reached = other.done_to()
            if max(reached, lo) >= end or hi <= start or reached >= hi:
                continue
            need = other.bytes_to(min(end, hi))
            if other.rate <= 0 or other.gate < need - other.tolerance:
                return math.inf  # it waits itself: its own event comes first
            wait = max(wait, (need - other.sent) / other.rate)
        return wait


@dataclass
class Simulation:
    """The outcome: when the last transfer finished, and every flow with its times."""

    seconds: float
    flows: list[Flow]
    link_bytes: list[float]  # by link direction index of `routes.directions`
    routes: Routes
    events: int


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
    ) -> None:
        self.routes = routes
        self.network = network
        self.capacity = network.payload_rate
        self.credit = credit_bytes
        self.flows: list[Flow] = []
        self.connections: dict[tuple[int, object], int] = {}  # (rank, peer address) → index
        self.usage: list = []
        chunk = max(1, chunk_bytes // itemsize)
        ranks = schedules[0][1].ranks if schedules else 0
        if len(nodes) < ranks:
            raise ValueError(f"{ranks} ranks but only {len(nodes)} nodes to place them on")
        self.sends: dict[tuple[int, int], list[list[Flow]]] = {}  # (partition, rank) → sends by step
        self.receives_left: dict[tuple[int, int], int] = {}
        self.cost = [part.length * itemsize for part, _ in schedules]
        for p, (_, schedule) in enumerate(schedules):
            self._add(p, schedule, nodes, chunk, itemsize)
        self.ranks = ranks
        # per rank: partitions by priority, the next to start, bytes in flight
        order = sorted(range(len(schedules)), key=lambda p: (schedules[p][0].priority, p))
        self.queue = {r: list(order) for r in range(ranks)}
        self.next = dict.fromkeys(range(ranks), 0)
        self.in_flight = dict.fromkeys(range(ranks), 0)
        self.cursor: dict[tuple[int, int], int] = {}
        self.left: dict[tuple[int, int], int] = {}
        self.open: set[tuple[int, int]] = set()  # (partition, rank) started and not done
        self.live: dict[int, Flow] = {}  # id → started, unfinished flows, in start order
        self.now = 0.0
        self.events = 0
        self.work = 0  # flow updates so far: what the event loop's time grows with
        self.max_work = max_work

    def _add(self, p: int, schedule: Schedule, nodes: Sequence[str], chunk: int, itemsize: int) -> None:
        """The flows of partition `p`, each with the earlier ones it waits for (see `ranges`)."""
        routes, network = self.routes, self.network
        received: dict[int, Ranges] = {}  # rank → latest receives by range
        written: dict[int, Ranges] = {}  # rank → sends by range since its latest receive there
        for step_no, step in enumerate(schedule.steps):
            flows = []
            for t in step:
                usage, hops = routes.usage(nodes[t.src], nodes[t.dst], t.nic)
                key = (t.src, routes.address(nodes[t.dst], t.nic))
                connection = self.connections.setdefault(key, len(self.connections))
                if connection == len(self.usage):
                    self.usage.append(usage)
                flow = Flow(p, step_no, t.src, t.dst, t.offset, t.end, chunk, itemsize, connection,
                            network.latency + network.delay * hops)
                flow.send_after = received.setdefault(t.src, Ranges()).touching(t.offset, t.end)
                flow.apply_after = (received.setdefault(t.dst, Ranges()).touching(t.offset, t.end)
                                    + written.setdefault(t.dst, Ranges()).touching(t.offset, t.end))
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
            self.flows += flows

    # -- program order and credit ---------------------------------------------------------
    def _admit(self, rank: int) -> None:
        queue = self.queue[rank]
        while self.next[rank] < len(queue):
            p = queue[self.next[rank]]
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
        else:
            self.left[(p, rank)] = 0
            self._maybe_done(p, rank)

    def _maybe_done(self, p: int, rank: int) -> None:
        if (p, rank) not in self.open or self.left.get((p, rank)) or self.receives_left.get((p, rank), 0):
            return
        if self.cursor[(p, rank)] < len(self.sends.get((p, rank), [])):
            return
        self.open.discard((p, rank))
        self.in_flight[rank] -= self.cost[p]
        self._admit(rank)

    def _finish(self, flow: Flow) -> None:
        flow.sent, flow.finished = flow.size, self.now
        del self.live[id(flow)]
        key = (flow.partition, flow.src)
        self.left[key] -= 1
        if self.left[key] == 0:
            self._next_step(*key)
        self.receives_left[(flow.partition, flow.dst)] -= 1
        self._maybe_done(flow.partition, flow.dst)

    # -- the event loop -------------------------------------------------------------------
    def run(self) -> float:
        for rank in range(self.ranks):
            self._admit(rank)
        allocated_for: tuple = ()
        stalls = 0
        while self.live:
            self.events += 1
            flows = list(self.live.values())
            self.work += len(flows)
            if self.work > self.max_work:
                raise ModelTooLarge(f"the model re-shared bandwidth {self.events:,} times among up to {len(flows):,} "
                                    f"transfers ({self.work:,} flow updates) and is not done: more than the "
                                    f"{self.max_work:,} one prediction may take; use fewer servers or a larger "
                                    "message size")
            for flow in flows:
                flow.gate = (flow.blocked_at() - flow.lo) * flow.itemsize
                if flow.flowing_at is None and flow.gate > 0:
                    flow.flowing_at = self.now + flow.lead
            active = [f for f in flows if f.flowing_at is not None and f.flowing_at <= self.now
                      and f.sent < f.gate - f.tolerance]
            key = tuple(id(f) for f in active)
            if key != allocated_for:
                self._allocate(active)
                allocated_for = key
            moving = {id(f) for f in active}
            waiting = [f for f in flows if id(f) not in moving]
            dt = math.inf
            for flow in active:
                dt = min(dt, (flow.gate - flow.sent) / flow.rate)
            for flow in waiting:
                if flow.flowing_at is not None and flow.flowing_at > self.now:
                    dt = min(dt, flow.flowing_at - self.now)
                elif flow.gate < flow.size:  # its next message (or its first) waits on others
                    dt = min(dt, flow.clears_in())
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
                if flow.sent >= flow.size - flow.tolerance:
                    self._finish(flow)
        unfinished = [f for f in self.flows if f.finished is None]
        if unfinished:
            f = unfinished[0]
            raise RuntimeError(f"{len(unfinished)} transfers never started, e.g. rank {f.src} → {f.dst} "
                               f"in step {f.step} of partition {f.partition} (a bug)")
        return self.now

    def _allocate(self, active: list[Flow]) -> None:
        by_connection: dict[int, list[Flow]] = {}
        for flow in active:
            by_connection.setdefault(flow.connection, []).append(flow)
        connections = list(by_connection)
        rates = max_min_rates([self.usage[c] for c in connections], self.capacity)
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
                out[link] += flow.size * share
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
) -> Simulation:
    """Simulate one allreduce of [(Partition, Schedule)] (priority order) with rank r on
    server `nodes[r]` of `routes.topology`; ModelTooLarge beyond `max_work` flow updates."""
    run = _Run(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize, max_work)
    seconds = run.run()
    return Simulation(seconds, run.flows, run.link_bytes(), routes, run.events)
