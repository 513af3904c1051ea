"""Driving a run: build every rank's plan, configure all agents, start them, wait, collect.

The orchestrator talks to agents only through their Control service (on the management
network when in a lab), every call carrying the agent's token (agent/auth.py); the agents
move gradients among themselves over the data plane.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.agent import auth
from orchestrator.agent.plan import build_rank_plans, chunk_bytes as default_chunk_bytes
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.cost import Network, Prediction, predict_schedules
from orchestrator.cost.routes import Routes
from orchestrator.cost.shares import fair_shares
from orchestrator.errors import TestbedError

log = logging.getLogger("testbed.driver")

CONTROL_SERVICE = "testbed.Control"  # its name in the standard health check
BIG = [("grpc.max_send_message_length", 256 * 2**20), ("grpc.max_receive_message_length", 256 * 2**20)]


class RunError(TestbedError):
    """A run failed on some agent; the message names the rank and node."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach one agent."""

    rank: int
    node: str
    control: str  # host:port (management network)
    data: str  # default host:port for data
    by_nic: dict = field(default_factory=dict)  # NIC index → host:port on that NIC's subnet
    role: str = "worker"
    token: str = field(default="", repr=False)  # what its Control calls carry (kept out of logs)


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class _Token(grpc.UnaryUnaryClientInterceptor):
    """Puts an agent's token on every call of its channel."""

    def __init__(self, token: str) -> None:
        self.metadata = auth.metadata(token)

    def intercept_unary_unary(self, continuation, details, request):
        with_token = _CallDetails(details.method, details.timeout, (*(details.metadata or ()), *self.metadata),
                                  details.credentials, details.wait_for_ready, details.compression)
        return continuation(with_token, request)


def control_channel(endpoint: Endpoint) -> grpc.Channel:
    """A channel to an agent's Control whose calls carry its token (if it has one)."""
    channel = grpc.insecure_channel(endpoint.control, options=BIG)
    return grpc.intercept_channel(channel, _Token(endpoint.token)) if endpoint.token else channel


def _refused(exc: grpc.RpcError, endpoint: Endpoint) -> RunError | None:
    """One line for a call the agent refused for its token, which no retry will change."""
    if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
        return None
    return RunError(f"agent of {endpoint.node} ({endpoint.control}) refused the orchestrator's token: it was started "
                    "by another lab or run; stop it and start the lab's agents again")


@dataclass
class RunResult:
    run_id: str
    algorithm: str
    results: list[pb.RunResults]
    size_bytes: int
    wall_seconds: float
    # the cost model's prediction of one allreduce of this run (time, bytes per link), when
    # run() was told the lab's network: see _prediction
    predicted: Prediction | None = None

    def gst(self) -> list[float]:
        """Per iteration, the synchronisation time of the slowest agent (parameter servers
        report iterations too and are included)."""
        agents = [r for r in self.results if r.records]
        iterations = min(len(r.records) for r in agents)
        return [max(r.records[i].gst_seconds for r in agents) for i in range(iterations)]

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

    def records(self) -> list[dict]:
        return [
            {"rank": r.rank, "node": r.node, "iteration": rec.iteration, "gst_s": rec.gst_seconds,
             "compute_s": rec.compute_seconds, "bytes_sent": rec.bytes_sent, "bytes_received": rec.bytes_received,
             "loss": rec.loss, "param_digest": rec.param_digest, "verified": rec.verified}
            for r in self.results for rec in r.records
        ]


@contextmanager
def _control_stubs(endpoints: list[Endpoint]) -> Iterator[dict[str, pb_grpc.ControlStub]]:
    """One Control channel per agent, by control address, closed on exit. A channel per call
    would open a TCP connection per status poll (20 a second per agent) while the agents
    are busy moving gradients."""
    channels = {e.control: control_channel(e) for e in endpoints}
    try:
        yield {address: pb_grpc.ControlStub(channel) for address, channel in channels.items()}
    finally:
        for channel in channels.values():
            channel.close()


