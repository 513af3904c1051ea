"""Agents deployed with Ansible on a Docker lab (bcube,4,1): playbooks/deploy.yml through the
testbed_nsenter connection, supervised by daemontools, healthy by the standard gRPC check,
idempotent, collectives on them, a broken host named, undeployed; and the SSH path: the same
playbook over SSH through the management network to servers running sshd."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.collectives.context import Context
from orchestrator.deploy import deploy, undeploy
from orchestrator.deploy.agents import data_addresses
from orchestrator.deploy.playbook import PROJECT
from orchestrator.emulation import docker_engine
from orchestrator.errors import DeployError
from orchestrator.deploy import lab_agents

from orchestrator.control import driver, workloads

AGENT_HOME = "/etc/testbed/agent"
SERVICES = ("", "testbed.Control", "testbed.Data")


def health(address: str, service: str = "testbed.Control") -> str:
    """What grpc_health_probe would say, from the host (the orchestrator's side)."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            return exc.code().name


def in_server(lab, server: str, command: str) -> tuple[int, str]:
    code, output = docker_engine.exec_in(lab.plan.container_name(server), ["sh", "-c", command])
    return code, output.decode(errors="replace")


def run_collective(lab, endpoints, algorithm: str) -> None:
    tensors = workloads.model_tensors("resnet50", 0.01)
    ctx = Context(len(endpoints), lab.topology, tuple(e.node for e in endpoints))
    result = driver.run(endpoints, algorithm, tensors, workloads.emulated(tensors), iterations=2, ctx=ctx)
    assert all(r["verified"] for r in result.records())


@pytest.fixture(scope="module")
def bcube(make_module_lab):
    return make_module_lab("bcube,4,1", name="dep-bcube", **{"servers.runtime": "docker"})


@pytest.fixture(scope="module")
def make_module_lab():
    from orchestrator.emulation import Lab, cleanup
    from orchestrator.spec import lab_from_argument

    made = []

    def make(argument: str, **overrides):
        lab = Lab.up(lab_from_argument(argument, **overrides))
        made.append(lab.name)
        return lab

    yield make
    for name in made:
        cleanup.clean_lab(name)


@pytest.fixture(scope="module")
def deployed(bcube):
    return deploy(bcube)


def test_deploy_reports_every_host_changed_and_every_agent_serving(bcube, deployed):
    servers = [s.name for s in bcube.topology.servers]
    assert [e.node for e in deployed.endpoints] == servers
    assert deployed.result.status == "successful" and not deployed.result.failures
    assert sorted(h for h, n in deployed.result.changed.items() if n) == sorted(servers)
    for endpoint in deployed.endpoints:
        assert {service: health(endpoint.control, service) for service in SERVICES} == dict.fromkeys(SERVICES, "SERVING")


def test_a_second_deploy_changes_nothing(bcube, deployed):
    again = deploy(bcube)
    assert sorted(again.result.ok) == sorted(s.name for s in bcube.topology.servers)
    assert sum(again.result.changed.values()) == 0, again.result.changed
    assert "changed=0" in again.result.stdout.read_text()


@pytest.mark.parametrize("algorithm", ["ring", "hips"])
def test_a_collective_runs_on_the_deployed_agents(bcube, deployed, algorithm):
    run_collective(bcube, deployed.endpoints, algorithm)


def test_the_agent_runs_under_supervise_in_the_container_with_a_private_token(bcube, deployed):
    code, tree = in_server(bcube, "h12", "ps -o ppid=,pid=,args= -e")
    processes = {int(line.split()[1]): (int(line.split()[0]), line.split(None, 2)[2]) for line in tree.splitlines()}
    agent = next(pid for pid, (_, args) in processes.items() if "testbed-agent --config" in args)
    supervise = processes[agent][0]
    assert processes[supervise][1] == "supervise testbed-agent"
    assert processes[processes[supervise][0]][1] == "svscan /etc/service"  # started by the image's entry point
    assert in_server(bcube, "h12", f"stat -c %a {AGENT_HOME}/token") == (0, "600\n")
    token = deployed.endpoints[[e.node for e in deployed.endpoints].index("h12")].token
    assert in_server(bcube, "h12", f"cat {AGENT_HOME}/token")[1].strip() == token
    assert token not in in_server(bcube, "h12", f"cat /proc/{agent}/cmdline")[1]


def test_no_token_reaches_ansibles_logs_or_the_inventory(bcube, deployed):
    deploy_dir = bcube.state.dir / "deploy"
    written = "".join(p.read_text(errors="replace") for p in deploy_dir.rglob("*") if p.is_file() and "ssh" not in p.parts)
    assert written and all(e.token not in written for e in deployed.endpoints)


def test_a_killed_agent_is_restarted_by_its_supervisor(bcube, deployed):
    endpoint = deployed.endpoints[5]
    _, status = in_server(bcube, endpoint.node, f"svstat {AGENT_HOME}/service")
    pid = re.search(r"\(pid (\d+)\)", status).group(1)
    killed = time.monotonic()
    in_server(bcube, endpoint.node, f"kill -9 {pid}")
    while health(endpoint.control) == "SERVING" and time.monotonic() - killed < 5:
        time.sleep(0.02)
    while health(endpoint.control) != "SERVING":
        assert time.monotonic() - killed < 10, "the agent did not come back within 10 s"
        time.sleep(0.05)
    print(f"agent of {endpoint.node} SERVING again {time.monotonic() - killed:.2f} s after kill -9")
    assert re.search(r"\(pid (\d+)\)", in_server(bcube, endpoint.node, f"svstat {AGENT_HOME}/service")[1]).group(1) != pid
    driver.wait_healthy([endpoint], timeout=10)


def test_the_lab_inventory_lists_every_server_with_its_vars(bcube, deployed, tmp_path):
    inventory = tmp_path / "lab.ini"
    inventory.write_text(subprocess.run([sys.executable, "-m", "orchestrator.cli", "inventory", bcube.name, "--format", "ini"],
                                        check=True, capture_output=True, text=True).stdout)
    listed = subprocess.run([Path(sys.executable).parent / "ansible-inventory", "-i", str(inventory), "--list"],
                            check=True, capture_output=True, text=True, cwd=PROJECT / "playbooks",
                            env={"ANSIBLE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    document = json.loads(listed.stdout)
    assert sorted(document["_meta"]["hostvars"]) == sorted(s.name for s in bcube.topology.servers)
    h13 = document["_meta"]["hostvars"]["h13"]
    assert h13["mgmt_address"] == str(bcube.mgmt_address("h13")) and h13["testbed_container"] == "testbed-dep-bcube-h13"
    assert document["l1s3"]["hosts"] == ["h03", "h13", "h23", "h33"]


def test_undeploy_stops_and_removes_every_agent_and_a_second_changes_nothing(bcube, deployed):
    result = undeploy(bcube)
    assert sorted(h for h, n in result.changed.items() if n) == sorted(s.name for s in bcube.topology.servers)
    for endpoint in deployed.endpoints:
        assert health(endpoint.control) == "UNAVAILABLE"
    assert in_server(bcube, "h00", f"ls /etc/service; test -e {AGENT_HOME} || echo gone") == (0, "gone\n")
    assert in_server(bcube, "h00", "pgrep -f '[t]estbed-agent' || echo none") == (0, "none\n")
    assert sum(undeploy(bcube).changed.values()) == 0


def test_a_broken_host_is_named_with_its_task_and_the_others_stay_up(bcube):
    """After undeploy: h01 lacks the agent, something else holds h02's Control port."""
    in_server(bcube, "h01", "rm /opt/testbed/bin/testbed-agent")
    listener = subprocess.Popen(bcube.command_prefix("h02") + [
        sys.executable, "-c", f"import socket,time; s=socket.socket(); s.bind(('{bcube.mgmt_address('h02')}', 7000)); "
                              "s.listen(); time.sleep(600)"], start_new_session=True)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        with pytest.raises(DeployError) as failed:
            deploy(bcube, progress=lambda *_: None)
        message = str(failed.value)
        assert message.startswith("h01: task 'configure the agent and keep it under supervision' failed: "
                                  "/opt/testbed/bin/testbed-agent is missing: "), message
        log = Path(message.rsplit("full log: ", 1)[1])
        assert "(and 1 more host)" in message and log.is_file()
        assert time.monotonic() - started < 30  # h02 gave up on its log's refusal, not after the timeout
        assert re.search(r"h02.*not SERVING after \d+ s .*: its log ends: testbed-agent: cannot listen on "
                         + re.escape(f"{bcube.mgmt_address('h02')}:7000: the address is missing or the port is taken"),
                         log.read_text())
        others = [e for e in lab_agents.endpoints(bcube) if e.node not in ("h01", "h02")]
        driver.wait_healthy(others, timeout=20)
        assert len(others) == 14
    finally:
        listener.kill()
        listener.wait()


def test_a_container_restart_brings_the_supervised_agent_back(make_module_lab):
    lab = make_module_lab("star,2", name="dep-restart", **{"servers.runtime": "docker"})
    deploy(lab)
    subprocess.run(["docker", "restart", "-t", "1", lab.plan.container_name("h1")], check=True, capture_output=True)
    # A restarted container has a new, empty network namespace (the lab's wiring stays with the
    # old one): give the agent its addresses back on lo, then ask it from inside.
    address = lab.mgmt_address("h1")
    for ip in [address, *data_addresses(lab.topology, "h1")]:
        in_server(lab, "h1", f"ip addr add {ip}/32 dev lo")
    probe = (f"import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; "
             f"print(h.HealthCheckResponse.ServingStatus.Name(g.HealthStub(grpc.insecure_channel('{address}:7000'))"
             f".Check(h.HealthCheckRequest(service='testbed.Control'), timeout=2, wait_for_ready=True).status))")
    deadline = time.monotonic() + 20
    while True:
        code, output = in_server(lab, "h1", f"/opt/testbed/bin/python -c \"{probe}\" 2>&1")
        if output.strip().endswith("SERVING") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert output.strip().splitlines()[-1] == "SERVING", output
    _, tree = in_server(lab, "h1", "ps -o args= -e")
    assert "svscan /etc/service" in tree and "supervise testbed-agent" in tree


def test_the_same_playbook_deploys_over_ssh_and_a_ring_runs(make_module_lab, tmp_path):
    """sshd on every server (lab keys, no password), then deploy.yml over SSH to the management
    addresses, installing the agent from a wheel as on a machine without the lab image."""
    lab = make_module_lab("bcube,2,1", name="dep-ssh", **{"servers.runtime": "docker"})
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(PROJECT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("testbed-*.whl"))
    deployment = deploy(lab, via="ssh", extravars={"agent_install": "wheel", "agent_wheel": str(wheel)})
    assert deployment.result.status == "successful"
    for server in lab.topology.servers:
        _, log = in_server(lab, server.name, "cat /etc/testbed/sshd/sshd.log")
        assert re.search(r"Accepted publickey for root from \S+ port \d+ ssh2: ED25519", log), log
        assert in_server(lab, server.name, "ls /opt/testbed/wheels/")[1].strip() == wheel.name
    keys = lab.state.dir / "deploy" / "ssh"
    assert oct((keys / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    assert "ssh_host" not in in_server(lab, "h00", "ls /etc/ssh")[1]  # the image carries no host key
    inventory = (lab.state.dir / "deploy" / "inventory-ssh.yaml").read_text()
    assert "ansible_connection: ssh" in inventory and "StrictHostKeyChecking=yes" in inventory
    run_collective(lab, deployment.endpoints, "ring")
    again = deploy(lab, via="ssh", extravars={"agent_install": "wheel", "agent_wheel": str(wheel)})
    assert sum(again.result.changed.values()) == 0, again.result.changed
