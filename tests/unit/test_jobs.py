"""Several jobs on one fabric (issue 32 item 1), the logic above the agents: where jobs'
servers go, what an experiment file with jobs may say (one line naming the field otherwise),
the model's prediction of jobs together, and the interference table read back from results.
The real run: tests/netns/test_jobs_run.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator import topology
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.cost.compiled import compile_run
from orchestrator.cost.jobs import merged, together
from orchestrator.cost.network import Network
from orchestrator.cost.routes import Routes
from orchestrator.errors import SpecError
from orchestrator.experiment import jobs
from orchestrator.experiment.plan import make_plan
from orchestrator.spec.experiment import ExperimentSpec, PlacementSpec
from orchestrator.spec.lab import StarSpec, TorusSpec
from orchestrator.spec.loader import validate

SERVERS = [f"h{i}" for i in range(8)]


def _job(name, servers):
    return SimpleNamespace(name=name, servers=servers)


def test_packed_takes_the_next_free_servers_and_spread_takes_them_evenly():
    two = [_job("a", PlacementSpec(count=4)), _job("b", PlacementSpec(count=4))]
    assert jobs.place(two, SERVERS) == {"a": ("h0", "h1", "h2", "h3"), "b": ("h4", "h5", "h6", "h7")}
    assert jobs.place(two, SERVERS, "spread") == {"a": ("h0", "h2", "h4", "h6"), "b": ("h1", "h3", "h5", "h7")}
    odd = jobs.place([_job("a", PlacementSpec(count=3, placement="spread")), _job("b", PlacementSpec(count=2))], SERVERS)
    assert odd == {"a": ("h0", "h2", "h5"), "b": ("h1", "h3")}


def test_random_placement_is_the_seeds_and_named_servers_come_first():
    mixed = [_job("a", PlacementSpec(count=3, placement="random", seed=7)), _job("b", ["h0", "h7"])]
    first, again = jobs.place(mixed, SERVERS), jobs.place(mixed, SERVERS)
    assert first == again and first["b"] == ("h0", "h7")
    assert not set(first["a"]) & {"h0", "h7"} and len(set(first["a"])) == 3
    other = jobs.place([_job("a", PlacementSpec(count=3, placement="random", seed=0)), _job("b", ["h0", "h7"])], SERVERS)
    assert other["a"] != first["a"]  # another seed, other servers (for these two seeds)


@pytest.mark.parametrize("placed, says", [
    ([_job("a", ["h0", "h1"]), _job("b", ["h1"])], "jobs.1.servers: h1 is job a's already: jobs share no server"),
    ([_job("a", ["h9"])], "jobs.0.servers: h9 is no server of the lab"),
    ([_job("a", ["h0"]), _job("b", PlacementSpec(count=8))], "jobs.1.servers: job b asks for 8 servers, 7 of the "
                                                                "lab's 8 are free"),
])
def test_jobs_that_do_not_fit_are_named(placed, says):
    with pytest.raises(ValueError, match=says):
        jobs.place(placed, SERVERS)


def _experiment(**changes) -> dict:
    base = {"name": "jb", "lab": {"name": "jb", "topology": {"kind": "torus", "k": 4, "d": 1},
                                  "links": {"bandwidth": "50Mbit"}, "servers": {"runtime": "netns"}},
            "agents": {"workload": {"kind": "back-to-back", "size": "1MB"}},
            "jobs": [{"name": "a", "servers": {"count": 2}, "algorithm": "ring"},
                     {"name": "b", "servers": {"count": 2}, "algorithm": "ring"}],
            "iterations": 3, "sweep": {"placements": ["packed", "spread"]}}
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


@pytest.mark.parametrize("changes, says", [
    ({"agents": {"algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "1MB"}}},
     "agents.algorithms: with jobs:, each job names its algorithm"),
    ({"jobs": [{"name": "a", "servers": {"count": 2}, "algorithm": "ring"}]}, "jobs: one job is an experiment"),
    ({"jobs": [{"name": "a", "servers": ["h0"], "algorithm": "ring"}, {"name": "a", "servers": ["h1"],
                                                                       "algorithm": "ring"}]}, "two jobs have one name"),
    ({"faults": {"events": [{"action": "link-down", "target": "t0-t1", "at_iteration": 1, "for": "1s"}]}},
     "faults: with jobs:, each job has its own timeline (jobs.N.faults)"),
    ({"jobs": None}, "sweep.placements: placements place jobs"),
    ({"jobs": [{"name": "a", "servers": ["h0", "h0"], "algorithm": "ring"}, {"name": "b", "servers": ["h1"],
                                                                            "algorithm": "ring"}]},
     "a server is listed twice"),
])
def test_what_jobs_do_not_take_is_one_line_naming_the_field(changes, says):
    data = _experiment(**changes)
    if changes.get("jobs", 1) is None:
        data["agents"]["algorithms"] = ["ring"]
    with pytest.raises(SpecError) as caught:
        validate(ExperimentSpec, data, "jb.yaml")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def _ring(topo, nodes, elements=262_144):
    ctx = Context(len(nodes), topo, tuple(nodes), {})
    return compile_run("ring", ctx, elements, partitions([elements], None), nodes=nodes)


def test_jobs_that_share_no_link_do_not_slow_each_other():
    topo = topology.build(StarSpec(kind="star", servers=4))
    routes, network = Routes(topo), Network(bandwidth=50e6)
    a, b = _ring(topo, ["h0", "h1"]), _ring(topo, ["h2", "h3"])
    alone = together(routes, [a], network) + together(routes, [b], network)
    assert together(routes, [a, b], network) == pytest.approx(alone, rel=1e-9)


def test_two_jobs_relaying_through_each_others_servers_take_twice_as_long():
    """torus,4,1 is a ring of four servers, each forwarding. Spread, job a (t0, t2) and job b
    (t1, t3) each cross a server of the other: every link direction a job's flow takes also
    carries one flow of the other job, so max-min gives each half the rate: twice the time.
    Packed (t0, t1 and t2, t3) they are neighbours on links of their own: no change."""
    topo = topology.build(TorusSpec(kind="torus", k=4, d=1))
    routes, network = Routes(topo), Network(bandwidth=50e6)
    spread = [_ring(topo, ["t0", "t2"]), _ring(topo, ["t1", "t3"])]
    alone = [together(routes, [run], network)[0] for run in spread]
    both = together(routes, spread, network)
    assert [b / a for a, b in zip(alone, both)] == pytest.approx([2.0, 2.0], rel=0.02)
    packed = [_ring(topo, ["t0", "t1"]), _ring(topo, ["t2", "t3"])]
    assert together(routes, packed, network) == pytest.approx([together(routes, [r], network)[0] for r in packed])
    with pytest.raises(ValueError, match="must not share a server"):
        merged([_ring(topo, ["t0", "t1"]), _ring(topo, ["t1", "t2"])])


def test_a_plan_predicts_each_job_alone_and_together_and_names_the_interference():
    plan = make_plan(validate(ExperimentSpec, _experiment(), "jb.yaml"), "jb.yaml")
    ids = [p.point.id for p in plan.points]
    assert ids[:4] == ["000-torus-4-1-50mbit-packed-a-alone", "001-torus-4-1-50mbit-packed-b-alone",
                       "002-torus-4-1-50mbit-packed-a-together", "003-torus-4-1-50mbit-packed-b-together"]
    by_id = {p.point.id: p for p in plan.points}
    spread_a = by_id["006-torus-4-1-50mbit-spread-a-together"]
    assert spread_a.layout.workers == ("t0", "t2")
    alone = by_id["004-torus-4-1-50mbit-spread-a-alone"].prediction.per_run
    assert spread_a.prediction.per_run == pytest.approx(2 * alone, rel=0.03)
    assert spread_a.prediction.parts["interference"] == pytest.approx(alone, rel=0.05)
    packed = by_id["002-torus-4-1-50mbit-packed-a-together"]
    assert packed.prediction.parts["interference"] == pytest.approx(0.0, abs=1e-9)


def test_the_interference_table_reads_results_back_and_survives_garbage():
    def entry(job, mode, sync, predicted, lab="jb"):
        return {"id": f"{job}-{mode}", "lab": lab, "placement": "spread", "job": job, "mode": mode, "algorithm": "ring",
                "workers": ["h0", "h2"], "status": "done", "sync_s": {"fault_free_mean": sync},
                "predicted": {"seconds": predicted}}

    joint = entry("a", "together", 1.0, 0.8)
    joint["predicted"]["parts"] = {"interference": 0.4}  # the model's own alone: 0.8 − 0.4
    results = {"points": [entry("a", "alone", 0.5, 0.4), joint, entry("a", "together", 1.0, 0.8, lab="other"),
                          entry("b", "alone", "x", None), entry("b", "together", [1], True), "not a point",
                          {**entry("c", "alone", 1, 1), "job": ["c"]}, {**entry("c", "together", 1, 1), "lab": {}}]}
    rows = jobs.table_rows(results)
    assert len(rows) == 2
    assert rows[0] == ["jb", "spread", "a", "ring", "2", "0.5000 / 0.4000", "1.0000 / 0.8000", "2.000 / 2.000"]
    assert rows[1][5:] == ["– / –", "– / –", "– / –"]


def test_stragglers_are_refused_with_jobs():
    data = _experiment(agents={"workload": {"kind": "tensors", "tensors": [1000],
                                            "compute": {"per_rank": ["10ms", "50ms"]}}})
    with pytest.raises(SpecError, match="agents.workload.compute: stragglers are not taken with jobs: yet"):
        validate(ExperimentSpec, data, "jb.yaml")


def test_a_jobs_timeline_is_its_own_and_its_server_faults_hit_only_its_servers():
    data = _experiment()
    data["jobs"][0]["faults"] = {"events": [{"action": "link-degrade", "target": "t0-t1", "at_iteration": 1,
                                             "for": "1s", "options": {"rate": "25Mbit"}}]}
    plan = make_plan(validate(ExperimentSpec, data, "jb.yaml"), "jb.yaml")
    assert {p.point.job for p in plan.points if p.faults} == {"a"}
    assert all(len(p.faults) == 1 for p in plan.points if p.point.job == "a")
    data["jobs"][0]["faults"] = {"events": [{"action": "server-pause", "target": "t3", "at_iteration": 1, "for": "1s"}]}
    with pytest.raises(SpecError, match=r"jb.yaml: jobs.0.faults: server-pause t3 is no server of job a \(t0, t1\): a "
                                        r"job's server faults target its own servers"):
        make_plan(validate(ExperimentSpec, data, "jb.yaml"), "jb.yaml")


def _spread_torus():
    topo = topology.build(TorusSpec(kind="torus", k=4, d=1))
    return Routes(topo), Network(bandwidth=50e6), [_ring(topo, ["t0", "t2"]), _ring(topo, ["t1", "t3"])]


def test_a_job_that_starts_after_another_ends_is_not_slowed_by_it():
    routes, network, spread = _spread_torus()
    alone = [together(routes, [run], network, iterations=[4])[0] for run in spread]
    sequential = together(routes, spread, network, iterations=[4, 4], after=[None, 0])
    assert sequential == pytest.approx(alone, rel=1e-6)
    with pytest.raises(ValueError, match="in a circle"):
        together(routes, spread, network, iterations=[4, 4], after=[1, 0])


def test_a_late_start_or_a_short_neighbour_overlaps_only_part_of_a_job():
    """b runs 8 iterations; a, 2 of them at once with b's first two: b's mean lies between
    alone (1×) and always shared (2×): its first iterations are shared, the rest alone."""
    routes, network, spread = _spread_torus()
    b_alone = together(routes, [spread[1]], network, iterations=[8])[0]
    short = together(routes, spread, network, iterations=[2, 8])
    assert 1.05 * b_alone < short[1] < 1.6 * b_alone
    assert short[0] == pytest.approx(2 * b_alone, rel=0.05)  # a's one timed iteration: shared throughout
    late = together(routes, spread, network, iterations=[4, 4], starts=[0.0, 100.0])  # b starts when a is long done
    assert late == pytest.approx([b_alone, b_alone], rel=1e-3)


@pytest.mark.parametrize("job, says", [
    ({"start": {"at": "1s", "after": "b"}}, "give exactly one of at"),
    ({"start": {"after": "c"}}, "jobs.0.start.after: 'c' is no other job: use one of b"),
    ({"start": {"after": "a"}}, "jobs.0.start.after: 'a' is no other job"),
    ({"iterations": 1}, r"jobs.0.iterations: 1 leaves nothing after the warm-up \(1\)"),
])
def test_a_jobs_start_and_iterations_are_checked(job, says):
    data = _experiment(warmup=1)
    data["jobs"][0].update(job)
    with pytest.raises(SpecError, match=says):
        validate(ExperimentSpec, data, "jb.yaml")


def test_jobs_waiting_for_each_other_in_a_circle_are_refused():
    data = _experiment()
    data["jobs"][0]["start"], data["jobs"][1]["start"] = {"after": "b"}, {"after": "a"}
    with pytest.raises(SpecError, match="jobs: a and b wait for each other in a circle"):
        validate(ExperimentSpec, data, "jb.yaml")


def test_memory_is_counted_for_every_jobs_agents_when_they_run_together():
    """Each job alone fits: two agents of a 100 MB gradient (~196 MiB each). Together four
    agents hold their buffers at once, more than the share of 700 MiB the agents may have."""
    data = _experiment(sweep=None)
    data["jobs"][1]["workload"] = {"kind": "back-to-back", "size": "100MB"}
    data["agents"]["workload"] = {"kind": "back-to-back", "size": "100MB"}
    with pytest.raises(SpecError) as caught:
        make_plan(validate(ExperimentSpec, data, "jb.yaml"), "jb.yaml", memory=700 << 20)
    message = str(caught.value)
    assert "jb.yaml: agents.workload: 4 agents of about" in message and "-a-together)" in message, message
    assert "\n" not in message
    data["jobs"][0]["workload"] = {"kind": "back-to-back", "size": "1MB"}
    # b alone (2 × ~196 MiB) fits in 80 % of 600 MiB; with a's two small agents beside it, not
    with pytest.raises(SpecError, match=r"jb.yaml: jobs.0.workload: 4 agents .* need 586 MiB .*a-together\)"):
        make_plan(validate(ExperimentSpec, data, "jb.yaml"), "jb.yaml", memory=600 << 20)


def test_a_job_beside_others_is_judged_on_its_whole_window_not_its_own_run():
    """The fabric counters see every job's bytes: over a together job's 3 s window a shared
    link carried its rate's worth (another job's bytes before this one's 1 s run began).
    Held against the 1 s run that would read as a shaper failing; against the window, not."""
    from orchestrator.experiment.runner import _judge

    rate = 1_000_000.0
    counters = {"cpu": {"idle": 10.0, "busy": 1.0}, "bytes": {"a→b": 0}, "packets": {}, "drops": {}}
    after = {"cpu": {"idle": 20.0, "busy": 2.0}, "bytes": {"a→b": int(3 * rate)}, "packets": {}, "drops": {}}
    entry = {"wall_s": 1.0, "ratio": 1.0, "bytes_per_link": {"seconds": 3.0}, "mode": "together"}
    assert _judge(entry, counters, after, rate)["verdict"] == "ok"
    alone = {**entry, "mode": "alone"}
    assert "its shaper did not hold" in " ".join(_judge(alone, counters, after, rate)["reasons"])


def test_the_cpu_need_of_jobs_together_is_the_groups(tmp_path, monkeypatch):
    """Two jobs that share no link (packed) each need what they need alone; run together
    they load the machine together: each together point reports the group's cores."""
    import json

    from orchestrator.experiment import calibrate
    from tests.unit.test_cpu_need import _calibration

    monkeypatch.setenv("TESTBED_STATE", str(tmp_path))
    (tmp_path / "calibration.json").write_text(json.dumps(_calibration().to_json()))
    plan = make_plan(validate(ExperimentSpec, _experiment(sweep={"placements": ["packed"]}), "jb.yaml"), "jb.yaml")
    needs = calibrate.plan_needs(plan)
    alone = [needs[p.point.id].cores for p in plan.points if p.point.mode == "alone"]
    together = [needs[p.point.id].cores for p in plan.points if p.point.mode == "together"]
    assert len(alone) == len(together) == 2 and all(c > 0 for c in alone)
    assert together == pytest.approx([sum(alone)] * 2, rel=1e-6)