def wait_healthy(endpoints: list[Endpoint], timeout: float = 30.0) -> None:
    """Wait until every agent answers the standard health check (grpc.health.v1, the service
    testbed.Control SERVING: what probes and the playbooks ask, without a token), then make
    one Control call with its token: an agent of another lab or run on that address is
    refused in one line rather than used."""
    deadline = time.monotonic() + timeout
    for endpoint in endpoints:
        while True:
            # a fresh channel per try: a reused one would wait out gRPC's reconnect backoff
            # after the agent finally listens
            try:
                with grpc.insecure_channel(endpoint.control) as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=CONTROL_SERVICE), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    with control_channel(endpoint) as channel:
                        pb_grpc.ControlStub(channel).Health(pb.Empty(), timeout=2)
                    break
            except grpc.RpcError as exc:
                if refused := _refused(exc, endpoint):
                    raise refused from None
            if time.monotonic() > deadline:
                raise RunError(f"agent of {endpoint.node} ({endpoint.control}) is not answering") from None
            time.sleep(0.2)


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
) -> RunResult:
    """Run `iterations` of `algorithm` over the agents; raises RunError naming a failed rank.

    `workloads` is one workload for all workers or one per worker (real workloads carry
    each worker's data shard). Endpoints with role "ps" are parameter servers.
    `chunk_bytes`: bytes per streamed message (default: by the schedule's fan-in, see
    `plan.chunk_bytes`). `network`: the lab's links (`cost.Network.from_links(spec.links)`);
    with it and `ctx.topology` the result carries the cost model's prediction, and (unless
    `pace` is False) every connection is paced at its fair share of the link (cost.shares).

    Failure detection: the run fails as soon as no rank has moved data for `stall_timeout`
    seconds (default: `default_stall_timeout`), naming the stalled ranks, the peers they wait
    for and, in a lab, the path between them; `link_state(a, b)` (True up, False down, None
    unknown), when given, names the link of that path that is down. Before configuring, a
    stale run an agent still holds (its driver gone, or the agent frozen and thawed) is
    stopped, with one warning on the "testbed.driver" logger.
    """
    workers = [e for e in endpoints if e.role == "worker"]
    ctx = ctx or Context(len(workers))
    size = sum(tensors)
    parts = partitions(tensors, partition_bytes)
    schedules = registry.schedules(algorithm, ctx, size, parts)
    ranks = schedules[0][1].ranks if schedules else len(endpoints)
    if ranks != len(endpoints):
        raise RunError(f"{algorithm} needs {ranks} agents (workers and servers), {len(endpoints)} given")
    chunk_bytes = chunk_bytes or default_chunk_bytes(schedules, credit_bytes)
    nodes, in_lab = _rank_nodes(ctx, endpoints)
    predicted, routes = _prediction(ctx, nodes, schedules, network, chunk_bytes, credit_bytes)
    if predicted is not None and pace and in_lab:
        # in a lab, each connection paced at its fair share (agent/pacing.py says why)
        plans = build_rank_plans(schedules, ranks, fair_shares(routes, schedules, nodes), network.ip_rate)
    else:
        plans = build_rank_plans(schedules, ranks)
    stall_timeout = stall_timeout or default_stall_timeout(predicted)
    path_of = _path_finder(ctx) if in_lab else None
    run_id = uuid.uuid4().hex[:12]
    peers = [pb.Peer(rank=e.rank, node=e.node, address=e.data, by_nic=e.by_nic) for e in endpoints]
    per_worker = workloads if isinstance(workloads, list) else [workloads] * len(workers)

    def configure(stub: pb_grpc.ControlStub, endpoint: Endpoint) -> None:
        spec = per_worker[endpoint.rank] if endpoint.role == "worker" else {"kind": "server"}
        try:
            reply = stub.Configure(
                pb.RunConfig(
                    run_id=run_id, rank=endpoint.rank, role=endpoint.role, peers=peers, algorithm=algorithm,
                    plan_json=plans[endpoint.rank], size=size, iterations=iterations,
                    workload_json=json.dumps(spec), chunk_bytes=chunk_bytes, credit_bytes=credit_bytes,
                    workers=len(workers),
                ),
                timeout=60,
            )
        except grpc.RpcError as exc:
            if refused := _refused(exc, endpoint):
                raise refused from None
            raise
        if not reply.ok:
            raise RunError(f"configuring rank {endpoint.rank} ({endpoint.node}): {reply.error}")

    with _control_stubs(endpoints) as stubs, ThreadPoolExecutor(max_workers=16) as pool:
        _stop_stale(endpoints, stubs, pool)
        list(pool.map(lambda e: configure(stubs[e.control], e), endpoints))
        started = time.monotonic()
        # all ranks enter the first iteration together, once every Start has arrived
        start_at = time.time() + START_MARGIN_SECONDS
        replies = pool.map(lambda e: stubs[e.control].Start(pb.StartRequest(run_id=run_id, start_at=start_at), timeout=30),
                           endpoints)
        for reply, endpoint in zip(replies, endpoints):
            if not reply.ok:
                raise RunError(f"starting rank {endpoint.rank} ({endpoint.node}): {reply.error}")
        _wait(endpoints, stubs, started + timeout, Stall(algorithm, stall_timeout, path_of, link_state))
        wall = time.monotonic() - started
        results = [stubs[e.control].Results(pb.Empty(), timeout=30) for e in endpoints]
    return RunResult(run_id, algorithm, results, size * 4, wall, predicted)


