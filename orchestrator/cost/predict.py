"""The prediction for one allreduce: time, algbw/busbw, and the bytes on every link."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule
from orchestrator.cost.network import Network
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_RECEIVE_BUFFER_BYTES,
    DEFAULT_SEND_BUFFER_BYTES,
    ModelTooLarge,
    simulate,
)
from orchestrator.cost.stepwise import stepwise
from orchestrator.topology import Topology
from orchestrator.topology.model import L2_TREE_ENTRIES

Schedules = Sequence[tuple[Partition, Schedule]]


@dataclass(frozen=True)
class LinkLoad:
    link: str  # "a→b": one direction of one link
    bytes: float  # payload bytes it carries per allreduce
    utilisation: float  # of its payload rate over the allreduce


@dataclass(frozen=True)
class Prediction:
    algorithm: str
    seconds: float  # per allreduce
    size_bytes: int
    workers: int
    network: Network
    links: tuple[LinkLoad, ...]  # every link direction that carries bytes, most first
    events: int  # how many times the simulation re-shared bandwidth
    # seconds per allreduce when they run in a row, as a run measures them: a rank that is
    # done early starts the next one while others finish (None: too large to simulate)
    back_to_back: float | None = None
    # per_run split by cause (`attribute`): {"bandwidth", "latency", "waiting"} seconds
    parts: dict[str, float] | None = None
    # which model gave it: "event" (simulate.py) or "steps" (stepwise.py: a plan past the
    # event simulation's budget)
    model: str = "event"
    # how far apart the workers enter an allreduce back to back (the median over the ones in
    # a row): a symmetric schedule's lockstep keeps them together (None: not simulated)
    entry_spread: float | None = None
    # its sends wait for their receivers (Schedule.rendezvous): offered by the transport and
    # chosen by the model (`predict_schedules`: MEETS_COST, MEETS_GAIN)
    rendezvous: bool = False

    @property
    def per_run(self) -> float:
        """What a run's time per synchronisation is held against: back to back if known."""
        return self.back_to_back if self.back_to_back is not None else self.seconds

    @property
    def algbw(self) -> float:
        """Bytes per second, NCCL-tests' definition: S / t, of the time a run measures (per_run)."""
        return self.size_bytes / self.per_run if self.per_run > 0 else float("inf")

    @property
    def busbw(self) -> float:
        """algbw × 2(n−1)/n (allreduce), comparable with a link's rate."""
        n = self.workers
        return self.algbw * 2 * (n - 1) / n if n > 1 else 0.0

    @property
    def link_bytes(self) -> dict[str, float]:
        return {load.link: load.bytes for load in self.links}

    def bottlenecks(self, tolerance: float = 1e-6) -> list[LinkLoad]:
        """The link directions busiest for their rate (all of them, within `tolerance`): on
        links of one rate, those carrying the most bytes; a slower link's fewer bytes can be."""
        if not self.links:
            return []
        top = max(load.utilisation for load in self.links)
        return [load for load in self.links if load.utilisation >= top * (1 - tolerance)]

    def to_json(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "seconds": self.seconds,
            "size_bytes": self.size_bytes,
            "workers": self.workers,
            "back_to_back_seconds": self.back_to_back,
            "algbw_bytes_per_s": self.algbw,
            "busbw_bytes_per_s": self.busbw,
            "network": asdict(self.network),
            "bottlenecks": [asdict(load) for load in self.bottlenecks()],
            "link_bytes": self.link_bytes,
            "parts": self.parts,
            "model": self.model,
            "entry_spread_seconds": self.entry_spread,
            "rendezvous": self.rendezvous,
        }


