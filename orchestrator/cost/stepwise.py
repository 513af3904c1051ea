"""A step-level model for plans past the event simulation's budget (labs of hundreds to
thousands of servers), in time and memory linear in the transfers.

The event simulation (simulate.py) re-shares bandwidth at every event among every live
transfer: a ring over N ranks costs it ~2N³ flow updates, so it stops near 100 servers.
This model keeps what decides the time at scale and drops the rest:
- every step's transfers share the links at the max-min rates of that step's connections
  all sending at once (a connection's rate split evenly among its transfers of the step),
  computed once per distinct set of connections (a ring's 2(N−1) steps share one);
- a transfer's bytes flow once its sender holds its first message's data (the part of the
  sender's latest receive that brings it has arrived, range by range), its sender's
  earlier sends are written (all but `send_buffer_bytes` of them gone), its lead has passed
  (α stretched and by position, as simulate.py prices it, plus its path's delay) and the
  link directions at its two ends have carried the earlier steps' bytes; it cannot end
  before what it forwards has arrived plus its own last message;
- partitions run at once: step k of every partition is one step.

What it leaves out: receives older than a rank's latest receiving step, bandwidth that
frees while some transfers of a step wait (rates are the step's, not the moment's), a next
step's stream sharing a link with the step before it (it waits instead), the receivers'
order of applying, credit and iterations back to back. Where both run, rings come out as the
event simulation says, HiPS within 2 %, halving-doubling at 0.74-1.08 of it
(bench/model_scale.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule
from orchestrator.cost.fairness import MaxMin
from orchestrator.cost.network import Network
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import BASE_PEERS, DEFAULT_CHUNK_BYTES, DEFAULT_SEND_BUFFER_BYTES


@dataclass
class StepRun:
    """The outcome: when the last transfer arrived, and the bytes every link direction carried."""

    seconds: float
    link_bytes: list[float]  # per allreduce, by link direction index of `routes.directions`
    steps: int


@dataclass
class _Step:
    src: np.ndarray
    dst: np.ndarray
    nic: np.ndarray  # the sender's NIC the schedule names, −1 for none
    lo: np.ndarray  # elements
    hi: np.ndarray
    conn: np.ndarray
    nbytes: np.ndarray


def _merged_steps(schedules: Sequence[tuple[Partition, Schedule]]) -> list[list]:
    """Step k of every partition as one list of transfers."""
    merged: list[list] = []
    for _, schedule in schedules:
        for k, step in enumerate(schedule.steps):
            if k == len(merged):
                merged.append([])
            merged[k].extend(step)
    return merged


class _Connections:
    """Connection indices by (sender, receiver, NIC), one per (sender, peer address) as the
    agents open them, and each one's link usage and hops."""

    def __init__(self, routes: Routes, nodes: Sequence[str]) -> None:
        self.routes, self.nodes = routes, nodes
        self.by_key: dict[tuple[int, int, int | None], int] = {}
        self.by_address: dict[tuple[int, object], int] = {}
        self.usage: list = []
        self.hops: list[float] = []
        self.pairs: set[tuple[int, int]] = set()
        self.out_link: list[int] = []  # the link direction it leaves its sender by (−1: none known)
        self.in_link: list[int] = []  # and the one it reaches its receiver by

    def index(self, src: int, dst: int, nic: int | None) -> int:
        key = (src, dst, nic)
        found = self.by_key.get(key)
        if found is not None:
            return found
        routes, nodes = self.routes, self.nodes
        address = (src, routes.address(nodes[dst], nic))
        found = self.by_address.get(address)
        if found is None:
            usage, hops = routes.usage(nodes[src], nodes[dst], nic)
            found = self.by_address[address] = len(self.usage)
            self.usage.append(usage)
            self.hops.append(hops)
            self.out_link.append(self._end(usage, nodes[src], True))
            self.in_link.append(self._end(usage, nodes[dst], False))
        self.by_key[key] = found
        self.pairs.add((min(src, dst), max(src, dst)))
        return found

    def _end(self, usage, server: str, leaving: bool) -> int:
        """The link direction of `usage` that leaves (or reaches) `server` with the largest share."""
        directions = self.routes.directions
        ends = [(share, link) for link, share in usage
                if (directions[link].src if leaving else directions[link].dst) == server]
        return max(ends)[1] if ends else -1


