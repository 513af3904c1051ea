"""Links at rates of their own (issue 30, `links.overrides`): the cost model, the fair shares
the agents pace at and the prediction's bottleneck follow each link direction's rate."""

from __future__ import annotations

import pytest

from orchestrator.cost import Network
from orchestrator.cost.fairness import max_min_rates
from orchestrator.cost.predict import build_schedules
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