def predict_schedules(
    topology: Topology,
    schedules: Schedules,
    nodes: Sequence[str],
    network: Network,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    credit_bytes: int = 0,
    itemsize: int = 4,
    routes: Routes | None = None,
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
    compute_s: float = 0.0,
    attribute: bool = False,
    compute: Sequence[Sequence[float]] | None = None,
    warmup: int = 0,
    rendezvous: bool = False,
    choose: bool = True,
) -> Prediction:
    """Predict one allreduce of [(Partition, Schedule)] with rank r on server `nodes[r]`, alone
    and `BACK_TO_BACK` of them in a row with `compute_s` before each (the latter left out beyond
    BACK_TO_BACK_WORK). `send_buffer_bytes`: the transport's. `attribute`: split the time by
    cause (Prediction.parts), which takes the model a second time when α is not 0.
    `compute`: stragglers' seconds of compute per [iteration][worker] (spec/compute.py): the
    time per synchronisation is then the run's own, iterations `warmup` on (`_stragglers`),
    and parts["skew"] what the skew adds to it.

    Plans past the event simulation's budget (more than EVENT_TRANSFERS transfers or
    MAX_PATH_WORK path-search steps, or ModelTooLarge) take the step-level model
    (`stepwise`): one allreduce, no stragglers, no rendezvous.

    `rendezvous`: the transport lets a send wait for its receiver to enter the step
    (Schedule.rendezvous marks which). With `choose`, the schedules take it unless the model
    finds it slower than eager sends by more than MEETS_COST, or, where the marked transfers
    are over MEETS_BYTES, not MEETS_GAIN faster: it keeps halving-doubling's
    changing partners off a downlink still busy with the step before (star,8 at 4 MiB:
    1.75 S/B against 2.5), but it holds a pipelined tree's second child until the first
    one's whole transfer is in. Prediction.rendezvous says which it took, and the agents'
    plans follow it (CompiledRun.meets). Without `choose`, as given."""
    work = path_work(topology, schedules)
    marks = [schedule.rendezvous() for _, schedule in schedules] if rendezvous else []
    marked = any(marks)
    # the step-level model has no rendezvous: chosen there, eager; given, it stays (the plans wait)
    stepwise_meets = marked and not choose
    if sum(len(step) for _, schedule in schedules for step in schedule.steps) > EVENT_TRANSFERS \
            or work[0] > MAX_PATH_WORK:
        return dataclasses.replace(_by_steps(topology, schedules, nodes, network, chunk_bytes, itemsize, routes,
                                             send_buffer_bytes, attribute, work), rendezvous=stepwise_meets)
    routes = routes or Routes(topology)
    buffers = {"receive_buffer_bytes": DEFAULT_RECEIVE_BUFFER_BYTES, "send_buffer_bytes": send_buffer_bytes,
               "rendezvous": marked}

    def model(network: Network):
        """One allreduce alone, the time per allreduce in a row, and how far apart the
        workers entered those in a row (None where left out)."""
        run = simulate(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize, **buffers)
        back_to_back = spread = None
        if run.work * BACK_TO_BACK <= BACK_TO_BACK_WORK:  # else left out: one is all the time allows
            try:
                in_a_row = simulate(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize,
                                    iterations=BACK_TO_BACK, compute_s=compute_s, **buffers)
                back_to_back = max(0.0, in_a_row.period - compute_s)
                spread = entry_spread(in_a_row.exits[:-1], _workers(schedules))  # entries: the exits before
            except ModelTooLarge:
                pass
        return run, back_to_back, spread

    try:
        run, back_to_back, spread = model(network)
    except ModelTooLarge:
        if not (marked and choose):
            return dataclasses.replace(_by_steps(topology, schedules, nodes, network, chunk_bytes, itemsize, routes,
                                                 send_buffer_bytes, attribute, work), rendezvous=stepwise_meets)
        run = None  # met, past the budget: eager may not be
    if marked and choose:
        buffers["rendezvous"] = False
        try:
            eager = model(network)
        except ModelTooLarge:
            eager = None
        if eager is None and run is None:
            return _by_steps(topology, schedules, nodes, network, chunk_bytes, itemsize, routes, send_buffer_bytes,
                             attribute, work)
        if run is None or (eager is not None and _takes_eager((run, back_to_back, spread), eager, schedules, marks,
                                                              itemsize)):
            run, back_to_back, spread = eager
        else:
            buffers["rendezvous"] = True
    per_run = back_to_back if back_to_back is not None else run.seconds
    skew = None
    if compute is not None:
        skewed = _stragglers(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize, buffers,
                             compute, warmup)
        if skewed is not None:  # the time and the entries are then those of the workers' own skew
            in_skew, spread = skewed
            skew, back_to_back = in_skew - per_run, in_skew
    parts = None
    if attribute:
        without = per_run
        if _has_latency(network):
            alone, in_a_row, _ = model(_without_latency(network))
            without = min(per_run, in_a_row if in_a_row is not None else alone.seconds)
        parts = _parts(per_run, without, run.link_bytes, routes.capacities(network))
        if skew is not None:
            parts["skew"] = skew
    return _prediction(schedules, network, routes, run.seconds, run.link_bytes, itemsize, run.events, back_to_back,
                       parts, entry_spread=spread, rendezvous=buffers["rendezvous"])


