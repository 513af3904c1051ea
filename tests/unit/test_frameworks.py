"""Frameworks beside the agents (issue 32 item 4), the logic above the processes: the table a
framework is registered in, what an experiment file may ask of one (refused in one line
naming the field), what a plan refuses (a runtime it does not run on, a machine without it),
and the checks a run's rows go through. The real processes: tests/agents/test_torch_loopback.py
and tests/netns/test_torch_run.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator import frameworks
from orchestrator.errors import SpecError
from orchestrator.experiment.plan import make_plan
from orchestrator.frameworks import torch_gloo
from orchestrator.spec.experiment import ExperimentSpec
from orchestrator.spec.loader import validate


def _experiment(algorithms, runtime="netns", workload=None, **extra) -> dict:
    return {"name": "fw", "lab": {"name": "fw", "topology": {"kind": "star", "servers": 4},
                                  "links": {"bandwidth": "100Mbit"}, "servers": {"runtime": runtime}},
            "agents": {"algorithms": algorithms, "workload": workload or {"kind": "back-to-back", "size": "1MB"}},
            "iterations": 3, **extra}


def _spec(*args, **kwargs) -> ExperimentSpec:
    return validate(ExperimentSpec, _experiment(*args, **kwargs), "fw.yaml")


def test_a_framework_point_is_named_apart_from_ours_and_priced_as_its_algorithm():
    spec = _spec(["ring", {"name": "ring", "framework": "torch"}])
    assert [a.key for a in spec.agents.algorithms] == ["ring", "torch-ring"]
    ours, theirs = make_plan(spec, "fw.yaml").points
    assert theirs.point.id.endswith("torch-ring")
    assert theirs.prediction.per_run == pytest.approx(ours.prediction.per_run)  # gloo's allreduce is a ring


@pytest.mark.parametrize("algorithm, extra, says", [
    ({"name": "ring", "framework": "tensorflow"}, {}, "unknown framework 'tensorflow': choose one of"),
    ({"name": "hips", "framework": "torch"}, {}, "framework torch runs ring, not hips"),
    ({"name": "ring", "framework": "torch", "options": {"a": 1}}, {}, "ring has no such option"),
    ({"name": "ps", "framework": "torch", "ps": ["h3"]}, {}, "framework torch runs ring, not ps"),
    ({"name": "ring", "framework": "torch"}, {"faults": {"events": [{"action": "link-down", "target": "h0-sw",
                                                                        "at_iteration": 1, "for": "1s"}]}},
     "runs without the agents' fault timeline"),
    ({"name": "ring", "framework": "torch"}, {"partitioning": {"partition_bytes": "256KB"}},
     "reduces the whole gradient at once: leave partitioning out"),
])
def test_what_a_framework_cannot_take_is_one_line_naming_the_field(algorithm, extra, says):
    with pytest.raises(SpecError) as caught:
        _spec([algorithm], **extra)
    message = str(caught.value)
    assert says in message and "\n" not in message and message.startswith("fw.yaml: ")


def test_a_docker_lab_runs_the_image_that_holds_the_framework_unless_it_names_its_own():
    plan = make_plan(_spec(["ring", {"name": "ring", "framework": "torch"}], runtime="docker"), "fw.yaml")
    assert plan.variants[0].lab.servers.image == "testbed/server-torch:latest"
    assert make_plan(_spec(["ring"], runtime="docker"), "fw.yaml").variants[0].lab.servers.image == \
        "testbed/server:latest"
    own = _experiment([{"name": "ring", "framework": "torch"}], runtime="docker")
    own["lab"]["servers"]["image"] = "me/torch:1"
    assert make_plan(validate(ExperimentSpec, own, "fw.yaml"), "fw.yaml").variants[0].lab.servers.image == "me/torch:1"


def test_a_plan_refuses_a_runtime_the_framework_does_not_run_on():
    frameworks.register_framework("nsonly", lambda job: frameworks.FrameworkResult([]), runs=("ring",))
    try:
        with pytest.raises(SpecError, match=r"run 000-.*nsonly-ring: framework nsonly runs on netns labs, not docker: "
                                            r"set lab.servers.runtime: netns"):
            make_plan(_spec([{"name": "ring", "framework": "nsonly"}], runtime="docker"), "fw.yaml")
    finally:
        frameworks.unregister_framework("nsonly")


def test_a_users_framework_registers_in_the_same_table_and_what_it_lacks_is_said_at_planning():
    frameworks.register_framework("mine", lambda job: frameworks.FrameworkResult([]), runs=("ring", "mesh"),
                                  missing=lambda: "libmine is not installed: pip install mine", origin="/p/mine.py")
    try:
        spec = _spec([{"name": "mesh", "framework": "mine"}])
        assert spec.agents.algorithms[0].key == "mine-mesh"
        with pytest.raises(SpecError, match="framework mine: libmine is not installed: pip install mine"):
            make_plan(spec, "fw.yaml")
        with pytest.raises(ValueError, match="framework mine is registered already"):
            frameworks.register_framework("mine", lambda job: None, runs=("ring",))
    finally:
        frameworks.unregister_framework("mine")
    assert "mine" not in frameworks.FRAMEWORKS


@pytest.mark.parametrize("name, kwargs, says", [
    ("Torch2", {"runs": ("ring",)}, "lower case letters"),
    ("torch", {"runs": ("ring",)}, "registered already"),
    ("new", {"runs": ()}, "runs must name the algorithms"),
    ("new", {"runs": ("ring",), "workloads": ("video",)}, "no workload kind video"),
])
def test_a_bad_registration_is_refused(name, kwargs, says):
    with pytest.raises(ValueError, match=says):
        frameworks.register_framework(name, lambda job: None, **kwargs)
    assert "new" not in frameworks.FRAMEWORKS


def test_the_built_in_cannot_be_removed():
    with pytest.raises(ValueError, match="built in"):
        frameworks.unregister_framework("torch")


def _job(kind: str, iterations: int = 2) -> frameworks.Job:
    return frameworks.Job(lab=None, nodes=["h0", "h1"], tensors=[8], workload=SimpleNamespace(kind=kind),
                          compute=None, iterations=iterations, timeout=10)


def _rows(verified=((True, True), (True, True)), digests=(("a", "b"), ("a", "b"))) -> list[list[dict]]:
    return [[{"iteration": i, "verified": verified[rank][i], "param_digest": digests[rank][i]} for i in range(2)]
            for rank in range(2)]


def test_the_check_of_an_all_reduce_names_the_iteration_a_sum_was_wrong_in():
    assert torch_gloo._check(_job("back-to-back"), _rows())["clean"] is True
    bad = torch_gloo._check(_job("back-to-back"), _rows(verified=((True, True), (True, False))))
    assert bad["clean"] is False and bad["summary"] == "all_reduce sums wrong in iteration(s) [1]"


def test_the_check_of_ddp_wants_every_rank_with_the_same_parameters_after_every_step():
    assert torch_gloo._check(_job("digits"), _rows())["clean"] is True
    rows = _rows(digests=(("a", "b"), ("a", "c")))
    bad = torch_gloo._check(_job("digits"), rows)
    assert bad["clean"] is False and "differ after step(s) [1]" in bad["summary"]
    assert [row["verified"] for row in rows[0]] == [True, False]  # what the report's records say


def test_each_worker_is_handed_its_own_drawn_compute_and_ddp_its_own_shard():
    lab = SimpleNamespace(topology=SimpleNamespace(address_of=lambda node: "10.0.0.1"))
    workload = SimpleNamespace(kind="tensors", compute=SimpleNamespace(seconds=0.05))
    job = frameworks.Job(lab, ["h0", "h1", "h2"], [10, 20], workload, [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], 2, 30)
    jobs = torch_gloo._jobs(job)
    assert [j["compute"] for j in jobs] == [[0.1, 0.4], [0.2, 0.5], [0.3, 0.6]]
    assert {j["elements"] for j in jobs} == {30} and {j["master"] for j in jobs} == {"10.0.0.1"}
    assert len({j["port"] for j in jobs}) == 1 and [j["rank"] for j in jobs] == [0, 1, 2]
    fixed = torch_gloo._jobs(frameworks.Job(lab, ["h0", "h1"], [10], workload, None, 3, 30))
    assert fixed[1]["compute"] == [0.05] * 3
    digits = SimpleNamespace(kind="digits", hidden=8, lr=0.5, batch=4, seed=1)
    shards = torch_gloo._jobs(frameworks.Job(lab, ["h0", "h1", "h2"], [10], digits, None, 2, 30))
    assert {j["mode"] for j in shards} == {"ddp"}
    sizes = [len(j["digits"]["data"]["y"]) for j in shards]
    assert sum(sizes) == 1797 and max(sizes) - min(sizes) <= 1  # every sample, once, in the agents' shards


def test_a_plugin_file_may_register_a_framework_and_a_taken_name_is_one_line(tmp_path):
    from orchestrator import plugins
    from orchestrator.errors import PluginError

    mine = tmp_path / "mine.py"
    mine.write_text("from orchestrator.frameworks import FrameworkResult, register_framework\n"
                    "register_framework('fromfile', lambda job: FrameworkResult([]), runs=('ring',))\n")
    try:
        plugins.load_file(mine)
        assert frameworks.get("fromfile").origin == str(mine)
    finally:
        frameworks.unregister_framework("fromfile")
    taken = tmp_path / "taken.py"
    taken.write_text("from orchestrator.frameworks import register_framework\n"
                     "register_framework('torch', print, runs=('ring',))\n")
    with pytest.raises(PluginError) as caught:
        plugins.load_file(taken)
    assert str(caught.value) == f"plugin {taken}:2: framework torch is registered already (built-in): give yours " \
                                "another name"
    assert frameworks.get("torch").origin == "built-in"