def _rank_nodes(ctx: Context, endpoints: list[Endpoint]) -> tuple[list[str], bool]:
    """(the server of every rank, whether the endpoints are the lab's servers): its
    endpoint's node when those are the topology's servers (a lab), else `ctx.nodes` or the
    servers in order (loopback agents standing in for a lab)."""
    nodes = [e.node for e in sorted(endpoints, key=lambda e: e.rank)]
    if ctx.topology is None:
        return nodes, False
    if all(node in ctx.topology.nodes for node in nodes):
        return nodes, True
    return (list(ctx.nodes) if len(ctx.nodes) >= len(nodes) else [s.name for s in ctx.topology.servers]), False


def _prediction(ctx: Context, nodes: list[str], schedules, network: Network | None, chunk_bytes: int,
                credit_bytes: int) -> tuple[Prediction | None, Routes | None]:
    """The cost model's prediction for the very schedules of this run (about 0.1 s for 16
    servers; more with many partitions), rank r on `nodes[r]`, and the routes it mapped the
    transfers onto (the fair shares the agents pace at use them again)."""
    if network is None or ctx.topology is None or not schedules:
        return None, None
    try:
        routes = Routes(ctx.topology)
        return predict_schedules(ctx.topology, schedules, nodes, network, chunk_bytes, credit_bytes,
                                 routes=routes), routes
    except ValueError as exc:  # more ranks than the topology has servers
        raise RunError(f"cannot predict {schedules[0][1].algorithm} on this {ctx.topology.kind}: {exc}") from None


LONG_POLL_SECONDS = 1.0
START_MARGIN_SECONDS = 1.0  # for every agent to get its Start call and open its connections
TICK_SECONDS = 0.25  # how often the driver looks for a stall between answers
STALL_SECONDS = 5.0  # the least stall timeout: longer than any hiccup of a busy host
SILENT_SECONDS = LONG_POLL_SECONDS + 2.0  # an agent answers a long poll every second
STALE_SECONDS = 3 * LONG_POLL_SECONDS  # a run unwatched this long has no driver any more
STOP_SECONDS = 2.0  # for the Stop calls that end a failed run (a frozen agent never answers)


def default_stall_timeout(predicted: Prediction | None) -> float:
    """`STALL_SECONDS`, or twice the predicted allreduce when longer (a lab's slow links).
    A stall is no data moved by any rank, computing ranks counting as moving: even the
    slowest step of a plan moves some chunk well within a whole allreduce's time."""
    return max(STALL_SECONDS, 2 * predicted.seconds) if predicted is not None else STALL_SECONDS


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
            if refused := _refused(exc, endpoint):
                raise refused from None
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