# How much slower than eager sends the model may find a rendezvous for a run still to take
# it. In the model's lockstep the two often tie (HDRM on bigraph 4×2, 1 MB: 1.002 ×), but a
# run's workers enter apart, and sent eagerly, a late rank's sends cross its partners' next
# steps and the skew grows (0-40 ms apart: 1.3 × the lockstep's time; with the rendezvous
# the ranks fall back in step). Where it costs more, eager: a pipelined tree, whose second
# child waits for the first one's whole transfer (torus,3,2 at 25 MiB: 1.57 ×), or a
# latency-bound exchange that pays the READY's way back each step (star,8 at 64 KiB: 1.11 ×).
MEETS_COST = 0.03
# Where the transfers that would wait are larger than MEETS_BYTES, the rendezvous must also be
# MEETS_GAIN faster in the model than eager sends: each step then waits for its slowest pair
# and for a READY queued behind up to half a megabyte of the receiver's own data (its
# uplink's backlog, halving-doubling on star,8 at 25 MiB), which the model leaves out, while
# eager sends overlap a step only by a message. star,8 at 25 MiB (12.5 MiB transfers, 3.8 %
# faster in the model): 2.37 s with it against 2.05 s eager; at 2 MiB (the model: 29 %
# faster) 0.174 s against 0.246 s; HDRM on bigraph 4×2 at 1 MB (transfers of at most 512 KiB,
# a tie in the model) keeps its ranks in step with it.
MEETS_BYTES = 2**20
MEETS_GAIN = 0.10


def _largest_meeting(schedules: Schedules, itemsize: int, marks: Sequence[set] | None = None) -> int:
    """Bytes of the largest transfer Schedule.rendezvous marks (`marks`: each schedule's, if
    known already)."""
    largest = 0
    for k, (_, schedule) in enumerate(schedules):
        marked = marks[k] if marks is not None else schedule.rendezvous()
        for index, step in enumerate(schedule.steps):
            for t in step:
                if (index, t.src, t.dst) in marked:
                    largest = max(largest, t.length * itemsize)
    return largest


def _takes_eager(met: tuple, eager: tuple, schedules: Schedules, marks: Sequence[set], itemsize: int) -> bool:
    """Of the model's (run, back to back, spread) with and without the rendezvous: is eager
    the run's choice (MEETS_COST, MEETS_GAIN over MEETS_BYTES)? Both held on the same measure:
    back to back where both have it, else one allreduce alone."""
    both = met[1] is not None and eager[1] is not None
    with_it, without = (met[1], eager[1]) if both else (met[0].seconds, eager[0].seconds)
    return with_it > without * (1 + MEETS_COST) or (
        with_it > without * (1 - MEETS_GAIN) and _largest_meeting(schedules, itemsize, marks) > MEETS_BYTES)


def _workers(schedules: Schedules) -> int:
    return len(schedules[0][1].workers) if schedules else 0


def entry_spread(entries: Sequence[dict[int, float]], workers: int) -> float | None:
    """How far apart ranks 0..workers−1 (the workers; parameter servers come after) entered
    their allreduces: max − min of their entry times in each, the median over them. `entries`:
    per allreduce, rank → when it entered (the model's exits of the one before, or a run's
    starts). None without an allreduce every worker entered."""
    full = [[row[r] for r in range(workers)] for row in entries if workers and all(r in row for r in range(workers))]
    return statistics.median(max(times) - min(times) for times in full) if full else None