def _arrays(merged: list[list], connections: _Connections, itemsize: int) -> list[_Step]:
    steps = []
    index = connections.index
    for step in merged:
        n = len(step)
        steps.append(_Step(
            np.fromiter((t.src for t in step), dtype=np.int64, count=n),
            np.fromiter((t.dst for t in step), dtype=np.int64, count=n),
            np.fromiter((-1 if t.nic is None else t.nic for t in step), dtype=np.int64, count=n),
            np.fromiter((t.offset for t in step), dtype=np.int64, count=n),
            np.fromiter((t.offset + t.length for t in step), dtype=np.int64, count=n),
            np.fromiter((index(t.src, t.dst, t.nic) for t in step), dtype=np.int64, count=n),
            np.fromiter((t.length for t in step), dtype=float, count=n) * itemsize,
        ))
    return steps


def _positions(src: np.ndarray) -> np.ndarray:
    """Each transfer's place among its sender's transfers of the step (0 for the first)."""
    order = np.argsort(src, kind="stable")
    sorted_src = src[order]
    starts = np.r_[0, np.flatnonzero(sorted_src[1:] != sorted_src[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(src)]))
    positions = np.empty(len(src), dtype=np.int64)
    positions[order] = np.arange(len(src)) - run_start
    return positions


def _stretch(network: Network, step: _Step, alpha: np.ndarray, ranks: int) -> float:
    """simulate._stretch over arrays: α's stretch where more ranks send than there are cores."""
    cores = network.cores
    senders = np.unique(step.src)
    if not cores or len(senders) <= cores or not alpha.any():
        return 1.0
    messages = np.bincount(step.src, minlength=ranks)
    cpu = messages * alpha
    busiest = int(np.lexsort((messages, cpu))[-1])  # max (m·α, m), as simulate takes it
    if cpu[busiest] <= 0:
        return 1.0
    _, nic = np.unique(step.src * (int(step.nic.max()) + 2) + step.nic + 1, return_inverse=True)
    wire = float(np.bincount(nic, weights=step.nbytes).max()) / network.payload_rate  # the busiest NIC's bytes
    return max(1.0, len(senders) / cores - wire / (messages[busiest] * cpu[busiest]))


