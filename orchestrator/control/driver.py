"""Driving a run: build every rank's plan, configure all agents, start them, wait, collect.

The orchestrator talks to agents only through their Control service (on the management
network when in a lab), every call carrying the agent's token (agent/auth.py); the agents
move gradients among themselves over the data plane.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import grpc

from orchestrator.agent import transports
from orchestrator.agent.plan import build_rank_plans, chunk_bytes_for
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.collectives.registry import reform
from orchestrator.cost import Network, Prediction
from orchestrator.collectives.schedule import RankMismatch
from orchestrator.cost.compiled import CompiledRun, compile_run
from orchestrator.cost.routes import Routes
from orchestrator.topology import Topology
from orchestrator.errors import RunError, TestbedError  # noqa: F401  RunError re-exported
# the Control client (control/endpoints.py), re-exported: driver.Endpoint, driver.wait_healthy, …
from orchestrator.control.endpoints import (CONTROL_OPTIONS, CONTROL_SERVICE, Endpoint, control_channel,  # noqa: F401
                                           control_stubs, refused, shutdown, wait_healthy)
from orchestrator.control.repacing import Repacer
from orchestrator.control.stalls import LONG_POLL_SECONDS, SILENT_SECONDS, RankView, Stall, default_stall_timeout

log = logging.getLogger("testbed.driver")

class _Rejoining(Exception):
    """A surviving run stops at once for servers that are back (see `run`'s `rejoin`)."""


@dataclass(frozen=True)
class Epoch:
    """A stretch of a surviving run with one membership: from iteration `first`, the workers
    of identities `members` contributed; `nodes` took part (rank order); `reason`: why it began."""

    first: int
    members: tuple[int, ...]
    nodes: tuple[str, ...]
    reason: str = "start"
    # the cost model's time of one allreduce alone of this membership (compute left out, as a
    # planned prediction with stragglers has it in its per_run): scales the point's prediction
    predicted_s: float | None = None


@dataclass
class RunResult:
    run_id: str
    algorithm: str
    results: list[pb.RunResults]
    size_bytes: int
    wall_seconds: float
    # the cost model's prediction of one allreduce of this run (time, bytes per link), when
    # run() was told the lab's network: see _prediction. Given a compiled run (`compiled`), its
    # prediction as planned (with the workload's compute), unless the paths hashed differently
    predicted: Prediction | None = None
    # a run that survived failures (run(survive=True)): its memberships, and every worker
    # node's identity (its rank at the start: whose gradient it contributes)
    history: list[Epoch] = field(default_factory=list)
    identities: dict[str, int] = field(default_factory=dict)
    # what the (last) attempt ran: its schedules and the routes its prediction took, so the
    # same run can be priced again at other link rates (deploy/lab_agents.py)
    compiled: CompiledRun | None = field(default=None, repr=False)
    # each link-degrade made while the run went on, beside the model's prediction of the
    # iterations it held (control/iterations.under_degrades): set by a lab's faithful run
    under_faults: list[dict] = field(default_factory=list)
    # when the agents were re-paced because the lab's links changed under the run (a
    # link-degrade applied or undone), with the rates paced at from then (Repacer.changes)
    repaced: list[dict] = field(default_factory=list)

    def gst(self) -> list[float]:
        """Per iteration, the synchronisation time of the slowest agent (parameter servers
        report iterations too and are included); in a surviving run, of those that finished it."""
        by_iteration: dict[int, float] = {}
        for r in self.results:
            for rec in r.records:
                by_iteration[rec.iteration] = max(by_iteration.get(rec.iteration, 0.0), rec.gst_seconds)
        return [by_iteration[i] for i in sorted(by_iteration)]

    def back_to_back_times(self, warmup: int = 1) -> list[float]:
        """Per agent, NCCL-tests' time per operation of a back-to-back run: from entering the
        first operation after the `warmup` first ones to leaving the last, divided by their
        number. NCCL-tests reports the mean over ranks by default (`-a 1`), the max with `-a 3`."""
        times = []
        for r in self.results:
            timed = r.records[warmup:]
            if timed:
                times.append((timed[-1].start_time + timed[-1].gst_seconds - timed[0].start_time) / len(timed))
        if not times:
            raise ValueError(f"a back-to-back time needs more than the {warmup} warm-up iteration(s)")
        return times

    def transfers(self) -> list[dict]:
        """A traced run's transfers (run(trace=True)), as each rank saw them: one row per send
        and per receive and iteration, times in Unix seconds (RunResults.transfers)."""
        return [
            {"rank": r.rank, "node": r.node, "iteration": t.iteration, "partition": t.partition, "step": t.step,
             "peer": t.peer, "kind": "send" if t.send else "receive", "offset": t.offset, "count": t.count,
             "begun": t.begun, "first": t.first, "last": t.last}
            for r in self.results for t in r.transfers
        ]

    def records(self) -> list[dict]:
        return [
            {"rank": r.rank, "node": r.node, "iteration": rec.iteration, "gst_s": rec.gst_seconds,
             "compute_s": rec.compute_seconds, "start_time": rec.start_time, "bytes_sent": rec.bytes_sent,
             "bytes_received": rec.bytes_received, "loss": rec.loss, "param_digest": rec.param_digest,
             "verified": rec.verified}
            for r in self.results for rec in r.records
        ]


def run(
    endpoints: list[Endpoint],
    algorithm: str,
    tensors: list[int],
    workloads: list[dict] | dict,
    iterations: int = 3,
    ctx: Context | None = None,
    partition_bytes: int | None = None,
    credit_bytes: int = 0,
    chunk_bytes: int | None = None,
    timeout: float = 600.0,
    network: Network | None = None,
    pace: bool = True,
    stall_timeout: float | None = None,
    link_state: Callable[[str, str], bool | None] | None = None,
    flow_paths: Callable[[], dict] | None = None,
    survive: bool = False,
    rejoin: Callable[[set[str]], list[Endpoint]] | None = None,
    transport: str = transports.DEFAULT,
    trace: bool = False,
    compiled: CompiledRun | None = None,
    prepare: Callable[[CompiledRun], None] | None = None,
    links_now: Callable[[], Topology] | None = None,
) -> RunResult:
    """Run `iterations` of `algorithm` over the agents; raises RunError naming a failed rank.

    `workloads` is one workload for all workers or one per worker (real workloads carry
    each worker's data shard). Endpoints with role "ps" are parameter servers.
    `chunk_bytes`: bytes per streamed message (default: by the schedule's fan-in, see
    `plan.chunk_bytes`). `network`: the lab's links (`cost.Network.from_links(spec.links)`);
    with it and `ctx.topology` the result carries the cost model's prediction, and (unless
    `pace` is False) every connection is paced at its fair share of the link (cost.shares).
    On a lab with ECMP, `flow_paths()` (`lab.connection_paths` of the agents' data port)
    gives the paths the run's connections hashed onto once they are open: the prediction and
    the shares then follow those paths instead of an even spread (cost/routes.py says why).

    Failure detection: the run fails as soon as no rank has moved data for `stall_timeout`
    seconds (default: `default_stall_timeout`), naming the stalled ranks, the peers they wait
    for and, in a lab, the path between them; `link_state(a, b)` (True up, False down, None
    unknown), when given, names the link of that path that is down. Before configuring, a
    stale run an agent still holds (its driver gone, or the agent frozen and thawed) is
    stopped, with one warning on the "testbed.driver" logger.

    `survive`: instead of failing, drop the servers that stopped answering, re-form the
    algorithm over the survivors (collectives/membership.py) and go on from the iteration
    that failed, redone from the parameters the survivors hold; `rejoin(dead nodes)`, polled
    meanwhile, returns endpoints of dead servers whose agents are back (each once), which join at the
    next iteration boundary with the current parameters. The result's `history` says who
    contributed when; control/checker.py checks it. A server whose agent answers but that no
    data reaches or leaves (a partition, its only path down) is dropped too, once
    `RETRIES` retries over fresh connections all named it and only it (`_Survivor._cut_off`).
    Fails (RunError) when nobody died and no one server is cut off (a cut path, a bug:
    nothing to drop) or the algorithm cannot lose the dead.

    `transport`: how the agents move chunks (agent/transports: tcp by default, or grpc);
    `flow_paths` must then read the connections to that transport's port. `trace`: every
    agent records each transfer's times (`RunResult.transfers`), to hold beside the model's.
    `compiled`: this run as the plan compiled it (cost/compiled.py, with its prediction on
    `network`): an attempt over the servers it was compiled for runs it as it is, schedules
    and prediction, instead of compiling it again (a re-formed membership compiles its own).
    `prepare(compiled)`: called with each attempt's compiled run before its agents open their
    connections (a lab sizes its NICs' super-packets by its smallest transfer).
    `links_now()`: the lab's topology with the rates its link-degrades set now, polled while a
    paced run goes on; when they change, the agents pace at the shares over them from their
    next iteration (control/repacing.py). The prediction stays the run's own.
    """
    workers = [e for e in endpoints if e.role == "worker"]
    ctx = ctx or Context(len(workers))
    per_worker = workloads if isinstance(workloads, list) else [workloads] * len(workers)
    try:
        transports.get(transport)  # an unknown name fails here, not on every agent
    except ValueError as exc:
        raise RunError(str(exc)) from None
    how = _How(algorithm, tensors, partition_bytes, credit_bytes, chunk_bytes, network, pace, stall_timeout, link_state,
               flow_paths, transport, trace, compiled, prepare, links_now)
    if survive:
        return _Survivor(how, ctx, endpoints, per_worker, iterations, timeout, rejoin).run()
    specs = {e.rank: per_worker[e.rank] for e in workers}
    return _attempt(how, ctx, endpoints, specs, _Span(0, iterations), timeout)


@dataclass(frozen=True)
class _How:
    """How every attempt of a run goes (run's arguments)."""

    algorithm: str
    tensors: list[int]
    partition_bytes: int | None
    credit_bytes: int
    chunk_bytes: int | None
    network: Network | None
    pace: bool
    stall_timeout: float | None
    link_state: Callable[[str, str], bool | None] | None
    flow_paths: Callable[[], dict] | None
    transport: str = transports.DEFAULT
    trace: bool = False
    compiled: CompiledRun | None = None  # as planned (run's `compiled`)
    prepare: Callable[[CompiledRun], None] | None = None  # before the agents connect (run's `prepare`)
    links_now: Callable[[], Topology] | None = None  # the lab's links as they are now (run's `links_now`)


@dataclass
class _Span:
    """Which iterations one attempt runs, and what a surviving run tells its agents."""

    first: int
    iterations: int
    members: tuple[int, ...] = ()  # identities contributing (empty: ranks 0..workers-1)
    identities: dict[str, int] = field(default_factory=dict)  # worker node → identity
    state: bytes = b""  # model parameters to start from
    collect: dict[str, list] | None = None  # node → records, streamed as they are made
    interrupt: Callable[[], bool] | None = None  # polled: True stops the attempt (_Rejoining)
    predicted: Prediction | None = None  # set by the attempt: its schedules' prediction
    repaced: list[dict] = field(default_factory=list)  # the attempts' re-pacings (Repacer.changes), shared


def _attempt(how: _How, ctx: Context, endpoints: list[Endpoint], specs: dict[int, dict], span: _Span,
             timeout: float) -> RunResult:
    """One configured run over `endpoints` (their ranks those of ctx's schedules; ranks
    without an endpoint must have nothing to do: the dead of a BML re-formed by `failed`)."""
    algorithm, tensors, credit_bytes = how.algorithm, how.tensors, how.credit_bytes
    workers = [e for e in endpoints if e.role == "worker"]
    size = sum(tensors)
    try:
        parts = partitions(tensors, how.partition_bytes)
        compiled = _as_planned(how, ctx, endpoints, parts) or compile_run(
            algorithm, ctx, size, parts, nodes=lambda ranks: _rank_nodes(ctx, endpoints, ranks)[0],
            given={e.rank for e in endpoints}, credit_bytes=credit_bytes,
            chunk_bytes=how.chunk_bytes or chunk_bytes_for(how.transport),
            send_buffer_bytes=transports.get(how.transport).send_buffer,
            rendezvous=transports.get(how.transport).rendezvous)
    except RankMismatch as exc:
        raise RunError(str(exc)) from None
    except ValueError as exc:
        raise RunError(f"cannot build {algorithm} over these servers: {exc}") from None
    schedules, ranks, nodes, chunk_bytes = compiled.schedules, compiled.ranks, list(compiled.nodes), compiled.chunk_bytes
    _, in_lab = _rank_nodes(ctx, endpoints, ranks)
    network = how.network
    if compiled.network != network or (network is not None and compiled.prediction is None):
        compiled = _prediction(compiled, ctx, network)  # a given run predicted on this network is kept
    predicted, routes = compiled.prediction, compiled.routes
    span.predicted = predicted
    paced = predicted is not None and how.pace and in_lab
    # in a lab, each connection paced at its fair share (agent/pacing.py says why)
    plans = build_rank_plans(schedules, ranks, compiled.shares(), network.payload_rate, compiled.meets) if paced \
        else build_rank_plans(schedules, ranks, rendezvous=compiled.meets)
    hashed = predicted is not None and in_lab and how.flow_paths is not None and ctx.topology.has_ecmp
    path_of = _path_finder(ctx) if in_lab else None
    run_id = uuid.uuid4().hex[:12]
    peers = [pb.Peer(rank=e.rank, node=e.node, address=e.data, by_nic=e.by_nic) for e in endpoints]

    def configure(stub: pb_grpc.ControlStub, endpoint: Endpoint) -> None:
        spec = specs[endpoint.rank] if endpoint.role == "worker" else {"kind": "server"}
        try:
            reply = stub.Configure(
                pb.RunConfig(
                    run_id=run_id, rank=endpoint.rank, role=endpoint.role, peers=peers, algorithm=algorithm,
                    plan_json=plans[endpoint.rank], size=size, iterations=span.iterations,
                    workload_json=json.dumps(spec), chunk_bytes=chunk_bytes, credit_bytes=credit_bytes,
                    workers=len(workers), first_iteration=span.first, members=span.members,
                    identity=span.identities.get(endpoint.node, endpoint.rank), state=span.state,
                    transport=how.transport, trace=how.trace,
                ),
                timeout=60,
            )
        except grpc.RpcError as exc:
            if refusal := refused(exc, endpoint):
                raise refusal from None
            raise RunError(f"configuring rank {endpoint.rank} ({endpoint.node}): {exc.code().name}") from None
        if not reply.ok:
            raise RunError(f"configuring rank {endpoint.rank} ({endpoint.node}): {reply.error}")

    with control_stubs(endpoints) as stubs, ThreadPoolExecutor(max_workers=16) as pool:
        _stop_stale(endpoints, stubs, pool)
        if how.prepare is not None:
            how.prepare(compiled)
        list(pool.map(lambda e: configure(stubs[e.control], e), endpoints))  # agents connect
        started = time.monotonic()
        repaced = None
        if hashed:  # the connections are open: predict (and pace) over the paths they took
            wanted = {(nodes[t.src], routes.address(nodes[t.dst], t.nic))
                      for _, schedule in schedules for _, t in schedule.transfers() if nodes[t.src] != nodes[t.dst]}
            compiled = _prediction(compiled, ctx, network,
                                   Routes(ctx.topology, _pinned(_flow_paths(how.flow_paths, wanted), ctx.topology)))
            predicted = span.predicted = compiled.prediction
            if paced:
                repaced = build_rank_plans(schedules, ranks, compiled.shares(), network.payload_rate,
                                           compiled.meets)
        stall_timeout = how.stall_timeout or default_stall_timeout(predicted)
        # all ranks enter the first iteration together, once every Start has arrived
        start_at = time.time() + START_MARGIN_SECONDS

        def start(e: Endpoint) -> pb.Ack:
            plan = repaced[e.rank] if repaced else ""
            return stubs[e.control].Start(pb.StartRequest(run_id=run_id, start_at=start_at, plan_json=plan), timeout=30)

        replies = pool.map(start, endpoints)
        for reply, endpoint in zip(replies, endpoints):
            if not reply.ok:
                raise RunError(f"starting rank {endpoint.rank} ({endpoint.node}): {reply.error}")
        repacer = Repacer(how.links_now, ctx.topology.rates, repaced or plans, compiled, run_id, endpoints, stubs,
                          span.repaced) \
            if paced and how.links_now is not None else None
        _wait(endpoints, stubs, started + timeout, Stall(algorithm, stall_timeout, path_of, how.link_state), span,
              repacer.poll if repacer is not None else None)
        wall = time.monotonic() - started
        results = [stubs[e.control].Results(pb.Empty(), timeout=30) for e in endpoints]
    return RunResult(run_id, algorithm, results, size * 4, wall, predicted, compiled=compiled,
                     repaced=list(span.repaced))


MAX_REFORMS = 16  # membership changes one run survives
RETRIES = 2  # attempts in a row that fail with nobody dead (fresh connections take rerouted paths)
ANSWER_SECONDS = 3.0  # a live agent answers Results within this after a failure


class _Survivor:
    """A run that survives failures: attempts over the live servers, each going on from the
    last iteration some survivor finished, with the parameters it holds (see `run`)."""

    def __init__(self, how: _How, ctx: Context, endpoints: list[Endpoint], per_worker: list[dict],
                 iterations: int, timeout: float, rejoin: Callable[[set[str]], list[Endpoint]] | None) -> None:
        ordered = sorted(endpoints, key=lambda e: e.rank)
        self.how, self.ctx, self.iterations, self.rejoin = how, ctx, iterations, rejoin
        self.workers = [e.node for e in ordered if e.role == "worker"]
        self.servers = [e.node for e in ordered if e.role != "worker"]
        self.identities = {e.node: e.rank for e in ordered if e.role == "worker"}
        self.specs = {e.node: per_worker[e.rank] for e in ordered if e.role == "worker"}
        self.rank = {e.node: e.rank for e in ordered}
        self.repaced: list[dict] = []  # every attempt's re-pacings (RunResult.repaced)
        self.current = {e.node: e for e in ordered}
        self.dead: set[str] = set()
        self.records: dict[str, dict[int, pb.IterationRecord]] = {e.node: {} for e in ordered}
        self.last: dict[str, pb.RunResults] = {}
        self.history: list[Epoch] = []
        self.back: list[Endpoint] = []
        self.deadline = time.monotonic() + timeout
        self.predicted: Prediction | None = None
        self.compiled: CompiledRun | None = None
        self.retries = 0
        self.cuts: list[frozenset[frozenset[str]]] = []  # RunError.cut of each of those retries

    def run(self) -> RunResult:
        started, done, state, reason = time.monotonic(), 0, b"", "start"
        for _ in range(MAX_REFORMS):
            membership = self._membership()
            live = sorted((dataclasses.replace(self.current[n], rank=r) for n, r in membership.ranks.items()),
                          key=lambda e: e.rank)
            members = tuple(sorted(self.identities[e.node] for e in live if e.role == "worker"))
            if self.history and self.history[-1].first == done:
                self.history.pop()  # it finished no iteration: this membership replaces it
            self.history.append(Epoch(done, members, tuple(e.node for e in live), reason))
            collected: dict[str, list] = {}
            span = _Span(done, self.iterations - done, members, self.identities, state, collected, self._rejoin_ready,
                         repaced=self.repaced)
            live = _around_down_nics(live, self.ctx, self.how.link_state)
            specs = {e.rank: self.specs[e.node] for e in live if e.role == "worker"}
            try:
                result = _attempt(self.how, membership.ctx, live, specs, span, max(1.0, self.deadline - time.monotonic()))
            except (RunError, _Rejoining) as failure:
                self._predicted(span)
                done, state, reason = self._recover(live, collected, failure, done, state)
                continue
            self._predicted(span)
            self.predicted = self.predicted or result.predicted
            self.compiled = result.compiled
            for e, got in zip(live, result.results):
                self._keep(e.node, got.records)
                self.last[e.node] = got
            return self._result(time.monotonic() - started)
        raise RunError(f"{self.how.algorithm}: membership changed {MAX_REFORMS} times: is a server failing over and "
                       "over? look at its agent's log")

    def _predicted(self, span: _Span) -> None:
        if span.predicted is not None:
            self.history[-1] = dataclasses.replace(self.history[-1], predicted_s=span.predicted.seconds)

    def _membership(self):
        try:
            return reform(self.how.algorithm, self.ctx, self.workers, self.servers, self.dead)
        except ValueError as exc:
            raise RunError(f"{self.how.algorithm} cannot go on without {', '.join(sorted(self.dead))}: {exc}") from None

    def _rejoin_ready(self) -> bool:
        """Polled while an attempt runs: are dead servers back? (then it stops for them)"""
        if self.rejoin is None or not self.dead:
            return False
        got = [e for e in self.rejoin(set(self.dead)) if e.node in self.dead]
        self.back = list({e.node: e for e in [*self.back, *got]}.values())  # handed over once: kept till used
        return bool(self.back)

    def _recover(self, live: list[Endpoint], collected: dict[str, list], failure: Exception, done: int,
                 state: bytes) -> tuple[int, bytes, str]:
        """After an attempt stopped: who is dead, where to go on from, with which parameters."""
        answered = self._results(live)
        lost = {e.node for e in live} - set(answered)
        cut_off = False
        if isinstance(failure, RunError) and not lost:
            # nobody to drop: a cut path, which new connections may route around (the lab
            # reroutes; TCP's own retransmissions back off for longer than a stall), or a bug
            self.retries += 1
            self.cuts.append(failure.cut)
            if self.retries > RETRIES:
                # or a server cut off from the others' data (a partition; its only path
                # down) whose agent still answers on the management network: dropped like a
                # dead one, else such a fault failed every surviving run
                lost = self._cut_off(live)
                if not lost:
                    raise failure
                cut_off = True
        if lost or not isinstance(failure, RunError):
            self.retries, self.cuts = 0, []
        for e in live:
            self._keep(e.node, answered[e.node].records if e.node in answered else collected.get(e.node, []))
        self.dead |= lost
        finished = [i for node in answered for i in self.records[node]]
        resume = max(finished, default=done - 1) + 1
        for node in self.records:  # what only the dead finished is redone without them
            self.records[node] = {i: r for i, r in self.records[node].items() if i < resume}
        holders = [n for n, got in answered.items() if resume - 1 in self.records[n] and got.records
                   and got.records[-1].iteration == resume - 1]
        if holders and answered[holders[0]].state:
            state = answered[holders[0]].state
        if cut_off:
            failure = f"cut off (no data to or from it in {RETRIES + 1} attempts in a row): {failure}"
        reason = f"{', '.join(sorted(lost))} lost: {failure}" if lost else \
            "rejoin" if isinstance(failure, _Rejoining) else f"retried: {failure}"
        if self.rejoin is not None and not self.back:
            self._rejoin_ready()
        for e in self.back:  # its role stays what it was (a redeploy may not know it)
            self.current[e.node] = dataclasses.replace(e, role=self.current[e.node].role)
            self.dead.discard(e.node)
        if self.back:
            reason = f"{', '.join(sorted(e.node for e in self.back))} rejoined" + ("" if not lost else f"; {reason}")
        self.back = []
        log.warning("%s re-forms from iteration %d over %d servers (%s)", self.how.algorithm, resume,
                    len(self.current) - len(self.dead), reason)
        return resume, state, reason

    def _cut_off(self, live: list[Endpoint]) -> set[str]:
        """The one live server at an end of every pair that data did not move between, in
        every failed attempt of the retries (each naming some): cut off from the others."""
        if not self.cuts or not all(self.cuts):
            return set()
        common = set.intersection(*(set(pair) for cut in self.cuts for pair in cut)) & {e.node for e in live}
        return common if len(common) == 1 else set()

    def _results(self, live: list[Endpoint]) -> dict[str, pb.RunResults]:
        """Results of every agent that still answers, by node: the others are dead."""
        def ask(endpoint: Endpoint) -> pb.RunResults | None:
            try:
                with control_channel(endpoint) as channel:
                    return pb_grpc.ControlStub(channel).Results(pb.Empty(), timeout=ANSWER_SECONDS)
            except grpc.RpcError:
                return None

        with ThreadPoolExecutor(max_workers=16) as pool:
            got = dict(zip((e.node for e in live), pool.map(ask, live)))
        for node, results in got.items():
            if results is not None:
                self.last[node] = results
        return {node: results for node, results in got.items() if results is not None}

    def _keep(self, node: str, records) -> None:
        for record in records:
            self.records[node].setdefault(record.iteration, record)

    def _result(self, wall: float) -> RunResult:
        results = []
        for node, records in self.records.items():
            got = pb.RunResults()
            if node in self.last:
                got.CopyFrom(self.last[node])
                del got.records[:]
            got.rank, got.node = self.rank[node], node
            got.records.extend(records[i] for i in sorted(records))
            if node in self.dead:
                got.error = "lost during the run"
            results.append(got)
        return RunResult(uuid.uuid4().hex[:12], self.how.algorithm, results, sum(self.how.tensors) * 4, wall,
                         self.predicted, list(self.history), dict(self.identities), self.compiled,
                         repaced=list(self.repaced))


def _around_down_nics(endpoints: list[Endpoint], ctx: Context,
                      link_state: Callable[[str, str], bool | None] | None) -> list[Endpoint]:
    """Endpoints whose data addresses avoid NICs with their link down (known by `link_state`):
    an address on a dead NIC is unreachable however the lab reroutes, one on a live NIC of
    the same server is reached over the detour."""
    if link_state is None or ctx.topology is None:
        return endpoints
    topology, moved = ctx.topology, []
    down: dict[str, set[str]] = {}  # node → addresses of its NICs whose link is down
    # only the links of servers with a choice of NICs: link_state reads the kernel each call
    for node in {e.node for e in endpoints if e.by_nic}:
        for link in topology.links_of(node):
            if link_state(link.a.node, link.b.node) is False:
                end = link.a if link.a.node == node else link.b
                iface = topology.nodes[node].interfaces.get(end.interface)
                if iface is not None and iface.address is not None:
                    down.setdefault(node, set()).add(str(iface.address.ip))
    for e in endpoints:
        dead = down.get(e.node, set())
        host, _, port = e.data.rpartition(":")
        alive = {nic: addr for nic, addr in e.by_nic.items() if addr.rpartition(":")[0] not in dead}
        if host in dead and alive:
            e = dataclasses.replace(e, data=next(iter(alive.values())), by_nic=alive)
        elif len(alive) < len(e.by_nic):
            e = dataclasses.replace(e, by_nic=alive)
        moved.append(e)
    return moved


def _rank_nodes(ctx: Context, endpoints: list[Endpoint], ranks: int | None = None) -> tuple[list[str], bool]:
    """(the server of every rank, whether the endpoints are the lab's servers): its
    endpoint's node when those are the topology's servers (a lab), else `ctx.nodes` or the
    servers in order (loopback agents standing in for a lab). A rank without an endpoint
    (dead, and left out of a re-formed schedule) is on its `ctx.nodes` server."""
    by_rank = {e.rank: e.node for e in endpoints}
    ranks = len(endpoints) if ranks is None else ranks
    nodes = [by_rank.get(r) or (ctx.nodes[r] if r < len(ctx.nodes) else f"rank{r}") for r in range(ranks)]
    if ctx.topology is None:
        return nodes, False
    if all(node in ctx.topology.nodes for node in nodes):
        return nodes, True
    return (list(ctx.nodes) if len(ctx.nodes) >= len(nodes) else [s.name for s in ctx.topology.servers]), False


def _as_planned(how: _How, ctx: Context, endpoints: list[Endpoint], parts: list) -> CompiledRun | None:
    """The run's given compiled run (`how.compiled`) if this attempt is the one it was
    compiled for: the same algorithm, partitions, message size and send buffer, every rank
    given an agent, on the servers it was placed on. None otherwise (compile this attempt)."""
    given = how.compiled
    if given is None or given.algorithm != how.algorithm or given.credit_bytes != how.credit_bytes:
        return None
    chosen = transports.get(how.transport)
    if given.send_buffer_bytes != chosen.send_buffer or given.rendezvous != chosen.rendezvous or not given.schedules:
        return None
    chunk = how.chunk_bytes or chunk_bytes_for(how.transport)(given.schedules, how.credit_bytes)
    if chunk != given.chunk_bytes or len(given.schedules[0][1].workers) != ctx.workers:
        return None
    if [part for part, _ in given.schedules] != list(parts) or {e.rank for e in endpoints} != set(range(given.ranks)):
        return None
    return given if tuple(_rank_nodes(ctx, endpoints, given.ranks)[0]) == given.nodes else None


def _prediction(compiled: CompiledRun, ctx: Context, network: Network | None,
                routes: Routes | None = None) -> CompiledRun:
    """The run with the cost model's prediction for its very schedules (about 0.1 s for 16
    servers; more with many partitions) and the routes it mapped the transfers onto (the
    fair shares the agents pace at use them again)."""
    try:
        return compiled.predicted(network, ctx.topology, routes)
    except ValueError as exc:  # more ranks than the topology has servers
        raise RunError(f"cannot predict {compiled.algorithm} on this {ctx.topology.kind}: {exc}") from None


PATHS_TRIES, PATHS_WAIT = 5, 0.2  # for connections still being opened when the agents answered


def _flow_paths(read: Callable[[], dict], wanted: set) -> dict:
    """The paths of the run's connections (`wanted`: (server, address) keys) as the lab
    forwards them; the connections not found in time keep the even spread, with a warning."""
    paths: dict = {}
    for attempt in range(PATHS_TRIES):
        try:
            paths = read()
        except (TestbedError, OSError) as exc:
            log.warning("the run's connection paths could not be read (%s): predicting an even ECMP spread", exc)
            return {}
        if wanted <= paths.keys():
            break
        time.sleep(PATHS_WAIT)
    else:
        missing = sorted(f"{src}→{address}" for src, address in wanted - paths.keys())
        log.warning("no open connection for %d of the run's %d (%s…): those predicted over an even ECMP spread",
                    len(missing), len(wanted), ", ".join(missing[:3]))
    return paths


def _pinned(paths: dict, topology) -> dict:
    """The lab's connection paths that the model can follow: paths between servers of the
    topology (an agent of another lab, or a stray connection, is left out)."""
    return {key: path for key, path in paths.items() if all(node in topology.nodes for node in path)}


START_MARGIN_SECONDS = 1.0  # for every agent to get its Start call and open its connections
TICK_SECONDS = 0.25  # how often the driver looks for a stall between answers
STALE_SECONDS = 3 * LONG_POLL_SECONDS  # a run unwatched this long has no driver any more
STOP_SECONDS = 2.0  # for the Stop calls that end a failed run (a frozen agent never answers)


def _path_finder(ctx: Context) -> Callable[[str, str], list[str]]:
    """The node path routing takes between two servers of the lab ([] if it has none)."""
    def path(src: str, dst: str) -> list[str]:
        try:
            return ctx.topology.path(src, dst)
        except Exception:  # noqa: BLE001 - a diagnosis without a path is still one
            return []
    return path


def _stop_stale(endpoints: list[Endpoint], stubs: dict[str, pb_grpc.ControlStub], pool: ThreadPoolExecutor) -> None:
    """Stop the run an agent still holds when nobody has watched it for `STALE_SECONDS` (its
    driver died, or the agent was frozen and thawed): it would refuse Configure. A run that
    another orchestrator is watching is left alone, and this run refused in one line."""
    def status(endpoint: Endpoint) -> pb.AgentStatus:
        try:
            return stubs[endpoint.control].Status(pb.Empty(), timeout=10)
        except grpc.RpcError as exc:
            if refusal := refused(exc, endpoint):
                raise refusal from None
            raise RunError(f"rank {endpoint.rank} ({endpoint.node}) does not answer ({exc.code().name}): "
                           "is its agent frozen or gone? start the lab's agents again") from None

    # a run is stale once unwatched for STALE_SECONDS; a frozen agent just thawed may serve
    # the long polls queued while it was frozen, so look again for a while before refusing
    busy = [(e, found) for e, found in zip(endpoints, pool.map(status, endpoints)) if found.state == "running"]
    deadline = time.monotonic() + STALE_SECONDS + 2 * LONG_POLL_SECONDS
    while busy:
        for endpoint, found in busy:
            if found.unwatched_seconds >= STALE_SECONDS:
                stubs[endpoint.control].Stop(pb.Empty(), timeout=10)
                log.warning("rank %d (%s) still ran run %s, unwatched for %.0f s (its driver gone, or the agent "
                            "frozen): stopped it", endpoint.rank, endpoint.node, found.run_id, found.unwatched_seconds)
        busy = [(e, found) for e, found in busy if found.unwatched_seconds < STALE_SECONDS]
        if busy and time.monotonic() > deadline:
            endpoint, found = busy[0]
            raise RunError(f"rank {endpoint.rank} ({endpoint.node}) is busy with run {found.run_id}, which an "
                           f"orchestrator watched {found.unwatched_seconds:.1f} s ago: wait for it to end or stop it")
        if busy:
            time.sleep(TICK_SECONDS)
            busy = [(e, found) for e, found in ((e, status(e)) for e, _ in busy) if found.state == "running"]


def _wait(endpoints: list[Endpoint], stubs: dict[str, pb_grpc.ControlStub], deadline: float, stall: Stall,
          span: _Span | None = None, tick: Callable[[], None] | None = None) -> None:
    """Until every agent is done: one long-polling Wait per agent at a time (see Agent.wait),
    answered the moment its run ends; the first failure stops them all, and so does a stall
    (`Stall`: checked on every answer and every `TICK_SECONDS`). With `span.collect`, each
    Wait also answers with the agent's new records (kept there by node), so that the records
    of an agent that dies are not lost; `span.interrupt` stops the run (_Rejoining). `tick()`
    is called on every answer and every `TICK_SECONDS` too (Repacer.poll)."""
    answers: queue.Queue[tuple[Endpoint, grpc.Future]] = queue.Queue()
    collect = span.collect if span is not None else None
    interrupt = span.interrupt if span is not None else None
    received = {e.rank: 0 for e in endpoints}

    def ask(endpoint: Endpoint) -> None:
        wait = min(LONG_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
        request = pb.WaitRequest(timeout_seconds=wait)
        if collect is not None:
            request.records, request.records_from = True, received[endpoint.rank]
        # the stall check names an agent that stopped answering first, with what waits for it
        future = stubs[endpoint.control].Wait.future(request, timeout=wait + stall.timeout + 10)
        future.add_done_callback(lambda f: answers.put((endpoint, f)))

    for endpoint in endpoints:
        ask(endpoint)
    pending = {e.rank: e for e in endpoints}
    last: dict[int, tuple[pb.AgentStatus | None, float]] = {e.rank: (None, time.monotonic()) for e in endpoints}
    while pending:
        try:
            endpoint, future = answers.get(timeout=max(0.0, min(TICK_SECONDS, deadline - time.monotonic())))
        except queue.Empty:
            endpoint, future = None, None
        if future is not None:
            try:
                status = future.result()
            except grpc.RpcError as exc:
                _stop_all(stubs)
                raise RunError(f"rank {endpoint.rank} ({endpoint.node}) stopped answering: {exc.code().name}") from exc
            last[endpoint.rank] = (status, time.monotonic())
            if collect is not None and status.records:
                collect.setdefault(endpoint.node, []).extend(status.records)
                received[endpoint.rank] += len(status.records)
            if status.state == "failed":
                _stop_all(stubs)
                # what is cut: its failed send, and the paths others have waited on for long
                cut = _send_failed(endpoint.node, status.error) | \
                    stall.cut(_views({e.rank: e for e in endpoints}, last), least=stall.timeout / 2)
                raise RunError(f"rank {endpoint.rank} ({endpoint.node}) failed: {status.error}", cut)
            if status.state == "done":
                del pending[endpoint.rank]
            elif time.monotonic() <= deadline:
                ask(endpoint)
        if interrupt is not None and interrupt():
            _stop_all(stubs)
            raise _Rejoining()
        if tick is not None:
            tick()
        if stall.stalled(_views(pending, last)):
            views = _views({e.rank: e for e in endpoints}, last)
            message = stall.message(views)
            silent = {e.control for e, v in zip(endpoints, views) if v.silent >= SILENT_SECONDS}
            _stop_all(stubs, silent)
            raise RunError(message, stall.cut(views))
        if pending and time.monotonic() > deadline:
            _stop_all(stubs)
            names = ", ".join(e.node for e in list(pending.values())[:4])
            raise RunError(f"run timed out waiting for {names}")


_SENDING_TO = re.compile(r"sending to rank \d+ \(([^()\s]+)\)")  # agent/engine.py's _refusal


def _send_failed(node: str, error: str) -> frozenset[frozenset[str]]:
    """{node, peer} when an agent's error is a send to a peer that failed (see RunError.cut)."""
    found = _SENDING_TO.search(error)
    return frozenset({frozenset((node, found[1]))}) if found and found[1] != node else frozenset()


def _views(ranks: dict[int, Endpoint], last: dict[int, tuple[pb.AgentStatus | None, float]]) -> list[RankView]:
    now = time.monotonic()
    views = []
    for rank, endpoint in sorted(ranks.items()):
        status, answered = last[rank]
        reported = status.stalled_seconds if status is not None and status.state == "running" else 0.0
        views.append(RankView(rank, endpoint.node, status, now - answered, reported + now - answered))
    return views


def _stop_all(stubs: dict[str, pb_grpc.ControlStub], silent: set[str] = frozenset()) -> None:
    """Stop on every agent at once: a frozen one costs its timeout once, not once per agent,
    and nothing when known `silent` (by control address: its Stop is sent, not awaited)."""
    futures = {address: stub.Stop.future(pb.Empty(), timeout=STOP_SECONDS) for address, stub in stubs.items()}
    for address, future in futures.items():
        if address in silent:
            continue
        try:
            future.result()
        except grpc.RpcError:
            pass


