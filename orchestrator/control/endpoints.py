"""Where the agents are and how to reach their Control: endpoints, token-carrying channels,
health, shutdown. The control layer's own (control/); deploy imports it, never the reverse,
and the run driver builds on it."""

from __future__ import annotations

import collections
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.agent import auth
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.errors import RunError

CONTROL_SERVICE = "testbed.Control"  # its name in the standard health check
BIG = [("grpc.max_send_message_length", 256 * 2**20), ("grpc.max_receive_message_length", 256 * 2**20)]
# Channels with equal options share one connection per address process-wide, and its reconnect
# backoff with it: while a crashed server was down, the experiment's iteration watcher kept
# failing to reach it, and a fresh channel to its restarted agent then failed at once with
# UNAVAILABLE until that backoff (seconds, growing) ran out. Each channel connects on its own.
CONTROL_OPTIONS = [*BIG, ("grpc.use_local_subchannel_pool", 1)]


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
    channel = grpc.insecure_channel(endpoint.control, options=CONTROL_OPTIONS)
    return grpc.intercept_channel(channel, _Token(endpoint.token)) if endpoint.token else channel


def refused(exc: grpc.RpcError, endpoint: Endpoint) -> RunError | None:
    """One line for a call the agent refused for its token, which no retry will change."""
    if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
        return None
    return RunError(f"agent of {endpoint.node} ({endpoint.control}) refused the orchestrator's token: it was started "
                    "by another lab or run; stop it and start the lab's agents again")


@contextmanager
def control_stubs(endpoints: list[Endpoint]) -> Iterator[dict[str, pb_grpc.ControlStub]]:
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
                if refusal := refused(exc, endpoint):
                    raise refusal from None
            if time.monotonic() > deadline:
                raise RunError(f"agent of {endpoint.node} ({endpoint.control}) is not answering") from None
            time.sleep(0.2)


def run_ids(endpoints: list[Endpoint]) -> set[str]:
    """The runs the agents hold now (one each; "" for none): what `until_iteration` passes
    over, to wait for the run started next."""
    with control_stubs(endpoints) as stubs:
        return {stub.Status(pb.Empty(), timeout=5).run_id for stub in stubs.values()}


def until_iteration(endpoints: list[Endpoint], iteration: int, other_than: set[str] = frozenset(),
                    timeout: float = 120.0) -> None:
    """Wait (polling Status) until every agent runs a run not in `other_than` (`run_ids`
    taken before it started) at `iteration` or later, or has finished it: what a script
    that changes the lab mid-run (a fault at an iteration) waits for. RunError at `timeout`."""
    deadline = time.monotonic() + timeout
    with control_stubs(endpoints) as stubs:
        while time.monotonic() < deadline:
            statuses = [stub.Status(pb.Empty(), timeout=5) for stub in stubs.values()]
            if all(s.run_id not in other_than and s.state in ("running", "done") and s.iteration >= iteration
                   for s in statuses):
                return
            time.sleep(0.05)
    raise RunError(f"the agents did not all reach iteration {iteration} within {timeout:.0f} s")


def call_each(stubs: dict[str, pb_grpc.ControlStub], method: str) -> None:
    """`method` (Stop, Shutdown) on every agent, skipping those already gone."""
    for stub in stubs.values():
        try:
            getattr(stub, method)(pb.Empty(), timeout=5)
        except grpc.RpcError:
            pass


def shutdown(endpoints: list[Endpoint]) -> None:
    with control_stubs(endpoints) as stubs:
        call_each(stubs, "Shutdown")