def _has_latency(network: Network) -> bool:
    return network.latency > 0 or network.peer_latency > 0


def _without_latency(network: Network) -> Network:
    return dataclasses.replace(network, latency=0.0, peer_latency=0.0)


def _parts(per_run: float, without: float, link_bytes: list[float], capacities: list[float]) -> dict[str, float]:
    """A time split by cause: the busiest link direction's bytes at its rate (what no
    schedule gets below); α's share: what the time loses without it (`without`: the time
    with α 0); waiting: the rest (dependencies, links idle)."""
    bandwidth = min(max((b / c for b, c in zip(link_bytes, capacities)), default=0.0), without)
    return {"bandwidth": bandwidth, "latency": per_run - without, "waiting": without - bandwidth}


def _prediction(schedules: Schedules, network: Network, routes: Routes, seconds: float, link_bytes: list[float],
                itemsize: int, events: int, back_to_back: float | None, parts: dict | None,
                model: str = "event", entry_spread: float | None = None, rendezvous: bool = False) -> Prediction:
    capacities = routes.capacities(network)
    size = sum(part.length for part, _ in schedules) * itemsize
    workers = _workers(schedules)
    algorithm = schedules[0][1].algorithm if schedules else "none"
    loads = sorted(
        (LinkLoad(str(routes.directions[i]), b, b / (capacities[i] * seconds) if seconds > 0 else 0.0)
         for i, b in enumerate(link_bytes) if b > 0),
        key=lambda load: (-load.bytes, load.link),
    )
    return Prediction(algorithm, seconds, size, workers, network, tuple(loads), events, back_to_back, parts, model,
                      entry_spread, rendezvous)


# Transfers past which a prediction takes the step-level model: what a run's agents may hold
# (registry.MAX_TRANSFERS), where the event simulation ends in ~30 s at most; past it a
# plan only ever is predicted (registry.PREDICTION_TRANSFERS)
EVENT_TRANSFERS = 60_000


def _by_steps(topology: Topology, schedules: Schedules, nodes: Sequence[str], network: Network, chunk_bytes: int,
              itemsize: int, routes: Routes | None, send_buffer_bytes: int, attribute: bool,
              work: tuple[int, str] | None = None) -> Prediction:
    """The prediction of the step-level model (stepwise.py): one allreduce; `attribute` as above."""
    check_path_work(topology, schedules, STEP_PATH_WORK, work)
    routes = routes or Routes(topology)
    run = stepwise(routes, schedules, nodes, network, chunk_bytes, itemsize, send_buffer_bytes)
    parts = None
    if attribute:
        without = run.seconds
        if _has_latency(network):
            without = min(run.seconds, stepwise(routes, schedules, nodes, _without_latency(network), chunk_bytes,
                                                itemsize, send_buffer_bytes).seconds)
        parts = _parts(run.seconds, without, run.link_bytes, routes.capacities(network))
    return _prediction(schedules, network, routes, run.seconds, run.link_bytes, itemsize, run.steps, None, parts,
                       model="steps")


# Iterations of a run with stragglers the model follows (their own draws): the mean over
# them stands for the run's
SKEW_ITERATIONS = 32


