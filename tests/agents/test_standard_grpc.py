"""The agent's standard gRPC surfaces: grpc.health.v1 (Check and Watch, per service) and server
reflection, open without the Control token; and the configuration file a deployed agent
reads (token in a private file). Real agent processes on loopback."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from orchestrator.agent import auth
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.control import driver
from orchestrator.control.local import free_ports

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _start(tmp_path: Path, token_mode: int = 0o600) -> tuple[subprocess.Popen, driver.Endpoint]:
    """An agent started as a deployed one is: `--config FILE`, its token in a file."""
    control, data = free_ports(2)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(token_mode)
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"node": "probe", "control": f"127.0.0.1:{control}", "data": [f"127.0.0.1:{data}"],
                                  "window": 0, "token_file": str(token_file)}))
    env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.agent.server", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    return proc, driver.Endpoint(0, "probe", f"127.0.0.1:{control}", f"127.0.0.1:{data}", token="s3cret-token")


@pytest.fixture
def agent(tmp_path):
    for attempt in range(3):  # free_ports races other processes for the ports it found free
        proc, endpoint = _start(tmp_path)
        try:
            driver.wait_healthy([endpoint], timeout=20)  # the standard check, then Control with the token
            break
        except driver.RunError:
            proc.kill()
            _, errors = proc.communicate()
            if attempt == 2 or "address" not in errors.lower():  # not a taken port: say what the agent said
                raise AssertionError(f"the agent did not answer; it said: {errors[-2000:]}") from None
    try:
        yield proc, endpoint
    finally:
        proc.kill()
        proc.wait()


def _check(address: str, service: str) -> int | grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        except grpc.RpcError as exc:
            return exc


@pytest.mark.parametrize("service", ["", "testbed.Control", "testbed.Data"])
def test_every_service_is_serving_to_a_probe_without_a_token(agent, service):
    _, endpoint = agent
    assert _check(endpoint.control, service) == SERVING


def test_an_unknown_service_is_not_found(agent):
    _, endpoint = agent
    reply = _check(endpoint.control, "testbed.Nothing")
    assert isinstance(reply, grpc.RpcError) and reply.code() == grpc.StatusCode.NOT_FOUND


def test_control_still_needs_the_token(agent):
    _, endpoint = agent
    with grpc.insecure_channel(endpoint.control) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ControlStub(channel).Health(pb.Empty(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_reflection_lists_and_describes_the_services_without_a_token(agent):
    _, endpoint = agent
    with grpc.insecure_channel(endpoint.control) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == {"testbed.Control", "grpc.health.v1.Health",
                                                "grpc.reflection.v1alpha.ServerReflection"}
        control = database.FindFileContainingSymbol("testbed.Control")
    methods = {m.name for s in control.service if s.name == "Control" for m in s.method}
    assert {"Configure", "Start", "Wait", "Results", "Health", "Shutdown"} <= methods


def _watch(address: str, service: str, seen: queue.Queue) -> threading.Thread:
    def watch() -> None:
        with grpc.insecure_channel(address) as channel:
            try:
                for reply in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=20):
                    seen.put(reply.status)
            except grpc.RpcError as exc:
                seen.put(exc.code())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("stop", ["SIGTERM", "Shutdown"])
def test_watch_sees_serving_then_not_serving_when_the_agent_stops(agent, stop):
    proc, endpoint = agent
    seen: queue.Queue = queue.Queue()
    watchers = [_watch(endpoint.control, service, seen) for service in ("", "testbed.Control")]
    first = [seen.get(timeout=10) for _ in watchers]
    assert first == [SERVING, SERVING]
    if stop == "SIGTERM":  # what a supervisor sends
        proc.send_signal(signal.SIGTERM)
    else:
        with driver.control_channel(endpoint) as channel:
            pb_grpc.ControlStub(channel).Shutdown(pb.Empty(), timeout=5)
    assert [seen.get(timeout=10) for _ in watchers] == [NOT_SERVING, NOT_SERVING]
    assert proc.wait(timeout=10) == 0
    for thread in watchers:
        thread.join(timeout=10)


def test_an_agent_refuses_a_token_file_others_can_read(tmp_path):
    proc, _ = _start(tmp_path, token_mode=0o644)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert stderr.strip().splitlines() == [
        f"testbed-agent: {tmp_path / 'token'} holds the Control token and must be private: chmod 600 {tmp_path / 'token'}"
    ]
