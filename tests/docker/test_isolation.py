"""Isolation probes from inside a lab: a server, root in its own network namespace with
NET_ADMIN (as Docker servers are), tries every way it has to another server's Control and
metrics and to the host. Where one filter alone stops a probe, the probe is also shown to
connect once that filter is taken away, or the filter's drop counter to rise (forwarding,
which Docker's FORWARD policy would drop too), so a probe failing for another reason is
caught. Both runtimes: the filters do not depend on Docker."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import grpc
import pytest

from orchestrator.agent import auth
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc
from orchestrator.emulation import isolation, kernel, nft
from orchestrator.deploy import lab_agents

from orchestrator.control import driver, workloads

ATTACKER, TARGET, RELAY = "h00", "h01", "h10"  # bcube,2,1: h01 is h00's level-0 peer, h10 its level-1 peer
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except socket.timeout:
    print("timeout")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module", params=["docker", "netns"])
def lab(request):
    from orchestrator.emulation import Lab, cleanup
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument("bcube,2,1", name=f"iso-{request.param}", **{"servers.runtime": request.param})
    lab = Lab.up(spec)
    try:
        yield lab
    finally:
        cleanup.clean_lab(spec.name)


@pytest.fixture(scope="module")
def agents(lab) -> list[driver.Endpoint]:
    return lab_agents.start(lab)  # stopped with the lab


def _connect(lab, node: str, address, port: int, timeout: float = 1.5) -> str:
    """What a process on `node` gets connecting to address:port: open | timeout | an errno name."""
    result = lab.exec(node, ["python3", "-c", PROBE, str(address), str(port), str(timeout)])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def _sh(lab, node: str, command: str) -> None:
    result = lab.exec(node, command)
    assert result.returncode == 0, (command, result.stdout, result.stderr)


def _fabric_address(lab, node: str, level: int) -> ipaddress.IPv4Address:
    return next(nic.address.ip for nic in lab.topology.node(node).data_nics() if nic.level == level)


@contextmanager
def _without_server_filter(lab, server: str) -> Iterator[None]:
    namespace = lab.plan.namespaces[server]
    kernel.in_namespaces([namespace], lambda ns: nft.run(f"delete table inet {isolation.SERVER_TABLE}", ns))
    try:
        yield
    finally:
        rules = isolation.server_ruleset(lab.mgmt_address(server), lab.plan.mgmt_gateway.ip)
        kernel.in_namespaces([namespace], lambda ns: nft.run(rules, ns))


@contextmanager
def _without_root_table(lab) -> Iterator[None]:
    table = isolation.root_table(lab.plan.id)
    nft.run(f"delete table inet {table}")
    try:
        yield
    finally:
        nft.run(isolation.root_ruleset(lab.plan.id))


def _dropped(lab, hook: str) -> int:
    """Packets the lab's root table has dropped in `hook`, read with the nft command."""
    listing = subprocess.run(["nft", "-j", "list", "table", "inet", isolation.root_table(lab.plan.id)],
                             capture_output=True, text=True, check=True).stdout
    total = 0
    for item in json.loads(listing)["nftables"]:
        rule = item.get("rule")
        if rule and rule["chain"] == hook:
            total += sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
    return total