@dataclass
class RankView:
    """What the driver knows of one rank while it waits: its last status and how old it is."""

    rank: int
    node: str
    status: pb.AgentStatus | None  # None: it has not answered since the run started
    silent: float  # seconds since its last answer
    stalled: float  # seconds since it last moved data, by its last answer and the time since


@dataclass
class Stall:
    """When a run has stalled, and one line on why (`message`)."""

    algorithm: str
    timeout: float
    path_of: Callable[[str, str], list[str]] | None = None
    link_state: Callable[[str, str], bool | None] | None = None

    def stalled(self, views: list[RankView]) -> bool:
        """No rank has moved data (or computed, or answered) for `timeout` seconds."""
        return bool(views) and min(v.stalled for v in views) >= self.timeout

    def message(self, views: list[RankView]) -> str:
        return stall_message(self.algorithm, views, self.timeout, self.path_of, self.link_state)


def stall_message(algorithm: str, views: list[RankView], timeout: float,
                  path_of: Callable[[str, str], list[str]] | None = None,
                  link_state: Callable[[str, str], bool | None] | None = None) -> str:
    """One line on a stalled run: ranks that stopped answering, else the ranks that wait for
    a peer that has sent them data (or is sending it) that does not arrive — the path
    between them is dead — with that path and, known or guessed, its dead link."""
    by_rank = {v.rank: v for v in views}
    silent = [v for v in views if v.silent >= SILENT_SECONDS]
    edges = _dead_edges(views, {v.rank for v in silent})
    steps = [step for _, _, step in edges] or [p.step for v in views if v.status for p in v.status.pending]
    iterations = [v.status.iteration for v in views if v.status and v.status.state == "running"]
    where = f" at iteration {min(iterations)}" if iterations else ""
    where += f" step {min(steps)}" if steps else ""
    head = f"{algorithm} stalled{where}: "
    if silent:
        parts = [f"rank {v.rank} ({v.node}) has not answered for {v.silent:.1f} s" + _waited_by(v.rank, views)
                 for v in silent]
        return head + "; ".join(parts) + " (frozen, or its management path down?): thaw or restart it and run again"
    if not edges:
        waits = [f"rank {v.rank} ({v.node}) waits for {_peers(v, by_rank)}" for v in views if v.status]
        return head + f"no data moved for {timeout:.1f} s; " + "; ".join(waits[:4] or ["no rank says why"])
    paths = {}
    parts = []
    for src, dst, _ in edges[:4]:
        s, d = by_rank[src], by_rank[dst]
        part = f"rank {d.rank} ({d.node}) waits for rank {s.rank} ({s.node}) since {d.stalled:.1f} s"
        path = path_of(s.node, d.node) if path_of else []
        if path:
            paths[(src, dst)] = path
            part += f"; path {'→'.join(path)}"
        parts.append(part)
    return head + "; ".join(parts) + _link_verdict(list(paths.values()), link_state)


def _dead_edges(views: list[RankView], silent: set[int]) -> list[tuple[int, int, int]]:
    """(sender, receiver, step) of transfers a receiver is ready for while the sender has
    written that data already, or is blocked writing it: nothing else holds it back."""
    statuses = {v.rank: v.status for v in views if v.status is not None and v.rank not in silent}
    edges = []
    for rank, status in statuses.items():
        for wait in status.pending:
            if wait.kind != "receive" or not wait.ready or wait.peer not in statuses:
                continue
            sends = [q for q in statuses[wait.peer].pending
                     if q.kind == "send" and q.peer == rank and q.step == wait.step and q.partition == wait.partition
                     and q.offset <= wait.done < q.end]
            # no such send left: written in full; else written past what arrived, or ready to write
            if all(q.done > wait.done or q.ready for q in sends):
                edges.append((wait.peer, rank, wait.step))
    first: dict[tuple[int, int], int] = {}
    for src, dst, step in edges:  # one per pair: its earliest step
        first[(src, dst)] = min(step, first.get((src, dst), step))
    return sorted(((src, dst, step) for (src, dst), step in first.items()), key=lambda e: (e[2], e[1], e[0]))


