"""Driving a run: build every rank's plan, configure all agents, start them, wait, collect.

The orchestrator talks to agents only through their Control service (on the management
network when in a lab), every call carrying the agent's token (agent/auth.py); the agents
move gradients among themselves over the data plane.
"""

from __future__ import annotations

import collections
import json
import queue
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

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
) -> RunResult:
    """Run `iterations` of `algorithm` over the agents; raises RunError naming a failed rank.

    `workloads` is one workload for all workers or one per worker (real workloads carry
    each worker's data shard). Endpoints with role "ps" are parameter servers.
    `chunk_bytes`: bytes per streamed message (default: by the schedule's fan-in, see
    `plan.chunk_bytes`). `network`: the lab's links (`cost.Network.from_links(spec.links)`);
    with it and `ctx.topology` the result carries the cost model's prediction, and (unless
    `pace` is False) every connection is paced at its fair share of the link (cost.shares).
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
        list(pool.map(lambda e: configure(stubs[e.control], e), endpoints))
        started = time.monotonic()
        # all ranks enter the first iteration together, once every Start has arrived
        start_at = time.time() + START_MARGIN_SECONDS
        replies = pool.map(lambda e: stubs[e.control].Start(pb.StartRequest(run_id=run_id, start_at=start_at), timeout=30),
                           endpoints)
        for reply, endpoint in zip(replies, endpoints):
            if not reply.ok:
                raise RunError(f"starting rank {endpoint.rank} ({endpoint.node}): {reply.error}")
        _wait(endpoints, stubs, started + timeout)
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


def _wait(endpoints: list[Endpoint], stubs: dict[str, pb_grpc.ControlStub], deadline: float) -> None:
    """Until every agent is done: one long-polling Wait per agent at a time (see Agent.wait),
    answered the moment its run ends; the first failure stops them all."""
    answers: queue.Queue[tuple[Endpoint, grpc.Future]] = queue.Queue()

    def ask(endpoint: Endpoint) -> None:
        wait = min(LONG_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
        future = stubs[endpoint.control].Wait.future(pb.WaitRequest(timeout_seconds=wait), timeout=wait + 10)
        future.add_done_callback(lambda f: answers.put((endpoint, f)))

    for endpoint in endpoints:
        ask(endpoint)
    pending = {e.rank: e for e in endpoints}
    while pending:
        try:
            endpoint, future = answers.get(timeout=max(0.0, deadline - time.monotonic()) + 1)
        except queue.Empty:
            endpoint, future = None, None
        if future is not None:
            try:
                status = future.result()
            except grpc.RpcError as exc:
                _call_each(stubs, "Stop")
                raise RunError(f"rank {endpoint.rank} ({endpoint.node}) stopped answering: {exc.code().name}") from exc
            if status.state == "failed":
                _call_each(stubs, "Stop")
                raise RunError(f"rank {endpoint.rank} ({endpoint.node}) failed: {status.error}")
            if status.state == "done":
                del pending[endpoint.rank]
            elif time.monotonic() <= deadline:
                ask(endpoint)
                continue
        if pending and time.monotonic() > deadline:
            _call_each(stubs, "Stop")
            names = ", ".join(e.node for e in list(pending.values())[:4])
            raise RunError(f"run timed out waiting for {names}")


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
