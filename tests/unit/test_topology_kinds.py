"""Topology kinds as registered records (issue 30, item 3): the built-ins and a user's kind go
through the same table, and everything that takes a kind — lab files, `kind,N` shorthands,
experiment sweeps, the builder, drawings, inventories, the cost model, `--plugin` — derives
from it. The user's kind is examples/ringnet.py, copied into the test's own directory and
loaded as a plugin."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import plugins
from orchestrator.errors import PluginError, SpecError, TopologyError
from orchestrator.spec import LabSpec, lab_from_argument, register_topology, topology_kinds, unregister_topology, validate
from orchestrator.spec.lab import TOPOLOGY_SPECS
from orchestrator.topology import KINDS, TopologyKind, from_lab, register_kind
from orchestrator.topology.kinds import shorthand

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ringnet.py"
BIN = Path(sys.executable).parent


@pytest.fixture
def ringnet(tmp_path):
    """The example kind, loaded from a copy in this test's directory; forgotten afterwards."""
    plugin = tmp_path / "ringnet.py"
    shutil.copy(EXAMPLE, plugin)
    plugin.chmod(0o644)
    plugins.load_file(plugin)
    yield plugin
    unregister_topology("ringnet")
    plugins._files.pop(plugin.resolve(), None)


def test_every_built_in_kind_has_one_record_and_one_lab_file_model():
    built_in = {name for name, kind in KINDS.items() if kind.origin == "built-in"}
    assert built_in == set(TOPOLOGY_SPECS) == set(topology_kinds())
    for name, model in TOPOLOGY_SPECS.items():
        fields = tuple(f for f in model.model_fields if f != "kind")
        assert shorthand().get(name, ()) == (fields if name != "graph" else ())
        assert KINDS[name].layout is not None and KINDS[name].title


