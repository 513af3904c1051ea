"""Driving a run: build every rank's plan, configure all agents, start them, wait, collect.

The orchestrator talks to agents only through their Control service (on the management
network when in a lab); the agents move gradients among themselves over the data plane.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import grpc

from orchestrator.agent.plan import build_rank_plans, chunk_bytes as default_chunk_bytes
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.errors import TestbedError

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


@dataclass
class RunResult:
    run_id: str
    algorithm: str
    results: list[pb.RunResults]
    size_bytes: int
    wall_seconds: float

    def gst(self) -> list[float]:
        """Per iteration, the synchronisation time of the slowest agent (parameter servers
        report iterations too and are included)."""
        agents = [r for r in self.results if r.records]
        iterations = min(len(r.records) for r in agents)
        return [max(r.records[i].gst_seconds for r in agents) for i in range(iterations)]

    def back_to_back_times(self) -> list[float]:
        """Per agent, NCCL-tests' time per operation of a back-to-back run: from entering the
        first operation after the warm-up (iteration 0) to leaving the last, divided by their
        number. NCCL-tests reports the mean over ranks by default (`-a 1`), the max with `-a 3`."""
        times = []
        for r in self.results:
            timed = r.records[1:]
            if timed:
                times.append((timed[-1].start_time + timed[-1].gst_seconds - timed[0].start_time) / len(timed))
        if not times:
            raise ValueError("a back-to-back time needs at least two iterations: the first is the warm-up")
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
    channels = {e.control: grpc.insecure_channel(e.control, options=BIG) for e in endpoints}
    try:
        yield {address: pb_grpc.ControlStub(channel) for address, channel in channels.items()}
    finally:
        for channel in channels.values():
            channel.close()


def wait_healthy(endpoints: list[Endpoint], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for endpoint in endpoints:
        while True:
            # a fresh channel per try: a reused one would wait out gRPC's reconnect backoff
            # after the agent finally listens
            try:
                with grpc.insecure_channel(endpoint.control, options=BIG) as channel:
                    pb_grpc.ControlStub(channel).Health(pb.Empty(), timeout=2)
                break
            except grpc.RpcError:
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
) -> RunResult:
    """Run `iterations` of `algorithm` over the agents; raises RunError naming a failed rank.

    `workloads` is one workload for all workers or one per worker (real workloads carry
    each worker's data shard). Endpoints with role "ps" are parameter servers.
    `chunk_bytes`: bytes per streamed message (default: by the schedule's fan-in, see
    `plan.chunk_bytes`).
    """
    workers = [e for e in endpoints if e.role == "worker"]
    ctx = ctx or Context(len(workers))
    size = sum(tensors)
    parts = partitions(tensors, partition_bytes)
    schedules = registry.schedules(algorithm, ctx, size, parts)
    ranks = schedules[0][1].ranks if schedules else len(endpoints)
    if ranks != len(endpoints):
        raise RunError(f"{algorithm} needs {ranks} agents (workers and servers), {len(endpoints)} given")
    plans = build_rank_plans(schedules, ranks)
    chunk_bytes = chunk_bytes or default_chunk_bytes(schedules, credit_bytes)
    run_id = uuid.uuid4().hex[:12]
    peers = [pb.Peer(rank=e.rank, node=e.node, address=e.data, by_nic=e.by_nic) for e in endpoints]
    per_worker = workloads if isinstance(workloads, list) else [workloads] * len(workers)

    def configure(stub: pb_grpc.ControlStub, endpoint: Endpoint) -> None:
        spec = per_worker[endpoint.rank] if endpoint.role == "worker" else {"kind": "server"}
        reply = stub.Configure(
            pb.RunConfig(
                run_id=run_id, rank=endpoint.rank, role=endpoint.role, peers=peers, algorithm=algorithm,
                plan_json=plans[endpoint.rank], size=size, iterations=iterations,
                workload_json=json.dumps(spec), chunk_bytes=chunk_bytes, credit_bytes=credit_bytes,
                workers=len(workers),
            ),
            timeout=60,
        )
        if not reply.ok:
            raise RunError(f"configuring rank {endpoint.rank} ({endpoint.node}): {reply.error}")

    with _control_stubs(endpoints) as stubs, ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda e: configure(stubs[e.control], e), endpoints))
        started = time.monotonic()
        replies = pool.map(lambda e: stubs[e.control].Start(pb.StartRequest(run_id=run_id), timeout=30), endpoints)
        for reply, endpoint in zip(replies, endpoints):
            if not reply.ok:
                raise RunError(f"starting rank {endpoint.rank} ({endpoint.node}): {reply.error}")
        _wait(endpoints, stubs, started + timeout)
        wall = time.monotonic() - started
        results = [stubs[e.control].Results(pb.Empty(), timeout=30) for e in endpoints]
    return RunResult(run_id, algorithm, results, size * 4, wall)


LONG_POLL_SECONDS = 1.0


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
