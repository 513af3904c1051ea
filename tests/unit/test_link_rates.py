"""Links at rates of their own (issue 30, `links.overrides`): the cost model, the fair shares
the agents pace at and the prediction's bottleneck follow each link direction's rate."""

from __future__ import annotations

import pytest

from orchestrator.cost import Network
from orchestrator.cost.fairness import max_min_rates
from orchestrator.cost.compiled import build_schedules
from orchestrator.cost.report import predict_lab
from orchestrator.cost.routes import Routes
from orchestrator.cost.shares import fair_shares
from orchestrator.errors import SpecError, TopologyError
from orchestrator.spec import lab_from_argument
from orchestrator.spec.lab import LabSpec
from orchestrator.spec.loader import validate
from orchestrator import topology as topology_lib


def lab(argument: str, overrides: list[dict], rate: str = "100Mbit") -> LabSpec:
    data = lab_from_argument(argument, **{"links.bandwidth": rate}).model_dump(mode="json")
    data["links"]["overrides"] = overrides
    return validate(LabSpec, data, "lab.yaml")


def test_max_min_with_a_capacity_per_link_worked_by_hand():
    # link 0: 10, link 1: 4. A uses 0, B uses 0 and 1, C uses 1. Link 1 fills first at 2
    # (B and C), then A takes what is left of link 0: 10 − 2 = 8.
    assert max_min_rates([((0, 1.0),), ((0, 1.0), (1, 1.0)), ((1, 1.0),)], [10.0, 4.0]) == pytest.approx([8, 2, 2])
    assert max_min_rates([((0, 1.0),), ((0, 1.0), (1, 1.0)), ((1, 1.0),)], 4.0) == pytest.approx([2, 2, 2])


@pytest.mark.parametrize("written", ["h0-sw", "sw-h0"])
def test_a_slow_link_is_the_rings_bottleneck_and_doubles_its_time(written):
    uniform = predict_lab(lab("star,4", []), "ring", 4 << 20).prediction
    slow = predict_lab(lab("star,4", [{"link": written, "bandwidth": "50Mbit"}]), "ring", 4 << 20).prediction
    assert slow.seconds == pytest.approx(2 * uniform.seconds, rel=0.02)
    loads = {load.link: load for load in slow.bottlenecks()}
    assert set(loads) == {"h0→sw", "sw→h0"}  # the full ones: the slow link's two directions
    assert slow.parts is None or slow.parts["bandwidth"] == pytest.approx(slow.seconds, rel=0.05)


def test_a_faster_link_changes_nothing_the_others_bound():
    uniform = predict_lab(lab("star,4", []), "ring", 4 << 20).prediction
    fast = predict_lab(lab("star,4", [{"link": "h0-sw", "bandwidth": "1Gbit"}]), "ring", 4 << 20).prediction
    assert fast.seconds == pytest.approx(uniform.seconds, rel=0.01)


def test_fair_shares_are_of_the_nominal_rate_and_a_slow_link_gets_its_part():
    spec = lab("star,4", [{"link": "h0-sw", "bandwidth": "25Mbit"}])
    topology = topology_lib.from_lab(spec)
    schedules, nodes = build_schedules(topology, "ring", 4_000_000)
    shares = fair_shares(Routes(topology), schedules, nodes, Network.from_links(spec.links))
    by_sender = {(nodes[t.src], nodes[t.dst]): share for (_, _, t), share in shares.items()}
    assert by_sender[("h0", "h1")] == pytest.approx(0.25)  # h0's uplink is a quarter of the nominal rate
    assert by_sender[("h3", "h0")] == pytest.approx(0.25)  # and so is its downlink
    assert by_sender[("h1", "h2")] == 1.0  # the others keep their whole link


def test_overrides_are_checked_in_one_line():
    with pytest.raises(TopologyError, match=r"links.overrides\[0\].link: h0-h1: this star has no link between h0 and h1"):
        topology_lib.from_lab(lab("star,4", [{"link": "h0-h1", "bandwidth": "50Mbit"}]))
    with pytest.raises(SpecError, match=r"links.overrides.0.link"):
        lab("star,4", [{"link": "h0", "bandwidth": "50Mbit"}])
    with pytest.raises(SpecError, match=r"links.overrides.0.bandwidth"):
        lab("star,4", [{"link": "h0-sw", "bandwidth": "fast"}])
    with pytest.raises(SpecError, match=r"links.overrides"):
        lab("star,4", [{"link": "h0-sw", "bandwidth": "50Mbit"}] * 5000)


