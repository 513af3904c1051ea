"""The cost model at scale (issue 31 item 6): routes walked as one graph per connection, max-min
shares cut to the links that can bind, both giving the answers the straightforward ways give.
Timing goals are bench/model_scale.py's; these check answers only."""

from __future__ import annotations

import random

import pytest

from orchestrator.cost import Network
from orchestrator.cost.closed_forms import closed_form
from orchestrator.cost.compiled import over_servers
from orchestrator.cost.fairness import MaxMin, max_min_rates
from orchestrator.cost.predict import predict_schedules
from orchestrator.cost.routes import Routes
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab


def topo(argument: str):
    return from_lab(lab_from_argument(argument))


def path_by_path(routes: Routes, src: str, dst: str, nic: int | None) -> tuple[dict[int, float], float]:
    """The spread as the routing tables give it, every ECMP path walked on its own."""
    topology, address = routes.topology, routes.address(dst, nic)
    shares: dict[int, float] = {}
    hops = 0.0
    for path in topology.layered_paths(src, address):
        weight = 1.0
        for name, crossing in path[:-1]:
            if crossing == "l3":
                weight /= len(topology.lookup(name, address))
        for a, b in zip(path, path[1:]):
            index = routes.directions.index(next(d for d in routes.directions if (d.src, d.dst) == (a[0], b[0])))
            shares[index] = shares.get(index, 0.0) + weight
        hops += weight * (len(path) - 1)
    return shares, hops


@pytest.mark.parametrize("lab, nics", [("fattree,4", [None]), ("bcube,3,2", [None, 0, 1, 2]),
                                       ("torus,3,2", [None, 0, 1, 2, 3]), ("leafspine,4,2,2", [None]), ("bigraph,4,2", [None])])
def test_routes_walked_as_a_graph_spread_as_path_by_path(lab, nics):
    t = topo(lab)
    routes = Routes(t)
    servers = [s.name for s in t.servers]
    pairs = random.Random(7).sample([(a, b) for a in servers for b in servers if a != b], 20)
    for src, dst in pairs:
        for nic in nics:
            usage, hops = routes.usage(src, dst, nic)
            shares, expected_hops = path_by_path(routes, src, dst, nic)
            assert dict(usage) == pytest.approx(shares, rel=1e-12), (src, dst, nic)
            assert hops == pytest.approx(expected_hops, rel=1e-12)
            assert sum(share for _, share in usage) > 0


def test_max_min_cut_to_binding_links_gives_the_full_answer():
    t = topo("fattree,4")
    routes = Routes(t)
    servers = [s.name for s in t.servers]
    rng = random.Random(3)
    entities = [routes.usage(a, b)[0] for a in servers for b in servers if a != b]
    capacity = routes.capacities(Network(bandwidth=1e9))
    capacity[0] /= 3  # one slower link direction: a bottleneck that is not at the ends
    fair = MaxMin(entities, capacity)
    for size in (1, 2, 5, 17, 60, len(entities)):
        chosen = rng.sample(range(len(entities)), size)
        assert fair.rates(chosen) == pytest.approx(max_min_rates([entities[e] for e in chosen], capacity), rel=1e-12)


@pytest.mark.parametrize("lab, algorithm", [("fattree,4", "ring"), ("bcube,4,1", "ring"), ("bcube,4,1", "hips"),
                                            ("fattree,4", "mesh")])
def test_predictions_meet_their_closed_forms(lab, algorithm):
    """Where the network is the only bound the model equals REFERENCE's formula: the shares cut
    to binding links and the graph-walked routes change no answer."""
    t = topo(lab)
    run = over_servers(t, algorithm, 25_000_000)
    network = Network(bandwidth=1e9)
    prediction = predict_schedules(t, run.schedules, list(run.nodes), network, run.chunk_bytes)
    form = closed_form(run.schedules[0][1], t)
    assert prediction.seconds == pytest.approx(form.seconds(prediction.size_bytes, network.payload_rate, 0.0),
                                               rel=1e-6)