def test_a_plugin_kind_is_a_lab_file_a_shorthand_and_a_sweep_axis(ringnet, tmp_path):
    assert KINDS["ringnet"].origin == str(ringnet.resolve())
    lab = lab_from_argument("ringnet,5,2")
    assert lab.name == "ringnet-5-2" and lab.topology.routers == 5
    topology = from_lab(lab)
    assert (topology.kind, len(topology.servers), len(topology.switches)) == ("ringnet", 10, 5)
    # the ring's far ends route to each other the short way round, over one router hop
    assert topology.path("h0_0", "h4_0") == ["h0_0", "r0", "r4", "h4_0"]
    written = tmp_path / "lab.yaml"
    written.write_text("name: rn\ntopology: {kind: ringnet, routers: 3, servers_per_router: 1}\n")
    assert from_lab(lab_from_argument(str(written))).kind == "ringnet"
    from orchestrator.spec.experiment import ExperimentSpec

    experiment = validate(ExperimentSpec, {"name": "e", "lab": {"name": "l", "topology": {"kind": "star", "servers": 2}}, "agents": {"algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "1MB"}},
                                           "sweep": {"topologies": ["ringnet,3,1", "star,3"]}}, "e.yaml")
    assert [t.kind for t in experiment.sweep.topologies] == ["ringnet", "star"]


def test_a_plugin_kind_has_one_line_errors_naming_the_field(ringnet):
    with pytest.raises(SpecError, match=r"topology.routers: must lie between 3 and 32 \(got 2\)"):
        lab_from_argument("ringnet,2,1")
    with pytest.raises(SpecError, match="ringnet takes 2 numbers: ringnet,ROUTERS,SERVERS_PER_ROUTER"):
        lab_from_argument("ringnet,4")
    with pytest.raises(SpecError, match=r"topology.kind: unknown kind 'ringnett': use one of .*ringnet"):
        validate(LabSpec, {"name": "x", "topology": {"kind": "ringnett"}}, "x.yaml")


def test_a_plugin_kind_is_drawn_grouped_and_predicted(ringnet, tmp_path):
    from orchestrator.cost.report import predict_lab
    from orchestrator.deploy import inventory
    from orchestrator.topology.draw import default_title, positions

    lab = lab_from_argument("ringnet,4,2")
    topology = from_lab(lab)
    assert set(positions(topology)) == set(topology.nodes)
    assert default_title(topology).startswith("Router ring routers=4 servers_per_router=2: 8 servers")
    from orchestrator.topology import kinds

    assert kinds.groups(topology)["r2"] == ["h2_0", "h2_1"]
    # a mesh over 8 servers on a ring of 4 routers: every router–router link, both ways, and
    # only those, carries the most (routed the short way round, halves split both ways)
    predicted = predict_lab(lab, "mesh", 8 << 20).prediction
    assert {load.link for load in predicted.bottlenecks()} == {
        f"r{i}→r{(i + step) % 4}" for i in range(4) for step in (1, 3)}
    assert inventory.group_name("r2") == "r2"


def test_a_plugin_kind_on_the_command_line(ringnet, tmp_path):
    png = tmp_path / "ring.png"
    shown = subprocess.run([str(BIN / "testbed"), "topology", "ringnet,4,1", "--plugin", str(ringnet), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["kind"] == "ringnet"
    drawn = subprocess.run([str(BIN / "testbed"), "topology", "ringnet,4,1", "--plugin", str(ringnet), "--png", str(png)],
                           capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0 and png.stat().st_size > 1000, drawn.stderr
    missing = subprocess.run([str(BIN / "testbed"), "topology", "ringnet,4,1"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines() == [
        "error: ringnet,4,1: unknown topology kind ringnet: use one of bcube, fattree, torus, bigraph, leafspine, "
        "star, or load the plugin that registers it with --plugin"]


def test_a_taken_or_malformed_kind_is_refused_in_one_line_and_leaves_nothing(ringnet, tmp_path):
    from orchestrator.spec.lab import StarSpec

    with pytest.raises(SpecError, match=r"^topology kind star is registered already \(built-in\): pick another name$"):
        register_topology(StarSpec, lambda spec, data, links: None)
    with pytest.raises(SpecError, match="a pydantic model with a field `kind"):
        register_topology(dict, lambda spec, data, links: None)
    with pytest.raises(TopologyError, match="at most 16 lower-case letters and digits"):
        register_kind(TopologyKind("Bad_Name", lambda spec, data, links: None))
    with pytest.raises(SpecError, match="built in"):
        unregister_topology("bcube")
    # a plugin that registers a kind and then fails leaves neither the kind nor its model
    broken = tmp_path / "broken.py"
    broken.write_text(EXAMPLE.read_text().replace("ringnet", "brokennet").replace("RingNetSpec", "BrokenSpec")
                      + "\nraise RuntimeError('half way')\n")
    with pytest.raises(PluginError, match=r"broken.py:\d+: RuntimeError: half way"):
        plugins.load_file(broken)
    assert "brokennet" not in KINDS and "brokennet" not in TOPOLOGY_SPECS
    with pytest.raises(SpecError, match="unknown kind 'brokennet'"):
        validate(LabSpec, {"name": "x", "topology": {"kind": "brokennet", "routers": 3, "servers_per_router": 1}},
                 "x.yaml")


def test_forgetting_a_kind_makes_its_lab_files_unknown_again(tmp_path):
    plugin = tmp_path / "ringnet.py"
    shutil.copy(EXAMPLE, plugin)
    plugin.chmod(0o644)
    plugins.load_file(plugin)
    try:
        assert "ringnet" in shorthand()
    finally:
        unregister_topology("ringnet")
        plugins._files.pop(plugin.resolve(), None)
    assert "ringnet" not in shorthand() and "ringnet" not in KINDS
    with pytest.raises(SpecError, match="unknown topology kind ringnet"):
        lab_from_argument("ringnet,3,1")


def test_an_experiment_names_the_plugin_of_its_labs_kind(tmp_path):
    from orchestrator.spec.experiment import load_experiment

    shutil.copy(EXAMPLE, tmp_path / "ringnet.py")
    (tmp_path / "ringnet.py").chmod(0o644)
    experiment = tmp_path / "e.yaml"
    experiment.write_text("name: e\nplugins: [ringnet.py]\n"
                          "lab: {name: rn, topology: {kind: ringnet, routers: 3, servers_per_router: 2}}\n"
                          "agents: {algorithms: [ring], workload: {kind: back-to-back, size: 1MB}}\n")
    try:
        assert load_experiment(experiment).lab.topology.kind == "ringnet"
    finally:
        unregister_topology("ringnet")
        plugins._files.pop((tmp_path / "ringnet.py").resolve(), None)


def test_check_algorithm_of_a_topology_only_plugin_says_so(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "ringnet.py")
    done = subprocess.run([str(BIN / "testbed"), "check-algorithm", str(tmp_path / "ringnet.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "registers no algorithm (a topology kind only?)" in done.stderr, done.stderr
