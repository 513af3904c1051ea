"""On fattree,4 the prediction beside a run follows the paths its connections were hashed
onto: `Lab.connection_paths` reads them off the live routers (each hop asked with the
connection's 5-tuple) and the driver predicts over them; the routers' interface counters
show the packets took them."""

from __future__ import annotations

import json
import subprocess

from orchestrator.agent import transports
from orchestrator.collectives.context import Context
from orchestrator.cost import Network
from orchestrator.deploy import lab_agents

from orchestrator.control import driver, workloads
from tests.unit.test_flow_paths import BIGRAPH_RING as UNIT_BIGRAPH_RING

ELEMENTS = 250_000  # 1 MB
PORT = transports.data_port(transports.DEFAULT, lab_agents.DATA_PORT)  # where the run's data connections go
ITERATIONS = 2


def test_a_mesh_is_predicted_over_the_paths_its_connections_took(make_lab):
    lab = make_lab("fattree,4", name="paths", **{"servers.runtime": "netns", "links.bandwidth": "100Mbit"})
    topology = lab.topology
    read = lab_agents.flow_paths(lab)
    seen: dict = {}

    def recorded() -> dict:
        seen.update(read())
        return seen

    endpoints = lab_agents.start(lab, via="exec")
    try:
        ctx = Context(len(endpoints), topology, tuple(e.node for e in endpoints))
        before = _switch_link_bytes(lab)
        result = driver.run(endpoints, "mesh", [ELEMENTS], workloads.emulated([ELEMENTS]), iterations=ITERATIONS,
                            ctx=ctx, network=Network.from_links(lab.spec.links), flow_paths=recorded)
        after = _switch_link_bytes(lab)
        assert all(r["verified"] for r in result.records())
        # one connection from every server to every other, each on one of its ECMP branches
        servers = [s.name for s in topology.servers]
        assert {(src, topology.address_of(dst)) for src in servers for dst in servers if src != dst} == set(seen)
        for (src, address), path in seen.items():
            assert path in topology.paths(src, address), (src, address, path)
        # the routers' own answer, by iproute2, agrees at every edge switch crossed upwards
        checked = 0
        for (src, address), path in seen.items():
            if len(path) < 5 or checked == 30:
                continue  # same edge switch: no choice to check
            [sport] = [port for _, port, remote, _ in _connections(lab, src) if remote == address]
            answer = subprocess.run(
                ["ip", "-j", "-n", lab.plan.namespaces[path[1]], "route", "get", str(address), "from",
                 str(topology.address_of(src)), "iif", "br0", "ipproto", "tcp", "sport", str(sport), "dport",
                 str(PORT)], capture_output=True, text=True, check=True)
            assert topology.owner(json.loads(answer.stdout)[0]["gateway"]).node == path[2]
            checked += 1
        assert checked == 30
    finally:
        lab_agents.stop(endpoints)
    # predicted over exactly those paths: each connection carries its two mesh transfers of
    # S/16 (62,500 B) along its own path, and nothing else crosses a link
    per_connection = 2 * ELEMENTS // 16 * 4
    expected: dict[str, int] = {}
    for path in seen.values():
        for a, b in zip(path, path[1:]):
            expected[f"{a}→{b}"] = expected.get(f"{a}→{b}", 0) + per_connection
    assert result.predicted.link_bytes == expected
    # and the packets went that way: every link between two switches sent what the paths put
    # on it (plus headers and the ACKs of the flows the other way). A router that hashed on
    # something a route lookup cannot see (policy 1 hashes a forwarded packet's socket hash)
    # sends them elsewhere: links a third over or under, some idle.
    for hop, sent in after.items():
        a, b = hop.split("→")
        forward, back = (ITERATIONS * expected.get(h, 0) for h in (hop, f"{b}→{a}"))
        # frames are 1514 B per 1448 B of payload; ACKs 66 B per one or two segments the other way
        assert forward <= sent - before[hop] <= 1.07 * forward + 0.08 * back + 20_000, (hop, sent - before[hop], forward)


def _switch_link_bytes(lab) -> dict[str, int]:
    """{"a→b": bytes a has sent to b} for every link between two switches, from the lab's
    status (a veth end receives what its peer sent)."""
    switches = {s.name for s in lab.topology.switches}
    sent = {}
    for link in lab.status()["links"]:
        if {link["a"], link["b"]} <= switches:
            sent[f"{link['a']}→{link['b']}"] = link["tx_bytes"]
            sent[f"{link['b']}→{link['a']}"] = link["rx_bytes"]
    return sent


def _connections(lab, server: str):
    from orchestrator.emulation import kernel

    space = lab.plan.namespaces[server]
    return kernel.in_namespaces([space], lambda _: kernel.tcp_connections(PORT))[space]


# the unit test's experiment (ring on bigraph 4×2, 100 Mbit), swept over two sizes
BIGRAPH_RING = UNIT_BIGRAPH_RING + """\
warmup: 1
sweep:
  sizes: [1MB, 4MB]
monitoring: false
"""


def test_testbed_run_predicts_each_point_over_the_paths_its_connections_hashed_onto(tmp_path):
    """`testbed run` on BiGraph (ECMP between servers of one half): each point's prediction,
    the one its ratio and verdict hold the run against, is over the paths the connections
    took, not the plan's even spread (kept as planned_seconds). The switches' counters show
    it: every link direction between switches carried what that prediction put on it. Under
    the even spread, half of each same-half flow would be predicted on each branch; the
    packets take one (before the fix, the ready bigraph-hdrm ring at 4 MiB read 2.015 ×,
    "model off", from two connections hashed onto one link)."""
    import os
    import sys
    from pathlib import Path

    from orchestrator.emulation import cleanup

    experiment = tmp_path / "hashed.yaml"
    experiment.write_text(BIGRAPH_RING)
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(experiment), "--out",
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"})
    finally:
        cleanup.clean_lab("ex-hashed")
    assert done.returncode == 0, done.stderr[-2000:]
    points = json.loads((tmp_path / "out" / "results.json").read_text())["points"]
    assert [p["status"] for p in points] == ["done", "done"]
    upper, lower = ("su0", "su1"), ("sl0", "sl1")
    switches = {*upper, *lower}
    for point in points:
        predicted = point["predicted"]
        assert predicted["routes"] == "hashed" and predicted["planned_seconds"] > 0, predicted
        per_allreduce = point["bytes_per_link"]["predicted_per_allreduce"]
        assert per_allreduce == predicted["link_bytes"]
        measured = point["bytes_per_link"]["measured"]
        assert any(set(hop.split("→")) <= switches for hop in measured)
        for hop in [f"{a}→{b}" for a in upper for b in lower] + [f"{b}→{a}" for a in upper for b in lower]:
            a, b = hop.split("→")
            sent = measured.get(hop, 0)  # (a link nothing crossed is left out)
            forward, back = (point["iterations"] * per_allreduce.get(h, 0) for h in (hop, f"{b}→{a}"))
            assert forward <= sent <= 1.07 * forward + 0.08 * back + 50_000, (point["id"], hop, sent, forward)
    assert "| hashed |" in (tmp_path / "out" / "summary.md").read_text()
