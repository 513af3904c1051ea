"""Server runtimes live in one table (emulation/runtimes.py): the built-ins and a plugin's
register the same way, a taken name is refused in one line, a lab's servers run in the
runtime it names while its switches stay in netns, and nothing branches on docker-vs-netns
any more. No lab is built: a plan is pure, and a Lab object is only its spec, plan and state."""

from __future__ import annotations

import ast
import ipaddress
from pathlib import Path

import pytest

from orchestrator.emulation.journal import LabState
from orchestrator.emulation.lab import Lab
from orchestrator.emulation.plan import LabPlan
from orchestrator.emulation.runtimes import (RUNTIMES, DockerRuntime, ExecResult, NetnsRuntime, by_runtime, runtime_of, server_runtime,
                                             register_runtime)
from orchestrator.errors import EmulationError, PluginError
from orchestrator.spec import lab_from_argument
from tests.unit.conftest import make_topology

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
SUBNET = ipaddress.IPv4Network("198.18.4.0/24")


class FakeRuntime(NetnsRuntime):
    """A plugin's runtime: records what the lab asked of it, touches nothing."""

    name = "fake"

    def __init__(self) -> None:
        self.ran: list[tuple[str, list[str]]] = []

    def exec(self, lab, node, argv, timeout=None) -> ExecResult:
        self.ran.append((node, argv))
        return ExecResult(0, f"ran on {node}")


@pytest.fixture
def fake():
    runtime = FakeRuntime()
    register_runtime("fake", runtime)
    yield runtime
    del RUNTIMES["fake"]


def test_the_table_holds_the_two_built_ins_under_their_names():
    assert list(RUNTIMES)[:2] == ["netns", "docker"]
    assert isinstance(RUNTIMES["netns"], NetnsRuntime) and isinstance(RUNTIMES["docker"], DockerRuntime)
    assert {name: RUNTIMES[name].name for name in ("netns", "docker")} == {"netns": "netns", "docker": "docker"}
    assert (RUNTIMES["netns"].containerised, RUNTIMES["docker"].containerised) == (False, True)


def test_a_taken_name_is_refused_in_one_line_and_the_table_is_unchanged():
    before = dict(RUNTIMES)
    with pytest.raises(PluginError) as caught:
        register_runtime("docker", FakeRuntime())
    assert str(caught.value) == "server runtime docker is registered already: give yours another name"
    assert RUNTIMES == before


def test_a_registered_runtime_runs_the_servers_and_the_switches_stay_in_netns(fake):
    topology = make_topology("star", servers=3)
    plan = LabPlan("rt", topology, "fake", SUBNET)
    servers = [s.name for s in topology.servers]
    switches = [n for n in topology.nodes if n not in servers]
    assert switches, "a star has a switch"
    assert server_runtime(plan) is fake
    assert all(runtime_of(plan, s) is fake for s in servers)
    assert all(runtime_of(plan, s) is RUNTIMES["netns"] for s in switches)
    # grouped as bring-up makes them: the table's order, netns (the switches) first
    assert by_runtime(plan, topology.nodes) == [(RUNTIMES["netns"], switches), (fake, servers)]


def test_a_labs_exec_goes_through_its_servers_runtime(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    spec = lab_from_argument("star,2", name="rt")
    lab = Lab(spec, LabPlan(spec.name, make_topology("star", servers=2), "fake", SUBNET), LabState(spec.name))
    server = lab.topology.servers[0].name
    assert lab.exec(server, "echo hi") == ExecResult(0, f"ran on {server}")
    assert fake.ran == [(server, ["sh", "-c", "echo hi"])]


def test_an_unknown_runtime_is_one_line():
    plan = LabPlan("rt", make_topology("star", servers=2), "nosuch", SUBNET)
    with pytest.raises(EmulationError) as caught:
        runtime_of(plan, plan.topology.servers[0].name)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("no server runtime 'nosuch': one of netns")


def test_no_module_branches_on_in_container():
    # the runtime object answers (runtimes.runtime_of); a docker-vs-netns branch is what it replaced
    calls = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if (isinstance(node, ast.Attribute) and node.attr == "in_container")
             or (isinstance(node, ast.Name) and node.id == "in_container")
             or (isinstance(node, ast.FunctionDef) and node.name == "in_container")]
    assert not calls, f"in_container is gone, ask plan.runtime_of(node): {calls}"
