"""Predicting over the paths a run's connections took (ECMP hashed, not spread evenly):
the /proc table read, the route query kernel.py encodes, and the model's pinned paths."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate
from orchestrator.emulation import kernel
from tests.unit.conftest import make_topology

IP = ipaddress.IPv4Address

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0301030A:ED0E 0200000A:1B59 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1
   1: 0301030A:ED10 0200000A:1B59 06 00000000:00000000 03:00000706 00000000     0        0 0 3 0
   2: 0301030A:ED12 0200000A:1B58 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1
   3: 00000000:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr
   0: 0000000000000000FFFF00000301030A:ED20 0000000000000000FFFF00000200000A:1B59 01 00000000:00000000 00:0
   1: 00000000000000000000000001000000:ED22 00000000000000000000000001000000:1B59 01 00000000:00000000 00:0
"""


def test_the_tcp_tables_give_established_ipv4_connections_to_the_port():
    # 10.3.1.3:60686 → 10.0.0.2:7001 (state 01); TIME_WAIT, another port and a listener left out
    assert kernel.parse_tcp_table(TCP, 7001) == [(IP("10.3.1.3"), 0xED0E, IP("10.0.0.2"), 7001)]
    # an IPv4-mapped IPv6 socket counts; a real IPv6 one (::1) does not
    assert kernel.parse_tcp_table(TCP6, 7001) == [(IP("10.3.1.3"), 0xED20, IP("10.0.0.2"), 7001)]


def test_the_route_query_names_the_flow_as_ip_route_get_does():
    message = kernel.route_get_message(IP("10.0.0.2"), IP("10.3.1.3"), 7, 60686, 7001)
    decoded = rtmsg(message)
    decoded.decode()
    assert decoded["header"]["type"] == 26 and decoded["dst_len"] == 32 and decoded["src_len"] == 32
    assert decoded.get_attr("RTA_DST") == "10.0.0.2" and decoded.get_attr("RTA_SRC") == "10.3.1.3"
    assert decoded.get_attr("RTA_IIF") == 7
    tail = kernel.attributes(message, 28)
    assert tail[kernel.RTA_IP_PROTO] == bytes([6])  # TCP
    assert struct.unpack("!H", tail[kernel.RTA_SPORT])[0] == 60686
    assert struct.unpack("!H", tail[kernel.RTA_DPORT])[0] == 7001
    # sent from the namespace itself: no input interface
    assert kernel.RTA_IIF not in kernel.attributes(kernel.route_get_message(IP("10.0.0.2"), IP("10.3.1.3"), None, 1, 2), 28)


def across_pods(routes: Routes, pinned_core: dict[str, str]):
    """Two transfers from pod 0 to pod 1 at once, each pinned through the given core."""
    schedule = Schedule("by-hand", 4, 2000)
    schedule.add_step([Transfer(0, 2, 0, 1000, "reduce"), Transfer(1, 3, 1000, 1000, "reduce")])
    nodes = ["p0e0h0", "p0e1h0", "p1e0h0", "p1e1h0"]
    return simulate(routes, [(Partition(0, 2000, 0), schedule)], nodes, Network(32000, efficiency=1.0), 2**30)


def path(src: str, aggregation: str, core: str, far_aggregation: str, dst: str) -> list[str]:
    return [src, src[:4], aggregation, core, far_aggregation, dst[:4], dst]


def test_pinned_paths_replace_the_even_spread_and_show_a_collision():
    fattree = make_topology("fattree", k=4)
    src, dst = ("p0e0h0", "p0e1h0"), ("p1e0h0", "p1e1h0")
    address = {d: fattree.address_of(d) for d in dst}
    # spread evenly, the two transfers share no link fully: 4000 B each at 4000 B/s
    assert across_pods(Routes(fattree), {}).seconds == pytest.approx(1.0, rel=1e-9)
    # hashed onto one core (c0, by p0a0 and p1a0), they share every link from p0a0 to p1a0
    collided = Routes(fattree, {(src[0], address[dst[0]]): path(src[0], "p0a0", "c0", "p1a0", dst[0]),
                                (src[1], address[dst[1]]): path(src[1], "p0a0", "c0", "p1a0", dst[1])})
    usage, hops = collided.usage(src[0], dst[0])
    assert {str(collided.directions[i]) for i, _ in usage} == {
        "p0e0h0→p0e0", "p0e0→p0a0", "p0a0→c0", "c0→p1a0", "p1a0→p1e0", "p1e0→p1e0h0"}
    assert {share for _, share in usage} == {1.0} and hops == 6
    run = across_pods(collided, {})
    assert run.seconds == pytest.approx(2.0, rel=1e-9)
    assert {str(collided.directions[i]): b for i, b in enumerate(run.link_bytes) if b}["c0→p1a0"] == 8000
    # on two different cores, no link is shared: 1 s again
    apart = Routes(fattree, {(src[0], address[dst[0]]): path(src[0], "p0a0", "c0", "p1a0", dst[0]),
                             (src[1], address[dst[1]]): path(src[1], "p0a1", "c2", "p1a1", dst[1])})
    assert across_pods(apart, {}).seconds == pytest.approx(1.0, rel=1e-9)