def test_a_link_may_have_a_delay_and_a_queue_of_its_own(tmp_path):
    from orchestrator.deploy.agents import flow_window

    spec = lab("star,4", [{"link": "h0-sw", "bandwidth": "40Mbit", "queue": 50},
                          {"link": "sw-h1", "delay": "2ms"}])
    topology = topology_lib.from_lab(spec)
    assert topology.queue_of("h0", "sw", 1000) == topology.queue_of("sw", "h0", 1000) == 50
    assert topology.delay_of("h1", "sw", 0.0) == topology.delay_of("sw", "h1", 0.0) == pytest.approx(0.002)
    assert topology.rates == {("h0", "sw"): 40e6, ("sw", "h0"): 40e6}  # h1's entry gave no rate
    assert topology.queue_of("h2", "sw", 1000) == 1000 and topology.delay_of("h2", "sw", 0.0) == 0.0
    assert spec.needs_netem and not lab("star,4", [{"link": "h0-sw", "queue": 50}]).needs_netem
    # the data streams' window covers the longest link's delay: 2 links × 2 ms each way at 100 Mbit
    assert flow_window(spec, topology) >= 2 * 100e6 / 8 * (2 * 2 * 0.002)


def test_a_links_own_delay_and_queue_are_checked_in_one_line():
    with pytest.raises(SpecError, match=r"links.overrides.0: h0-sw: give the link's own bandwidth, delay or queue"):
        lab("star,4", [{"link": "h0-sw"}])
    with pytest.raises(SpecError, match=r"links.overrides.0.queue: must lie between 1 and"):
        lab("star,4", [{"link": "h0-sw", "queue": 0}])
    data = lab_from_argument("star,4").model_dump(mode="json")
    data["links"].update(delay="5ms", jitter="3ms", overrides=[{"link": "h0-sw", "delay": "1ms"}])
    with pytest.raises(SpecError, match=r"overrides.0.delay: 1ms is less than the links' jitter 3ms"):
        validate(LabSpec, data, "lab.yaml")
    data["links"].update(delay="0ms", jitter="0ms", mtu=9000, overrides=[{"link": "h0-sw", "queue": 200000}])
    with pytest.raises(SpecError, match=r"overrides.0.queue: 200000 × mtu 9000 is more than"):
        validate(LabSpec, data, "lab.yaml")


def test_a_graph_link_has_its_own_delay_and_queue_in_yaml_and_graphml(tmp_path):
    import networkx as nx

    from orchestrator.spec import load_lab

    (tmp_path / "lab.yaml").write_text(
        "name: g\ntopology:\n  kind: graph\n  servers: [a, b]\n  l3: [r]\n"
        "  links: [[a, r], {a: b, b: r, bandwidth: 50Mbit, delay: 1ms, queue: 30}]\n")
    topology = topology_lib.from_lab(load_lab(tmp_path / "lab.yaml"))
    assert (topology.rate_of("r", "b", 0), topology.delay_of("r", "b", 0.0), topology.queue_of("b", "r", 1000)) == \
        (50e6, pytest.approx(0.001), 30)
    assert topology.queue_of("a", "r", 1000) == 1000
    graph = nx.Graph()
    graph.add_nodes_from(["a", "b"], role="server")
    graph.add_node("r", role="l3")
    graph.add_edge("a", "r")
    graph.add_edge("b", "r", delay="3ms", queue=40)
    nx.write_graphml(graph, tmp_path / "net.graphml")
    (tmp_path / "file.yaml").write_text("name: g\ntopology: {kind: graph, file: net.graphml}\n")
    topology = topology_lib.from_lab(load_lab(tmp_path / "file.yaml"))
    assert topology.delay_of("b", "r", 0.0) == pytest.approx(0.003) and topology.queue_of("r", "b", 1000) == 40
    (tmp_path / "bad.yaml").write_text(
        "name: g\nlinks: {mtu: 9000}\ntopology:\n  kind: graph\n  servers: [a, b]\n  l3: [r]\n"
        "  links: [[a, r], {a: b, b: r, queue: 200000}]\n")
    with pytest.raises(SpecError, match=r"topology.links.1.queue: 200000 × mtu 9000 is more than"):
        load_lab(tmp_path / "bad.yaml")