class _Receives:
    """Each rank's receives of its latest step that received any: where they lie in the
    buffer, and when they started and ended, so a send of what they bring waits for its part."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        empty = np.zeros(0)
        self.dst = np.zeros(0, dtype=np.int64)
        self.lo, self.hi, self.begin, self.arrive, self.rate = (np.zeros(0, dtype=np.int64),
                                                                np.zeros(0, dtype=np.int64), empty, empty, empty)
        self.starts = np.zeros(ranks + 1, dtype=np.int64)

    def replace(self, dst, lo, hi, begin, arrive, rate) -> None:
        """The step's receives take the place of their receivers' earlier ones."""
        keep = ~np.isin(self.dst, np.unique(dst))
        columns = [np.concatenate((old[keep], new)) for old, new in
                   ((self.dst, dst), (self.lo, lo), (self.hi, hi), (self.begin, begin), (self.arrive, arrive),
                    (self.rate, rate))]
        order = np.argsort(columns[0], kind="stable")
        self.dst, self.lo, self.hi, self.begin, self.arrive, self.rate = (c[order] for c in columns)
        self.starts = np.searchsorted(self.dst, np.arange(self.ranks + 1))

    def ready(self, src, lo, hi, chunk: int, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
        """For sends of [lo, hi) from `src`: when the first message's data and when all of it
        is there (0 where no latest receive brings any of it)."""
        n = len(src)
        first, whole = np.zeros(n), np.zeros(n)
        counts = self.starts[src + 1] - self.starts[src]
        total = int(counts.sum())
        if not total:
            return first, whole
        send = np.repeat(np.arange(n), counts)
        shift = np.repeat(self.starts[src] - np.r_[0, np.cumsum(counts)[:-1]], counts)
        entry = shift + np.arange(total)
        r_lo, r_hi = self.lo[entry], self.hi[entry]
        s_lo, s_hi = lo[send], hi[send]
        overlap = (r_lo < s_hi) & (s_lo < r_hi)
        if not overlap.any():
            return first, whole
        send, entry, r_lo, r_hi, s_lo, s_hi = (a[overlap] for a in (send, entry, r_lo, r_hi, s_lo, s_hi))
        begin, arrive, rate = self.begin[entry], self.arrive[entry], self.rate[entry]
        size = (r_hi - r_lo) * itemsize

        def reached(offset: np.ndarray) -> np.ndarray:
            # when the receive has brought [r_lo, offset): its whole messages, at its rate,
            # and no later than its end allows
            got = np.minimum(size, np.ceil((offset - r_lo) / chunk) * chunk * itemsize)
            return np.maximum(begin + got / rate, arrive - (size - got) / rate)

        np.maximum.at(first, send, reached(np.minimum(r_hi, np.maximum(s_lo, r_lo) + chunk)))
        np.maximum.at(whole, send, reached(np.minimum(r_hi, s_hi)))
        return first, whole


def stepwise(
    routes: Routes,
    schedules: Sequence[tuple[Partition, Schedule]],
    nodes: Sequence[str],
    network: Network,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    itemsize: int = 4,
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
) -> StepRun:
    """One allreduce of [(Partition, Schedule)] with rank r on server `nodes[r]`, step by step."""
    ranks = schedules[0][1].ranks if schedules else 0
    if len(nodes) < ranks:
        raise ValueError(f"{ranks} ranks but only {len(nodes)} nodes to place them on")
    connections = _Connections(routes, nodes)
    steps = _arrays(_merged_steps(schedules), connections, itemsize)
    capacity = routes.capacities(network)
    fair = MaxMin(connections.usage, capacity)
    hops = np.asarray(connections.hops, dtype=float)
    peers = np.zeros(ranks, dtype=np.int64)
    for a, b in connections.pairs:
        peers[a] += 1
        peers[b] += 1
    alpha = network.latency + network.peer_latency * np.maximum(0, peers - BASE_PEERS) \
        if network.peer_latency > 0 else np.full(ranks, network.latency)
    chunk = max(1, chunk_bytes // itemsize)
    shared: dict[bytes, np.ndarray] = {}  # a step's connections → their rates
    # when each link direction has carried what came before, at the servers' ends (where a
    # rank's sends of one step and the next meet): a send starts once its ends are free
    link_free = np.zeros(len(capacity) + 1)  # the last: for connections without a known end
    out_link = np.asarray(connections.out_link, dtype=np.int64)
    in_link = np.asarray(connections.in_link, dtype=np.int64)
    written = np.zeros(ranks)  # when the rank's latest sends were written (its next may start)
    receives = _Receives(ranks)
    end = 0.0
    link_bytes = np.zeros(len(capacity))
    per_connection = np.zeros(len(connections.usage))
    for step in steps:
        used, inverse, count = np.unique(step.conn, return_inverse=True, return_counts=True)
        key = used.tobytes()
        rates = shared.get(key)
        if rates is None:
            if len(shared) >= 4096:
                shared.clear()
            rates = shared[key] = np.asarray(fair.rates(used.tolist()), dtype=float)
        rate = (rates / count)[inverse]
        if (rate <= 0).any():
            raise RuntimeError("a transfer got no bandwidth (a bug)")
        stretch = _stretch(network, step, alpha, ranks)
        lead = alpha[step.src] * stretch * (_positions(step.src) + 1) + network.delay * hops[step.conn]
        first = np.minimum(step.nbytes, chunk * itemsize) / rate
        first_in, all_in = receives.ready(step.src, step.lo, step.hi, chunk, itemsize)
        out, into = out_link[step.conn], in_link[step.conn]
        begin = np.maximum(np.maximum(first_in, written[step.src]) + lead,
                           np.maximum(link_free[out], link_free[into]))
        arrive = np.maximum(begin + step.nbytes / rate, all_in + first)
        # the step's transfers through one end go at once, sharing it at their rates: the end
        # is free for the next step's once the last of them has arrived
        np.maximum.at(link_free, out, arrive)
        np.maximum.at(link_free, into, arrive)
        link_free[-1] = 0.0
        handed = np.maximum(begin + np.maximum(0.0, step.nbytes - send_buffer_bytes) / rate, all_in)
        written[np.unique(step.src)] = 0.0
        np.maximum.at(written, step.src, handed)
        receives.replace(step.dst, step.lo, step.hi, begin, arrive, rate)
        end = max(end, float(arrive.max()))
        per_connection += np.bincount(step.conn, weights=step.nbytes, minlength=len(per_connection))
    for c, total in enumerate(per_connection.tolist()):
        if total:
            for link, share in connections.usage[c]:
                link_bytes[link] += total * share
    return StepRun(end, link_bytes.tolist(), len(steps))