ROUTES = {
    "via the target's fabric address": "ip route replace {mgmt}/32 via {peer} dev h00-eth0",
    "on-link out of a fabric NIC": "ip route replace {mgmt}/32 dev h00-eth0",
    "via a forwarding peer": "ip route replace {mgmt}/32 via {relay} dev h00-eth1",
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_server_cannot_reach_another_servers_control_or_metrics_whatever_route_it_adds(lab, agents, route):
    mgmt = lab.mgmt_address(TARGET)
    command = ROUTES[route].format(mgmt=mgmt, peer=_fabric_address(lab, TARGET, 0), relay=_fabric_address(lab, RELAY, 1))
    _sh(lab, ATTACKER, command)
    try:
        for port in (lab_agents.CONTROL_PORT, lab_agents.METRICS_PORT):
            assert _connect(lab, ATTACKER, mgmt, port) != "open", (route, port)
        if route != "via a forwarding peer":  # the relay never forwards to mgmt0, and the bridge isolates ports too
            with _without_server_filter(lab, TARGET):
                assert _connect(lab, ATTACKER, mgmt, lab_agents.CONTROL_PORT) == "open", route
    finally:
        _sh(lab, ATTACKER, f"ip route del {mgmt}/32")
    # and straight over the management network, as before any route was added
    assert _connect(lab, ATTACKER, mgmt, lab_agents.CONTROL_PORT) != "open"


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A throw-away TCP service in the root namespace, bound to 0.0.0.0: its port."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_server_cannot_reach_a_host_service_through_the_management_gateway(lab, host_listener):
    gateway = lab.plan.mgmt_gateway.ip
    before = _dropped(lab, "input")
    assert _connect(lab, ATTACKER, gateway, host_listener) != "open"
    assert _dropped(lab, "input") > before
    with _without_root_table(lab):
        assert _connect(lab, ATTACKER, gateway, host_listener) == "open"


@pytest.fixture
def other_host_network() -> Iterator[tuple[str, int, int]]:
    """A host network behind the gateway that is not the lab's: a namespace on a veth from the
    root namespace (root end 198.51.100.1, far end 198.51.100.2), a listener on each end.
    Yields (prefix, port in the root namespace, port in the namespace)."""
    network = ipaddress.IPv4Network("198.51.100.0/24")
    if any(network.overlaps(n) for n in kernel.root_networks()):
        pytest.skip(f"{network} is in use on this host")
    namespace, root_end = "isoprobe-net", "isoprobe0"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        for command in (
            ["ip", "link", "add", root_end, "type", "veth", "peer", "name", "eth0", "netns", namespace],
            ["ip", "addr", "add", "198.51.100.1/24", "dev", root_end],
            ["ip", "link", "set", root_end, "up"],
            ["ip", "-n", namespace, "addr", "add", "198.51.100.2/24", "dev", "eth0"],
            ["ip", "-n", namespace, "link", "set", "eth0", "up"],
            ["ip", "-n", namespace, "route", "add", "default", "via", "198.51.100.1"],
        ):
            subprocess.run(command, check=True)

        def listen(_: str) -> socket.socket:
            listener = socket.socket()
            listener.bind(("0.0.0.0", 0))
            listener.listen(8)
            return listener

        inside = kernel.in_namespaces([namespace], listen)[namespace]
        with inside, listen("root") as outside:
            yield str(network), outside.getsockname()[1], inside.getsockname()[1]
    finally:
        subprocess.run(["ip", "link", "del", root_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def test_a_server_cannot_reach_other_host_networks_through_the_gateway(lab, other_host_network):
    prefix, root_port, inside_port = other_host_network
    _sh(lab, ATTACKER, f"ip route replace {prefix} via {lab.plan.mgmt_gateway.ip} dev mgmt0")
    try:
        before = _dropped(lab, "forward")
        assert _connect(lab, ATTACKER, "198.51.100.1", root_port) != "open"  # a host address: input
        assert _connect(lab, ATTACKER, "198.51.100.2", inside_port) != "open"  # behind the host: forward
        if open("/proc/sys/net/ipv4/ip_forward").read().strip() == "1":  # else the host forwards nothing anyway
            # the lab's own table dropped it, not (only) Docker's FORWARD policy, which runs after it
            assert _dropped(lab, "forward") > before
    finally:
        _sh(lab, ATTACKER, f"ip route del {prefix}")


def test_the_orchestrator_still_reaches_every_agents_control_and_metrics(lab, agents):
    driver.wait_healthy(agents, timeout=10)
    tensors = [20_000]
    result = driver.run(agents, "ring", tensors, workloads.emulated(tensors), iterations=1)
    assert all(r["verified"] for r in result.records())
    for server in lab.topology.servers:  # as Prometheus scrapes them, from the host
        url = f"http://{lab.mgmt_address(server.name)}:{lab_agents.METRICS_PORT}/metrics"
        assert "testbed_gst_seconds" in urllib.request.urlopen(url, timeout=5).read().decode()


def test_control_refuses_calls_without_the_agents_token_and_the_agent_keeps_running(agents):
    target = next(e for e in agents if e.node == TARGET)
    other = next(e for e in agents if e.node == ATTACKER)
    with grpc.insecure_channel(target.control) as channel:
        stub = pb_grpc.ControlStub(channel)
        for metadata in ((), auth.metadata("guessed"), auth.metadata(other.token)):  # another server's token too
            with pytest.raises(grpc.RpcError) as refused:
                stub.Shutdown(pb.Empty(), metadata=metadata, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Health(pb.Empty(), metadata=auth.metadata(target.token), timeout=5).node == TARGET
    with pytest.raises(driver.RunError, match="refused the orchestrator's token"):
        driver.wait_healthy([replace(target, token=other.token)], timeout=10)


def test_the_labs_tokens_live_in_its_state_directory_privately(lab, agents):
    path = lab.state.dir / "token"
    assert path.stat().st_mode & 0o777 == 0o600
    secret = lab_agents.lab_secret(lab.state.dir)
    assert [e.token for e in agents] == [lab_agents.agent_token(secret, e.node) for e in agents]


def test_the_root_table_is_journalled_and_goes_with_the_lab(make_lab):
    from orchestrator.emulation import cleanup

    lab = make_lab("star,2", name="iso-clean")
    table = isolation.root_table(lab.plan.id)
    assert table in isolation.root_tables()
    assert [(e.kind, e.name) for e in lab.state.journal() if e.kind == "nft_table"] == [("nft_table", table)]
    assert cleanup.clean_lab(lab.name).get("nft tables") == 1
    assert table not in isolation.root_tables()
    assert "nft tables" not in cleanup.clean_lab(lab.name)  # twice is safe


def test_the_orphan_sweep_removes_lab_tables_only():
    """What `clean --all` runs, in a scratch namespace (the host's tables belong to live labs)."""
    namespace = "isoprobe-sweep"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        def sweep(ns: str) -> tuple[int, list[str]]:
            for lab in ("abcdef", "123456"):
                nft.run(isolation.root_ruleset(lab), ns)
            nft.run("add table inet unrelated\nadd table ip testbed_abcdef\nadd table inet testbed_toolong1", ns)
            removed = isolation.delete_root_tables(keep={"testbed_123456"})
            return removed, sorted(nft.run("list tables", ns).splitlines())

        removed, left = kernel.in_namespaces([namespace], sweep)[namespace]
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    assert removed == 1
    assert left == ["table inet testbed_123456", "table inet testbed_toolong1", "table inet unrelated",
                    "table ip testbed_abcdef"]

