"""Agents deployed with Ansible on a netns lab (fattree,4): each server is a network namespace on
the host, entered by the testbed_nsenter connection; its agent runs from this venv under a
daemontools svscan of its own, journalled, so undeploy, `testbed down` and `clean` stop it."""

from __future__ import annotations

import os
import re
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.collectives.context import Context
from orchestrator.deploy import deploy, supervision, undeploy
from orchestrator.control import driver, workloads
from tests.netns.probes import command_lines


def health(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="testbed.Control"), timeout=3)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            return exc.code().name


def lab_processes(lab) -> list[str]:
    """Command lines of host processes started for the lab's servers (their files are under its state dir)."""
    return command_lines(str(lab.state.dir))


@pytest.fixture(scope="module")
def fattree():
    from orchestrator.emulation import Lab, cleanup
    from orchestrator.spec import lab_from_argument

    lab = Lab.up(lab_from_argument("fattree,4", name="dep-fat", **{"servers.runtime": "netns"}))
    try:
        yield lab
    finally:
        cleanup.clean_lab(lab.name)


@pytest.fixture(scope="module")
def deployed(fattree):
    return deploy(fattree)


def test_every_agent_is_serving_and_supervised_in_its_namespace(fattree, deployed):
    assert sorted(h for h, n in deployed.result.changed.items() if n) == sorted(s.name for s in fattree.topology.servers)
    assert {health(e.control) for e in deployed.endpoints} == {"SERVING"}
    scans = [p for p in lab_processes(fattree) if p.startswith("svscan ")]
    assert len(scans) == 16
    journal = {e.name: e.extra for e in fattree.state.journal() if e.kind == "process"}
    for server in fattree.topology.servers:
        pid = supervision.running(fattree, server.name)
        assert journal[f"svscan-{server.name}"]["pid"] == pid
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{fattree.namespace(server.name)}").st_ino
    token = supervision.server_dir(fattree, "p1e1h0") / "agent" / "token"
    assert oct(token.stat().st_mode & 0o777) == "0o600"


def test_a_second_deploy_changes_nothing(fattree, deployed):
    def mine(*_) -> None:
        pass

    previous = signal.signal(signal.SIGINT, mine)
    try:
        again = deploy(fattree)
        # ansible-runner swaps in its own handler: ours is back after it (Ctrl-C still works)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sum(again.result.changed.values()) == 0, again.result.changed
    assert len([p for p in lab_processes(fattree) if p.startswith("svscan ")]) == 16  # none started twice


@pytest.mark.parametrize("algorithm", ["ring", "halving-doubling"])
def test_a_collective_runs_on_the_deployed_agents(fattree, deployed, algorithm):
    tensors = workloads.model_tensors("resnet50", 0.01)
    ctx = Context(16, fattree.topology, tuple(e.node for e in deployed.endpoints))
    result = driver.run(deployed.endpoints, algorithm, tensors, workloads.emulated(tensors), iterations=2, ctx=ctx)
    assert all(r["verified"] for r in result.records())


def test_a_killed_agent_is_restarted(fattree, deployed):
    endpoint = deployed.endpoints[3]
    service = supervision.server_dir(fattree, endpoint.node) / "agent" / "service"
    status = os.popen(f"svstat {service}").read()
    pid = int(re.search(r"\(pid (\d+)\)", status).group(1))
    killed = time.monotonic()
    os.kill(pid, 9)
    while health(endpoint.control) != "SERVING" or time.monotonic() - killed < 0.3:
        assert time.monotonic() - killed < 10, "the agent did not come back within 10 s"
        time.sleep(0.05)
    assert int(re.search(r"\(pid (\d+)\)", os.popen(f"svstat {service}").read()).group(1)) != pid


def test_undeploy_leaves_no_process_and_a_redeploy_works(fattree, deployed):
    undeploy(fattree)
    assert {health(e.control) for e in deployed.endpoints} == {"UNAVAILABLE"}
    time.sleep(0.5)
    assert lab_processes(fattree) == []
    assert sum(undeploy(fattree).changed.values()) == 0
    deploy(fattree, servers=["p0e0h0", "p0e0h1"])
    assert health(deployed.endpoints[0].control) == "SERVING"


def test_lab_down_stops_deployed_agents(make_lab):
    lab = make_lab("star,2", name="dep-down", **{"servers.runtime": "netns"})
    deployment = deploy(lab)
    assert {health(e.control) for e in deployment.endpoints} == {"SERVING"}
    state_dir = lab.state.dir
    lab.down()
    assert [p for p in lab_processes(lab) if str(state_dir) in p] == []
