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


# -- the step-level model: plans past the event simulation's budget ----------------------------
def _both(lab: str, algorithm: str, size: int, network: Network):
    """(step-level, event) seconds of one allreduce of `algorithm` over `lab`'s servers."""
    from orchestrator.cost.simulate import simulate
    from orchestrator.cost.stepwise import stepwise

    t = topo(lab)
    run = over_servers(t, algorithm, size)
    routes = Routes(t)
    steps = stepwise(routes, run.schedules, list(run.nodes), network, run.chunk_bytes)
    event = simulate(routes, run.schedules, list(run.nodes), network, run.chunk_bytes)
    return steps, event


@pytest.mark.parametrize("lab, algorithm, within", [
    ("star,8", "ring", 1e-6), ("fattree,4", "ring", 1e-6), ("torus,3,2", "ring", 1e-6),
    ("bcube,4,1", "hips", 0.02), ("torus,4,2", "hips", 0.02), ("star,8", "mesh", 0.05)])
@pytest.mark.parametrize("size", [65_536, 4 << 20, 25 << 20])
def test_steps_give_what_the_event_simulation_gives_on_rings_and_hips(lab, algorithm, size, within):
    """Where both run, the step-level model's time is the event simulation's (α, its stretch
    on 2 cores and per-peer costs included): a ring's exactly, HiPS's within 2 % (1.8 % at
    most seen), a mesh's within 5 % (3.5 %); and the bytes every link carries are the same."""
    network = Network(bandwidth=1e9, latency=100e-6, cores=2, peer_latency=20e-6)
    steps, event = _both(lab, algorithm, size, network)
    assert steps.seconds == pytest.approx(event.seconds, rel=within)
    assert steps.link_bytes == pytest.approx(event.link_bytes, rel=1e-9)


@pytest.mark.parametrize("lab", ["star,8", "bcube,3,1", "fattree,4", "torus,4,2"])
def test_steps_price_halving_doubling_near_the_event_simulation(lab):
    """Halving-doubling forwards the first part of what it receives while the rest arrives:
    the step-level model lets no later stream take bandwidth from an earlier one, so it comes
    out faster, by up to a quarter (0.74-1.08 of the event simulation measured)."""
    steps, event = _both(lab, "halving-doubling", 4 << 20, Network(bandwidth=1e9, latency=100e-6))
    assert 0.70 <= steps.seconds / event.seconds <= 1.10


def test_ring_by_steps_is_its_closed_form():
    """A ring's step-level time is 2(N−1)/N·S/B + 2(N−1)·α where each hop has its own link:
    the lead of every step is paid once per step when a message is the whole transfer."""
    from orchestrator.cost.stepwise import stepwise

    t = topo("fattree,4")
    run = over_servers(t, "ring", 160_000)  # 10,000 B per transfer: one message each
    network = Network(bandwidth=1e9, latency=100e-6)
    steps = stepwise(Routes(t), run.schedules, list(run.nodes), network, run.chunk_bytes)
    form = closed_form(run.schedules[0][1], t)
    assert steps.seconds == pytest.approx(form.seconds(160_000, network.payload_rate, network.latency), rel=1e-9)
    assert steps.seconds == pytest.approx(30 * (10_000 / network.payload_rate + 100e-6), rel=1e-9)


def test_prediction_takes_steps_past_the_event_budget(monkeypatch):
    """A plan past EVENT_TRANSFERS, past MAX_PATH_WORK, or that outgrows the event loop's work
    is predicted by steps (Prediction.model says so, and the report), not refused."""
    import importlib

    predict_module = importlib.import_module("orchestrator.cost.predict")  # the package exports a predict()
    simulate_module = importlib.import_module("orchestrator.cost.simulate")

    t = topo("bcube,4,1")
    run = over_servers(t, "hips", 4 << 20)
    network = Network(bandwidth=1e9, latency=100e-6)
    event = predict_schedules(t, run.schedules, list(run.nodes), network, run.chunk_bytes, attribute=True)
    assert event.model == "event" and event.back_to_back is not None
    for name, value in (("EVENT_TRANSFERS", 10), ("MAX_PATH_WORK", 10)):
        with monkeypatch.context() as patch:
            patch.setattr(predict_module, name, value)
            steps = predict_schedules(t, run.schedules, list(run.nodes), network, run.chunk_bytes, attribute=True)
        assert steps.model == "steps" and steps.back_to_back is None
        assert steps.seconds == pytest.approx(event.seconds, rel=0.01)
        assert steps.link_bytes == pytest.approx(event.link_bytes)
        assert set(steps.parts) == {"bandwidth", "latency", "waiting"} and steps.parts["latency"] > 0
        assert steps.to_json()["model"] == "steps"
    real = simulate_module.simulate
    monkeypatch.setattr(predict_module, "simulate", lambda *a, **k: real(*a, **{**k, "max_work": 10}))
    assert predict_schedules(t, run.schedules, list(run.nodes), network, run.chunk_bytes).model == "steps"


def test_predict_holds_plans_a_run_may_not():
    """`testbed predict` takes a ring over 300 servers (179,400 transfers, past what a run's
    agents may hold) by steps, at its closed form; a run's compile still refuses it."""
    from orchestrator.collectives import registry
    from orchestrator.cost.report import predict_lab, render

    lab = lab_from_argument("star,300")
    report = predict_lab(lab, "ring", 300 * 4000)
    assert report.prediction.model == "steps" and report.prediction.workers == 300
    assert report.prediction.seconds == pytest.approx(report.form_seconds, rel=1e-6)
    assert "step by step" in render(report)
    with pytest.raises(ValueError, match="more than the 60,000 one run may hold"):
        over_servers(topo("star,300"), "ring", 300 * 4000)
    assert registry.PREDICTION_TRANSFERS >= 2 * 1024 * 1023  # a ring over 1,024 servers


def test_predict_refuses_past_the_prediction_budget(monkeypatch):
    from orchestrator.collectives import registry
    from orchestrator.cost.report import predict_lab
    from orchestrator.errors import BadUsage

    monkeypatch.setattr(registry, "PREDICTION_TRANSFERS", 1000)
    with pytest.raises(BadUsage, match=r"ring on star-300: ring over 300 workers is 179,400 transfers per allreduce, "
                                       r"more than the 1,000 one prediction may hold"):
        predict_lab(lab_from_argument("star,300"), "ring", 300 * 4000)