def _stragglers(routes: Routes, schedules: Schedules, nodes: Sequence[str], network: Network, chunk_bytes: int,
                credit_bytes: int, itemsize: int, buffers: dict, compute: Sequence[Sequence[float]],
                warmup: int) -> tuple[float, float | None] | None:
    """Seconds per synchronisation of a run whose workers compute for the drawn times, as the
    run's results measure it (experiment/results.sync_times): each iteration from the
    slowest rank's exit of the last to its exit of this one, less the median worker's
    compute; and how far apart the workers entered the allreduces from `warmup` on (each
    entry: its exit of the one before and its compute). None when the model cannot take that
    many iterations (ModelTooLarge)."""
    rows = [list(row) for row in compute[:SKEW_ITERATIONS]]
    if not rows:
        return None

    def seconds(iteration: int, rank: int) -> float:
        row = rows[iteration]
        return row[rank] if rank < len(row) else 0.0  # parameter servers do not compute

    try:
        run = simulate(routes, schedules, nodes, network, chunk_bytes, credit_bytes, itemsize,
                       iterations=len(rows), compute_s=seconds, **buffers)
    except ModelTooLarge:
        return None
    ends = [max(exits.values(), default=0.0) for exits in run.exits]
    syncs = [end - (ends[i - 1] if i else 0.0) - statistics.median(rows[i]) for i, end in enumerate(ends)]
    measured = syncs[min(warmup, len(syncs) - 1):]
    entries = [{r: (run.exits[i - 1].get(r, 0.0) if i else 0.0) + seconds(i, r) for r in range(len(nodes))}
               for i in range(max(1, warmup), len(rows))]
    return max(0.0, statistics.fmean(measured)), entry_spread(entries, _workers(schedules))


# Allreduces the model runs in a row for a run's time per allreduce: the period settles by the
# third (halving-doubling on bcube,3,1: 3.87, 3.99, 4.04 S/B for 2, 3, 4 in a row).
BACK_TO_BACK = 4
# Flow updates the back-to-back run may take (about 3.5 s at 17 µs each): beyond, a prediction
# gives one allreduce alone (a partitioned ResNet-50 on star,4 took 1.4 s per run of four).
BACK_TO_BACK_WORK = 200_000

# Path-search steps (`path_work`) past which a prediction takes the step-level model: routes
# walk each connection's ECMP paths as one graph (routes.py): fattree,8's mesh, 1.8 M steps,
# searches in 3.1 s and fattree,16's halving-doubling, 4.6 M, in 2.0 s; but the event
# simulation after such a search is too slow (fattree,16's halving-doubling for 20-45 s, its
# 1,024-wide max-min shares at every event).
MAX_PATH_WORK = 1_000_000
# The step-level model's: it takes ~1 s after the search, so a longer search fits its time
# (fattree,16's halving-doubling, 4.6 M steps, searches in ~1.3 s)
STEP_PATH_WORK = 6_000_000


def path_work(topology: Topology, schedules: Schedules) -> tuple[int, str]:
    """The path-search steps a prediction of `schedules` takes before it simulates anything,
    and what they are made of (for a refusal): every distinct (sender, receiver, NIC) is one
    connection, whose paths cost about the ECMP paths between two far servers × their
    length; a sender's L2 segment is searched once if every sender's search fits the
    topology's cache, else once per connection."""
    pairs = {(t.src, t.dst, t.nic) for _, schedule in schedules for step in schedule.steps for t in step}
    if not pairs:
        return 0, "no connections"
    senders = len({(src, nic) for src, _, nic in pairs})
    servers = topology.servers
    far = topology.paths(servers[0].name, servers[-1].name) if len(servers) > 1 else [[]]
    per_pair = len(far) * max(len(path) for path in far)
    widest = topology.widest_segment
    l2 = senders * widest if senders * widest <= L2_TREE_ENTRIES else len(pairs) * widest
    work = len(pairs) * per_pair + l2
    return work, (f"{len(pairs):,} connections over {len(far)} equal-cost path{'s' * (len(far) != 1)} of up to "
                  f"{max(len(path) for path in far)} nodes on L2 segments of up to {widest:,} interfaces are about "
                  f"{work:,} path-search steps")


def check_path_work(topology: Topology, schedules: Schedules, limit: int = MAX_PATH_WORK,
                    work: tuple[int, str] | None = None) -> None:
    """Refuse, before any path is searched, a prediction whose path search alone would take
    more than `limit` steps (`path_work`, or `work` as it gave it)."""
    steps, what = work or path_work(topology, schedules)
    if steps > limit:
        raise ValueError(f"{what}, more than the {limit:,} one prediction may take: use fewer servers or another "
                         "algorithm")