def test_a_pinned_path_off_the_topology_is_refused():
    fattree = make_topology("fattree", k=4)
    routes = Routes(fattree, {("p0e0h0", fattree.address_of("p1e0h0")): ["p0e0h0", "p1e0h0"]})
    with pytest.raises(ValueError, match="crosses no link"):
        routes.usage("p0e0h0", "p1e0h0")


BIGRAPH_RING = """\
name: hashed
lab:
  name: ex-hashed
  topology: {kind: bigraph, switches: 4, servers_per_switch: 2}
  links: {bandwidth: 100Mbit}
  servers: {runtime: netns}
agents:
  algorithms: [ring]
  workload: {kind: back-to-back, size: 4MB}
iterations: 3
"""


def _bigraph_point(tmp_path):
    from orchestrator.experiment.plan import compiled_point, make_plan
    from orchestrator.spec.experiment import load_experiment

    source = tmp_path / "hashed.yaml"
    source.write_text(BIGRAPH_RING)
    spec = load_experiment(source)
    [planned] = make_plan(spec, "hashed.yaml").points
    return spec, planned, compiled_point(spec, planned)


def test_a_run_point_is_predicted_again_over_the_paths_its_connections_hashed_onto(tmp_path):
    """testbed run's point on an ECMP lab: the prediction its ratio is held against is over the
    paths the run's connections took (here pinned: every connection between servers of one half
    on the first of its two paths), with the plan's even spread kept as planned_seconds."""
    from dataclasses import replace

    from orchestrator.control.driver import RunResult
    from orchestrator.experiment.runner import _hashed_paths, _predict_over, point_entry

    spec, planned, compiled = _bigraph_point(tmp_path)
    topology = compiled.routes.topology
    nodes = list(compiled.nodes)
    pinned = {}
    for _, schedule in compiled.schedules:
        for _, t in schedule.transfers():
            src, address = nodes[t.src], topology.address_of(nodes[t.dst])
            pinned[(src, address)] = topology.paths(src, address)[0]
    hashed = replace(compiled, routes=Routes(topology, pinned))
    result = RunResult("r", "ring", [], planned.size_bytes, 1.0, compiled.prediction, compiled=hashed)
    assert _hashed_paths(result, planned) is hashed.routes
    # the plan's own routes (an even spread), no prediction, or a re-formed membership: none
    assert _hashed_paths(replace(result, compiled=compiled), planned) is None
    assert _hashed_paths(replace(result, predicted=None), planned) is None
    assert _hashed_paths(replace(result, history=[object(), object()]), planned) is None
    # a job run together with others keeps its prediction with every job's flows
    together = replace(planned, point=replace(planned.point, job="a", mode="together"))
    assert _hashed_paths(result, together) is None

    entry = point_entry(spec, planned)
    entry["bytes_per_link"] = {"predicted_per_allreduce": entry["predicted"]["link_bytes"]}
    even = entry["predicted"]["seconds"]
    _predict_over(spec, planned, hashed.routes, entry)
    predicted = entry["predicted"]
    assert predicted["routes"] == "hashed" and predicted["planned_seconds"] == even
    # each connection's bytes along its one pinned path, nothing spread over the other
    expected: dict[str, float] = {}
    for _, schedule in compiled.schedules:
        for _, t in schedule.transfers():
            path = pinned[(nodes[t.src], topology.address_of(nodes[t.dst]))]
            for a, b in zip(path, path[1:]):
                expected[f"{a}→{b}"] = expected.get(f"{a}→{b}", 0) + t.length * 4
    assert {k: v for k, v in predicted["link_bytes"].items() if v} == pytest.approx(expected)
    assert entry["bytes_per_link"]["predicted_per_allreduce"] == predicted["link_bytes"]
    assert {k: v for k, v in compiled.prediction.link_bytes.items() if v} != pytest.approx(expected)
    assert predicted["parts"]["bandwidth"] > 0  # attributed, as the plan's is
