"""Control answers only calls carrying the agent's token; real agents on loopback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import pytest

from orchestrator.agent import auth
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.deploy import lab_agents
from orchestrator.control import driver
from orchestrator.control.local import free_ports, local_agents


@pytest.fixture(scope="module")
def agent():
    with local_agents(1) as endpoints:
        yield endpoints[0]


def _call(endpoint: driver.Endpoint, method: str, metadata=()) -> grpc.RpcError | object:
    with grpc.insecure_channel(endpoint.control) as channel:
        try:
            return getattr(pb_grpc.ControlStub(channel), method)(pb.Empty(), metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            return exc


@pytest.mark.parametrize("metadata", [(), auth.metadata("not-the-token"), (("authorization", "nonsense"),)],
                         ids=["none", "wrong", "malformed"])
@pytest.mark.parametrize("method", ["Shutdown", "Health", "Stop", "Results"])
def test_a_control_call_without_the_token_is_refused_and_the_agent_keeps_running(agent, method, metadata):
    refused = _call(agent, method, metadata)
    assert isinstance(refused, grpc.RpcError), refused
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.details().startswith(f"/testbed.Control/{method} refused: ") and "token" in refused.details()
    health = _call(agent, "Health", auth.metadata(agent.token))
    assert isinstance(health, pb.HealthReply) and health.node == agent.node


def test_the_endpoints_token_opens_control(agent):
    assert _call(agent, "Health", auth.metadata(agent.token)).ok
    driver.wait_healthy([agent])  # the driver's channels carry it


def test_the_driver_names_an_agent_that_refuses_its_token_at_once(agent):
    started = time.monotonic()
    with pytest.raises(driver.RunError, match=r"^agent of local0 \(127\.0\.0\.1:\d+\) refused the orchestrator's token"):
        driver.wait_healthy([replace(agent, token="stale")], timeout=20)
    assert time.monotonic() - started < 5  # not retried until the timeout


def test_the_token_stays_off_the_agents_command_line(agent):
    pid = subprocess.run(["pgrep", "-f", "--", f"--control {agent.control}"], capture_output=True, text=True).stdout.split()[0]
    assert agent.token not in open(f"/proc/{pid}/cmdline").read()
    assert repr(agent).count(agent.token) == 0  # nor in an endpoint's repr (logs, tracebacks)


def test_an_agent_without_a_token_refuses_to_start():
    control, data = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.agent.server", "--node", "x", "--control", f"127.0.0.1:{control}",
         "--data", f"127.0.0.1:{data}"],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"testbed-agent: {auth.TOKEN_ENV} is not set: Control answers only calls carrying a token; start agents "
        "with testbed (deploy.lab_agents or runner.local), or set it"
    ]


def test_a_labs_secret_is_private_made_once_and_tokens_differ_per_server(tmp_path):
    with ThreadPoolExecutor(8) as pool:  # concurrent first uses agree
        secrets = set(pool.map(lambda _: lab_agents.lab_secret(tmp_path), range(32)))
    assert len(secrets) == 1 and len(secrets.pop()) >= 32
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]  # no partial file left
    secret = lab_agents.lab_secret(tmp_path)
    assert lab_agents.agent_token(secret, "h0") == lab_agents.agent_token(secret, "h0")
    assert lab_agents.agent_token(secret, "h0") != lab_agents.agent_token(secret, "h1")
    assert lab_agents.agent_token(secret, "h0") != lab_agents.agent_token(b"another lab", "h0")