def _waited_by(rank: int, views: list[RankView]) -> str:
    waiting = sorted({v.rank for v in views if v.status and any(p.peer == rank for p in v.status.pending)})
    if not waiting:
        return ""
    return f" (rank {waiting[0]} waits for it)" if len(waiting) == 1 else \
        f" (ranks {', '.join(map(str, waiting))} wait for it)"


def _peers(view: RankView, by_rank: dict[int, RankView]) -> str:
    ranks = sorted({p.peer for p in view.status.pending if p.ready})
    named = [f"rank {r} ({by_rank[r].node})" if r in by_rank else f"rank {r}" for r in ranks]
    return ", ".join(named[:3]) or "nothing it can name"


def _link_verdict(paths: list[list[str]], link_state: Callable[[str, str], bool | None] | None) -> str:
    """The link of these paths that is down (asked of `link_state`), else the one link all of
    them share, which would explain them all."""
    links = [list(zip(path, path[1:])) for path in paths]
    if not links:
        return ""
    if link_state is not None:
        down = sorted({"-".join(sorted((a, b))) for path in links for a, b in path if link_state(a, b) is False})
        if down:
            return f" (link {', '.join(down)} down): heal it and run again"
    shared = set.intersection(*({frozenset(link) for link in path} for path in links))
    if len(shared) == 1 and (len(links) > 1 or len(links[0]) == 1):
        a, b = sorted(next(iter(shared)))
        return f" (link {a}-{b} down?): check it and run again"
    return " (a link of it down?): check them and run again"


def _wait(endpoints: list[Endpoint], stubs: dict[str, pb_grpc.ControlStub], deadline: float, stall: Stall) -> None:
    """Until every agent is done: one long-polling Wait per agent at a time (see Agent.wait),
    answered the moment its run ends; the first failure stops them all, and so does a stall
    (`Stall`: checked on every answer and every `TICK_SECONDS`)."""
    answers: queue.Queue[tuple[Endpoint, grpc.Future]] = queue.Queue()

    def ask(endpoint: Endpoint) -> None:
        wait = min(LONG_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
        # the stall check names an agent that stopped answering first, with what waits for it
        future = stubs[endpoint.control].Wait.future(pb.WaitRequest(timeout_seconds=wait),
                                                     timeout=wait + stall.timeout + 10)
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
            if status.state == "failed":
                _stop_all(stubs)
                raise RunError(f"rank {endpoint.rank} ({endpoint.node}) failed: {status.error}")
            if status.state == "done":
                del pending[endpoint.rank]
            elif time.monotonic() <= deadline:
                ask(endpoint)
        if stall.stalled(_views(pending, last)):
            views = _views({e.rank: e for e in endpoints}, last)
            message = stall.message(views)
            silent = {e.control for e, v in zip(endpoints, views) if v.silent >= SILENT_SECONDS}
            _stop_all(stubs, silent)
            raise RunError(message)
        if pending and time.monotonic() > deadline:
            _stop_all(stubs)
            names = ", ".join(e.node for e in list(pending.values())[:4])
            raise RunError(f"run timed out waiting for {names}")


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


def _call_each(stubs: dict[str, pb_grpc.ControlStub], method: str) -> None:
    """`method` (Stop, Shutdown) on every agent, skipping those already gone."""
    for stub in stubs.values():
        try:
            getattr(stub, method)(pb.Empty(), timeout=5)
        except grpc.RpcError:
            pass


def shutdown(endpoints: list[Endpoint]) -> None:
    with _control_stubs(endpoints) as stubs:
        _call_each(stubs, "Shutdown")
