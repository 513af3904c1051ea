"""deploy refuses, at once and in one line, servers whose agents cannot answer: paused or
crashed by a fault (the lab's journal), or with stopped agent processes. Without a lab: a
fake lab's journal, and real stopped processes of this test's own."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import orchestrator.deploy as deploy_module
from orchestrator.deploy import answering, deploy
from orchestrator.emulation.runtimes import RUNTIMES
from orchestrator.errors import DeployError
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab


class FakeLab:
    """What deploy and answering read of a lab: its topology, plan and fault journal."""

    def __init__(self, tmp_path: Path, faults: list[dict]) -> None:
        self.name = "fake"
        self.topology = from_lab(lab_from_argument("star,3"))
        self.plan = SimpleNamespace(runtime="netns", topology=self.topology, namespaces={
            n: f"tb-no-such-namespace-{n}" for n in self.topology.nodes})  # no namespace: no processes
        self.state = SimpleNamespace(dir=tmp_path, active_faults=lambda: faults)

    def check_node(self, name: str) -> None:
        assert name in self.topology.nodes

    def runtime_of(self, name: str):
        return RUNTIMES["netns"]


def fault(fault_id: str, action: str, target: str) -> dict:
    return {"id": fault_id, "action": action, "target": target, "params": {}, "planned": 1.0, "applied": 1.0,
            "undone": None}


class Deployer:
    """Records whether deploy got as far as starting anything."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []

    def start(self, lab, servers, progress, extravars=None, forks=0):
        self.started.append(servers)
        raise AssertionError("deploy started agents on a server that cannot answer")


@pytest.fixture
def deployer(monkeypatch) -> Deployer:
    recorder = Deployer()
    monkeypatch.setattr(deploy_module, "_deployer", lambda via: recorder)
    return recorder


def test_deploy_refuses_a_paused_server_before_starting_anything(tmp_path, deployer):
    # Regression: `deploy --servers h1` on a server paused with nothing running said "1 agent
    # healthy": the pause froze the processes of its moment, deploy started fresh ones.
    lab = FakeLab(tmp_path, [fault("ab12cd", "server-pause", "h1")])
    started = time.monotonic()
    with pytest.raises(DeployError) as caught:
        deploy(lab, servers=["h1"])
    assert time.monotonic() - started < 2
    assert str(caught.value) == ("lab fake: h1 does not answer: it is paused (fault ab12cd, server-pause): resume it "
                                 "with `testbed fault fake heal ab12cd`, then deploy again")
    assert deployer.started == []


def test_a_crashed_server_is_named_with_its_restart_and_the_others_counted(tmp_path, deployer):
    faults = [fault("0000aa", "link-down", "h0-sw"), fault("0000bb", "server-crash", "h2"),
              fault("0000cc", "server-pause", "h1")]
    with pytest.raises(DeployError) as caught:
        deploy(FakeLab(tmp_path, faults))
    text = str(caught.value)
    assert text.startswith("lab fake: h1 does not answer (nor do h2): it is paused (fault 0000cc"), text
    assert "\n" not in text and deployer.started == []
    with pytest.raises(DeployError, match=r"h2 does not answer: it is crashed \(fault 0000bb, server-crash\): start "
                                          r"it with `testbed fault fake server-restart h2`"):
        deploy(FakeLab(tmp_path, faults), servers=["h0", "h2"])


def test_faults_that_leave_a_server_answering_do_not_stop_a_deploy(tmp_path):
    lab = FakeLab(tmp_path, [fault("0000aa", "link-down", "h0-sw"), fault("0000bb", "partition", "h0,h1")])
    answering.refuse_unanswering(lab, ["h0", "h1", "h2"])  # nothing raised


def _state(pid: int) -> str:
    return answering.process_state(pid)[0]


def _until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture
def sleeper():
    """A process of this test's own, in a session of its own, with `testbed-agent` among its
    arguments (as an agent's command line has)."""
    procs = []

    def start(*marker: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *marker],
                                start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_stopped_agent_processes_are_found_by_command_line_or_svscan_group(sleeper):
    agent, other = sleeper("testbed-agent"), sleeper()
    for proc in (agent, other):
        proc.send_signal(signal.SIGSTOP)
    _until(lambda: _state(agent.pid) == "T" and _state(other.pid) == "T", "SIGSTOP did not stop them")
    assert answering.process_state(agent.pid)[1] == agent.pid  # its own group: start_new_session
    assert answering.stopped_agents([agent.pid, other.pid], svscan=None) == [agent.pid]  # not any stopped process
    assert answering.stopped_agents([other.pid], svscan=other.pid) == [other.pid]  # svscan's group: the agents'
    for proc in (agent, other):
        proc.send_signal(signal.SIGCONT)
    _until(lambda: _state(agent.pid) != "T" and _state(other.pid) != "T", "SIGCONT did not resume them")
    assert answering.stopped_agents([agent.pid, other.pid], svscan=other.pid) == []


def test_a_process_that_is_gone_is_no_stopped_agent(sleeper):
    proc = sleeper("testbed-agent")
    proc.kill()
    proc.wait()
    assert answering.process_state(proc.pid) is None
    assert answering.stopped_agents([proc.pid], svscan=proc.pid) == []
