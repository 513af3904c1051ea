"""The `graph` topology kind (issue 30): any network of servers, l2 and l3 switches from a lab
file, GraphML or node-link JSON; addressed and routed (shortest paths, ECMP at l3 switches)
so that every server reaches every other; a malformed graph refused in one line."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from orchestrator import topology as topology_lib
from orchestrator.errors import SpecError
from orchestrator.spec import load_lab
from orchestrator.spec.lab import LabSpec
from orchestrator.spec.loader import validate
from tests.unit.test_hostile_corpus import refused, run_testbed

ROOT = Path(__file__).resolve().parents[2]
CLOS = ROOT / "topologies" / "clos-2tier.yaml"


def graph_lab(topology: dict, source: str = "lab.yaml") -> LabSpec:
    return validate(LabSpec, {"name": "g", "topology": {"kind": "graph", **topology}}, source)


def all_pairs_routed(topology) -> bool:
    servers = [s.name for s in topology.servers]
    return all(topology.path(a, b)[-1] == b for a, b in itertools.permutations(servers, 2))


def test_the_ready_clos_is_routed_with_ecmp_and_its_slow_uplink():
    topology = topology_lib.from_lab(load_lab(CLOS))
    assert [s.name for s in topology.servers] == [f"h{i}" for i in range(8)]  # ranks in the file's order
    assert all_pairs_routed(topology)
    assert len(topology.lookup("leaf0", topology.address_of("h5"))) == 2  # over both spines
    assert topology.rate_of("leaf0", "spine1", 1e8) == topology.rate_of("spine1", "leaf0", 1e8) == 50e6
    assert topology.rate_of("leaf0", "spine0", 1e8) == 1e8
    assert topology.facts["groups"] == [[f"h{i}" for i in range(4)], [f"h{i}" for i in range(4, 8)]]


def test_graphml_and_node_link_json_give_the_same_network(tmp_path):
    from_yaml = topology_lib.from_lab(load_lab(CLOS))
    (tmp_path / "lab.yaml").write_text("name: g\ntopology: {kind: graph, file: clos.graphml}\n")
    (tmp_path / "clos.graphml").write_bytes((ROOT / "topologies" / "clos-2tier.graphml").read_bytes())
    from_graphml = topology_lib.from_lab(load_lab(tmp_path / "lab.yaml"))
    import networkx as nx

    g = nx.read_graphml(tmp_path / "clos.graphml")
    (tmp_path / "clos.json").write_text(json.dumps(nx.node_link_data(g, edges="links")))
    (tmp_path / "lab2.yaml").write_text("name: g\ntopology: {kind: graph, file: clos.json}\n")
    from_json = topology_lib.from_lab(load_lab(tmp_path / "lab2.yaml"))
    for other in (from_graphml, from_json):
        assert sorted(map(str, other.links)) == sorted(map(str, from_yaml.links))
        assert other.rates == from_yaml.rates
        assert all_pairs_routed(other)


@pytest.mark.parametrize("graph", [
    {"servers": ["a", "b", "c"], "l2": ["s0", "s1"], "links": [["a", "s0"], ["b", "s0"], ["c", "s1"], ["s0", "s1"]]},
    {"servers": ["a", "b", "c", "d"], "l2": ["s0"], "l3": ["r0", "r1"],
     "links": [["a", "s0"], ["b", "s0"], ["s0", "r0"], ["r0", "r1"], ["c", "r1"], ["d", "r1"]]},
    {"servers": ["a", "b"], "l3": ["r0", "r1", "r2", "r3"],  # a ring of routers: two ways round
     "links": [["a", "r0"], ["b", "r2"], ["r0", "r1"], ["r1", "r2"], ["r2", "r3"], ["r3", "r0"]]},
], ids=["l2 tree", "segment and access lan", "router ring"])
def test_other_shapes_are_routed_between_every_pair(graph):
    topology = topology_lib.from_lab(graph_lab(graph))
    assert all_pairs_routed(topology)
    if "r3" in topology.nodes:
        assert len(topology.lookup("r0", topology.address_of("b"))) == 2  # both ways round: ECMP


MALFORMED = {
    "dangling link": ({"servers": ["a"], "l2": ["s"], "links": [["a", "s"], ["s", "x"]]},
                      "link s-x: x is no node of the graph (a dangling link)"),
    "duplicate node": ({"servers": ["a", "b"], "l2": ["a"], "links": [["a", "b"]]},
                       "node a is listed twice (server and l2)"),
    "server without a link": ({"servers": ["a", "b"], "l2": ["s"], "links": [["a", "s"]]},
                              "server b has no link: wire it to a switch"),
    "two NICs on one segment": ({"servers": ["a"], "l2": ["s", "t"], "links": [["a", "s"], ["a", "t"], ["s", "t"]]},
                                "server a has 2 ports on the l2 segment of"),
    "servers wired together": ({"servers": ["a", "b"], "links": [["a", "b"]]},
                               "link a-b joins two servers and neither relays"),
    "relay not a server": ({"servers": ["a"], "l2": ["s"], "links": [["a", "s"]], "relays": ["s"]},
                           "relays: s is no server of the graph"),
    "l2 loop": ({"servers": ["a"], "l2": ["s", "t", "u"], "links": [["a", "s"], ["s", "t"], ["t", "u"], ["u", "s"]]},
                "closes a loop of l2 switches"),
    "link twice": ({"servers": ["a"], "l2": ["s"], "links": [["a", "s"], ["s", "a"]]}, "is listed twice"),
    "bad name": ({"servers": ["A b"], "l2": ["s"], "links": [["A b", "s"]]}, "topology.servers: 'A b' is not a valid value: node names are"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_graph_is_refused_in_one_line(tmp_path, case):
    graph, expected = MALFORMED[case]
    (tmp_path / "lab.yaml").write_text(json.dumps({"name": "g", "topology": {"kind": "graph", **graph}}))
    done, _ = run_testbed("topology", "lab.yaml", cwd=tmp_path)
    assert expected in refused(done, "lab.yaml: topology")


@pytest.mark.parametrize("graph, expected", [
    ({"servers": ["a", "b"], "l2": ["s", "t"], "links": [["a", "s"], ["b", "t"]]},
     "server a cannot reach b: no l3 switch or relay forwards between their LANs"),
    ({"servers": ["a", "b"], "l3": ["r", "q"], "links": [["a", "r"], ["b", "q"]]}, "server a cannot reach b"),
    # c is on both LANs but does not relay: a and b still cannot meet through it
    ({"servers": ["a", "b", "c"], "l2": ["s", "t"], "links": [["a", "s"], ["c", "s"], ["c", "t"], ["b", "t"]]},
     "server a cannot reach b"),
    ({"servers": ["a", "b"], "l2": ["s"], "l3": ["r", "q"], "links": [["a", "s"], ["b", "s"], ["s", "r"], ["s", "q"]]},
     "has 2 l3 switches"),
])
def test_graphs_whose_servers_cannot_all_meet_are_refused(graph, expected):
    with pytest.raises(SpecError, match=expected):  # when the file is read, before anything is built
        graph_lab(graph)


def test_graph_files_are_untrusted_input(tmp_path):
    (tmp_path / "bad.graphml").write_text("<graphml><graph><node id='a'/></graph")
    (tmp_path / "role.json").write_text(json.dumps({"nodes": [{"id": "a", "role": "router"}], "links": []}))
    with open(tmp_path / "big.json", "wb") as handle:
        handle.truncate(5 << 20)
    for name, expected in (("bad.graphml", "not a graph this lab reads"), ("role.json", "node a has role 'router'"),
                           ("big.json", "more than the 4,194,304"), ("gone.json", "no such file"),
                           ("lab.txt", "not a graph this lab reads")):
        (tmp_path / "lab.txt").write_text("x")
        # through the real command, under the hostile corpus's 1 GiB data limit
        (tmp_path / "lab.yaml").write_text(json.dumps({"name": "g", "topology": {"kind": "graph", "file": name}}))
        done, _ = run_testbed("topology", "lab.yaml", cwd=tmp_path)
        assert expected in refused(done, "lab.yaml: topology")
    with pytest.raises(SpecError, match="file: gives the whole graph"):
        validate(LabSpec, {"name": "g", "topology": {"kind": "graph", "file": "x.json", "servers": ["a"]}}, "lab.yaml")


def test_an_l3_switch_with_two_ports_on_one_segment_is_refused():
    with pytest.raises(SpecError, match="l3 switch r1 has 2 ports on the l2 segment"):
        graph_lab({"servers": ["h1", "h2", "h3"], "l2": ["s1", "s2"], "l3": ["r1", "r2"],
                   "links": [["h1", "s1"], ["s1", "s2"], ["r1", "s1"], ["r1", "s2"], ["h2", "s2"], ["h3", "r2"],
                             ["r1", "r2"]]})


def test_a_graph_has_a_short_label_for_run_ids_and_keys():
    from orchestrator.experiment.sweep import LabVariant

    label = LabVariant(0, load_lab(CLOS)).topology
    assert label.startswith("graph-8s-") and len(label) == len("graph-8s-") + 8


def test_a_graph_file_stays_beside_its_lab_file(tmp_path):
    inside = tmp_path / "labs"
    inside.mkdir()
    (tmp_path / "net.json").write_text(json.dumps({"nodes": [], "links": []}))
    (inside / "link.json").symlink_to(tmp_path / "net.json")
    for name, expected in (("../net.json", "leaves the lab file's directory"), ("link.json", "leaves"),
                           (str(tmp_path / "net.json"), "absolute path")):
        with pytest.raises(SpecError, match=expected):
            validate(LabSpec, {"name": "g", "topology": {"kind": "graph", "file": name}}, str(inside / "lab.yaml"))


DRAWN_BCUBE = ROOT / "topologies" / "bcube-3-1-drawn.yaml"


def test_servers_relay_where_the_file_says_so_and_nowhere_else(tmp_path):
    topology = topology_lib.from_lab(load_lab(DRAWN_BCUBE))
    servers = [s.name for s in topology.servers]
    assert all(topology.nodes[s].forwards for s in servers) and all_pairs_routed(topology)
    assert [len(topology.nodes[s].data_nics()) for s in servers] == [2] * 9
    # to h11's primary NIC (level 0, group 1): over level 1 to h10, which relays it
    assert topology.path("h00", "h11") == ["h00", "s1_0", "h10", "s0_1", "h11"]
    relays_on_the_way = {len([n for n in topology.path(a, b)[1:-1] if n in servers])
                         for a, b in itertools.permutations(servers, 2)}
    assert relays_on_the_way == {0, 1}
    # without `relays:` nothing joins the levels: refused when the file is read
    text = DRAWN_BCUBE.read_text()
    (tmp_path / "lab.yaml").write_text("\n".join(line for line in text.splitlines() if "relays:" not in line))
    with pytest.raises(SpecError, match="server h00 cannot reach h10: no l3 switch or relay forwards"):
        load_lab(tmp_path / "lab.yaml")


def test_a_dual_homed_server_that_does_not_relay_is_on_no_path_and_sends_over_both_nics():
    topology = topology_lib.from_lab(graph_lab({
        "servers": ["a", "b", "c", "d"], "l3": ["r1", "r2", "r3"],
        "links": [["d", "r1"], ["a", "r1"], ["b", "r2"], ["c", "r3"], ["d", "r2"], ["r1", "r3"], ["r2", "r3"]]}))
    assert all_pairs_routed(topology)
    assert not topology.nodes["d"].forwards
    assert all("d" not in topology.path(x, y) for x, y in itertools.permutations("abc", 2))
    assert topology.path("a", "b") == ["a", "r1", "r3", "r2", "b"]  # not the shorter way through d
    hops = topology.lookup("d", topology.address_of("c"))
    assert sorted(hop.dev for hop in hops) == ["d-eth0", "d-eth1"]  # ECMP over its own two NICs
    assert topology.address_of("d") in topology.nodes["d"].interfaces["d-eth0"].address.network  # first link


def test_a_wire_between_two_servers_carries_what_the_relay_forwards(tmp_path):
    from orchestrator.cost.routes import Routes

    graph = {"directed": False, "multigraph": False, "graph": {},
             "nodes": [{"id": "a", "role": "server", "relay": True}, {"id": "b", "role": "server"},
                       {"id": "c", "role": "server"}, {"id": "s", "role": "l2"}],
             "links": [{"source": "a", "target": "s"}, {"source": "c", "target": "s"},
                       {"source": "a", "target": "b", "bandwidth": "40Mbit"}]}
    (tmp_path / "wire.json").write_text(json.dumps(graph))
    (tmp_path / "lab.yaml").write_text("name: g\ntopology: {kind: graph, file: wire.json}\n")
    topology = topology_lib.from_lab(load_lab(tmp_path / "lab.yaml"))
    assert topology.facts["relays"] == ["a"] and all_pairs_routed(topology)
    assert topology.path("c", "b") == ["c", "s", "a", "b"]
    routes = Routes(topology)
    used = {str(routes.directions[index]) for index, _ in routes.usage("c", "b")[0]}
    assert used == {"c→s", "s→a", "a→b"}
    assert topology.rate_of("a", "b", 1e8) == 40e6
    graph["nodes"][0]["relay"] = "yes"
    (tmp_path / "wire.json").write_text(json.dumps(graph))
    with pytest.raises(SpecError, match="node a has relay 'yes': give true or false"):
        load_lab(tmp_path / "lab.yaml")
