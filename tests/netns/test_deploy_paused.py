"""Deploying on a paused server of a netns lab (star,2) fails at once, in one line naming it.

The tester's case: `testbed fault LAB server-pause h1` on a server with no agents running
freezes nothing (the pause stops the processes of its moment), and `deploy --servers h1`
started a fresh agent there and said "1 agent healthy". Agents stopped by hand (SIGSTOP)
are named too: they accept connections and never answer."""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.deploy import deploy, supervision
from orchestrator.deploy.agents import endpoints
from orchestrator.errors import DeployError
from orchestrator.faults import Injector
from tests.conftest import until


def health(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="testbed.Control"),
                                                              timeout=3)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            return exc.code().name


def state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def lab(make_lab):
    return make_lab("star,2", name="dep-pause", **{"servers.runtime": "netns"})


def test_deploy_on_a_paused_server_names_it_at_once_and_starts_nothing(lab):
    injector = Injector(lab)
    paused = injector.inject("server-pause", "h1").fault.id
    started = time.monotonic()
    with pytest.raises(DeployError) as caught:
        deploy(lab, servers=["h1"])
    assert time.monotonic() - started < 10  # not a health wait's 30 s
    assert str(caught.value) == (f"lab dep-pause: h1 does not answer: it is paused (fault {paused}, server-pause): "
                                 f"resume it with `testbed fault dep-pause heal {paused}`, then deploy again")
    assert supervision.running(lab, "h1") is None  # nothing started on it
    (h1,) = endpoints(lab, ["h1"])
    assert health(h1.control) == "UNAVAILABLE"
    injector.undo(paused)
    assert health(deploy(lab, servers=["h1"]).endpoints[0].control) == "SERVING"


def test_deploy_over_stopped_agents_names_the_server_and_the_processes(lab):
    deployment = deploy(lab)
    agent = supervision.server_dir(lab, "h0") / "agent" / "service"
    pid = int(os.popen(f"svstat {agent}").read().split("(pid ", 1)[1].split(")")[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        until(lambda: state(pid) == "T", "SIGSTOP did not stop the agent", timeout=10.0, every=0.02)
        started = time.monotonic()
        with pytest.raises(DeployError) as caught:
            deploy(lab)
        assert time.monotonic() - started < 10
        text = str(caught.value)
        assert text.startswith(f"lab dep-pause: h0 does not answer: its agent's processes are stopped (SIGSTOP: pid "
                               f"{pid} testbed-agent)"), text
        assert f"`kill -CONT {pid}`" in text and "\n" not in text
    finally:
        os.kill(pid, signal.SIGCONT)
    until(lambda: state(pid) != "T", "SIGCONT did not resume the agent", timeout=10.0, every=0.02)
    assert [health(e.control) for e in deploy(lab).endpoints] == ["SERVING"] * 2
    # a pause by fault over running agents: the journal names it before any process is read
    fault_id = Injector(lab).inject("server-pause", "h1").fault.id
    with pytest.raises(DeployError, match=f"h1 does not answer: it is paused \\(fault {fault_id}, server-pause\\)"):
        deploy(lab, servers=["h0", "h1"])
    Injector(lab).undo(fault_id)
    assert {health(e.control) for e in deployment.endpoints} == {"SERVING"}
