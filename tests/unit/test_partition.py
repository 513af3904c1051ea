"""Splitting a lab over hosts (issue 31, topology/partition.py): every kind placed with its
servers shared out evenly, structure kept whole where the kind says so (BCube level-0 groups,
Fat-Tree pods, torus slabs), any other graph cut by Kernighan–Lin on link weights, and hosts
whose underlay cannot carry what crosses refused in one line."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import topology as topology_lib
from orchestrator.errors import TopologyError
from orchestrator.spec import LabSpec, lab_from_argument, validate
from orchestrator.topology.partition import BALANCE, Host, check_underlay, place
from tests.unit.test_hostile_corpus import refused, run_testbed


def lab(argument: str):
    return topology_lib.from_lab(lab_from_argument(argument))


def hosts(count: int, **kwargs) -> list[Host]:
    return [Host(f"h{i}", **kwargs) for i in range(count)]


@pytest.mark.parametrize("argument", ["bcube,4,1", "bcube,3,2", "fattree,4", "fattree,6", "torus,4,2", "torus,5,1",
                                      "bigraph,4,2", "leafspine,3,2,3", "star,7", "topologies/clos-2tier.yaml",
                                      "topologies/bcube-3-1-drawn.yaml"])
@pytest.mark.parametrize("count", [2, 3, 4])
def test_every_node_is_placed_and_servers_are_shared_out(argument, count):
    topology = lab(argument)
    placement = place(topology, hosts(count))
    assert set(placement.host_of) == set(topology.nodes)
    per_host = Counter(placement.host_of[s.name] for s in topology.servers)
    assert set(per_host) == {f"h{i}" for i in range(count)}  # every host runs servers
    assert max(per_host.values()) <= BALANCE * math.ceil(len(topology.servers) / count)


def test_bcube_groups_stay_whole_and_only_upper_levels_cross():
    topology = lab("bcube,4,1")
    placement = place(topology, hosts(2))
    assert placement.method == "blocks"
    for group in topology.facts["groups"][0]:  # level-0 switches' servers
        assert len({placement.host_of[s] for s in group}) == 1
    for link in placement.crossing(topology):
        switch = next(n for n in link.nodes() if not topology.nodes[n].is_server)
        assert topology.nodes[switch].attrs["level"] == 1
    assert Counter(placement.host_of[s.name] for s in topology.switches) == {"h0": 4, "h1": 4}


def test_fattree_pods_stay_whole_and_cores_are_shared():
    topology = lab("fattree,4")
    placement = place(topology, hosts(2))
    for pod in range(4):
        assert len({placement.host_of[n.name] for n in topology.nodes.values() if n.attrs.get("pod") == pod}) == 1
    cores = [n.name for n in topology.switches if n.attrs.get("layer") == "core"]
    assert Counter(placement.host_of[c] for c in cores) == {"h0": 2, "h1": 2}
    assert len(placement.crossing(topology)) == 8  # half of the 16 core links


def test_a_torus_is_cut_between_slabs():
    topology = lab("torus,4,2")
    placement = place(topology, hosts(2))
    crossing = placement.crossing(topology)
    assert len(crossing) == 8  # slabs 1|2 and 3|0 (the wrap), four rings each
    for link in crossing:
        a, b = (topology.nodes[n].attrs["coords"] for n in link.nodes())
        assert a[1] == b[1] and a[0] != b[0]  # only dimension-0 links cross


def test_link_weights_steer_the_cut():
    ring = {"kind": "graph", "servers": ["a", "b", "c", "d"], "l3": ["r0", "r1", "r2", "r3"],
            "links": [["a", "r0"], ["b", "r1"], ["c", "r2"], ["d", "r3"],
                      ["r0", "r1"], ["r1", "r2"], ["r2", "r3"], ["r3", "r0"]]}
    topology = topology_lib.from_lab(validate(LabSpec, {"name": "ring", "topology": ring}, "lab.yaml"))
    heavy = {("r0", "r1"): 1e9, ("r2", "r3"): 1e9}
    for pairs, together in ((heavy, [("r0", "r1"), ("r2", "r3")]),
                            ({("r1", "r2"): 1e9, ("r3", "r0"): 1e9}, [("r1", "r2"), ("r3", "r0")])):
        weights = {**{(a, b): 1.0 for a, b in [l.nodes() for l in topology.links]}, **pairs}
        placement = place(topology, hosts(2), weights=weights)
        assert placement.method == "kernighan-lin"
        for a, b in together:
            assert placement.host_of[a] == placement.host_of[b], (pairs, dict(placement.host_of))


def test_hosts_that_cannot_carry_the_lab_are_refused_in_one_line():
    topology = lab("fattree,4")
    with pytest.raises(TopologyError, match="17 hosts for 16 servers: every host runs servers; list at most 16"):
        place(topology, hosts(17))
    placement = place(topology, hosts(2, nic_bps=10e9, mtu=9000))
    shares = check_underlay(topology, placement, 1e9, 1500)
    assert [s.crossing for s in shares] == [8, 8]
    assert shares[0].out_bps == pytest.approx(8 * 1e9 * 1550 / 1500)  # VXLAN's 50 bytes a packet
    with pytest.raises(TopologyError, match="host h0: its 8 links to other hosts may carry 8.27 Gbit/s each way"):
        check_underlay(topology, place(topology, hosts(2, nic_bps=1e9, mtu=9000)), 1e9, 1500)
    with pytest.raises(TopologyError, match="host h0: mtu 1500 .* below the lab's links.mtu 1500 \\+ 50 bytes"):
        check_underlay(topology, placement.__class__(tuple(hosts(2)), placement.host_of, "blocks"), 1e9, 1500)


def test_testbed_topology_hosts_prints_the_split_and_refuses_bad_hosts_files(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: rack1, address: 192.0.2.1, nic: 10Gbit, mtu: 9000}\n"
                                         "  - {name: rack2, address: 192.0.2.2, nic: 10Gbit, mtu: 9000}\n")
    done, _ = run_testbed("topology", "bcube,4,1", "--hosts", "hosts.yaml", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["method"] == "blocks" and [h["servers"] for h in shown["hosts"]] == [8, 8]
    assert Counter(shown["host_of"].values()) == {"rack1": 12, "rack2": 12}
    for text, expected in (
        ("hosts:\n  - {name: a, address: 192.0.2.1}\n  - {name: a, address: 192.0.2.2}\n",
         "hosts.yaml: hosts.1.name: a is host 0's already"),
        ("hosts:\n  - {name: a, address: 192.0.2.1, nic: 1Gbit, mtu: 9000}\n"
         "  - {name: b, address: 192.0.2.2, mtu: 9000}\n", "hosts.yaml: host a: its 8 links to other hosts"),
        ("hosts: []\n", "hosts.yaml: hosts:"),
    ):
        (tmp_path / "hosts.yaml").write_text(text)
        done, _ = run_testbed("topology", "bcube,4,1", "--hosts", "hosts.yaml", cwd=tmp_path)
        assert expected in refused(done, "hosts.yaml")


# -- the model sees the underlay ----------------------------------------------------------------
def predicted(argument: str, hosts_=None, algorithm: str = "mesh"):
    from orchestrator.cost.report import predict_lab

    return predict_lab(lab_from_argument(argument), algorithm, 25 << 20, hosts=hosts_).prediction


def test_a_host_nic_that_binds_is_predicted_as_the_bottleneck():
    alone = predicted("fattree,4")
    wide = predicted("fattree,4", hosts(2, nic_bps=100e9, mtu=9000))
    assert wide.per_run == pytest.approx(alone.per_run)  # a NIC that never binds changes nothing
    narrow = predicted("fattree,4", hosts(2, nic_bps=1e9, mtu=9000))
    assert narrow.per_run > 3 * alone.per_run
    assert {load.link for load in narrow.bottlenecks()} == {"h0 NIC→underlay", "underlay→h0 NIC",
                                                            "h1 NIC→underlay", "underlay→h1 NIC"}
    # what crosses h0's NIC out is what its links to h1's nodes carry (the hairpins through
    # a core on the other host twice): the model's own link bytes, summed here by hand
    topology = lab("fattree,4")
    placement = place(topology, hosts(2))
    by_link = narrow.link_bytes
    out_of_h0 = sum(by_link.get(f"{a}→{b}", 0.0) for link in placement.crossing(topology)
                    for a, b in (link.nodes(), link.nodes()[::-1])
                    if placement.host_of[a] == "h0")
    assert by_link["h0 NIC→underlay"] == pytest.approx(out_of_h0)
    assert out_of_h0 > 64 * 2 * (25 << 20) / 16  # more than the 64 pairs that cross once: hairpins


def test_pinned_paths_cross_the_nics_too():
    from orchestrator.cost.routes import Routes

    topology = lab("bcube,2,1")
    placement = place(topology, hosts(2, nic_bps=1e9, mtu=9000))
    routes = Routes(topology, pinned={("h00", topology.address_of("h11")): topology.path("h00", "h11")},
                    underlay=placement.underlay(1500))
    names = {str(routes.directions[i]) for i, _ in routes.usage("h00", "h11")[0]}
    here, there = placement.host_of["h00"], placement.host_of["h11"]
    assert here != there and {f"{here} NIC→underlay", f"underlay→{there} NIC"} <= names


def test_predict_with_hosts_refuses_an_underlay_mtu_in_one_line(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n")
    done, _ = run_testbed("predict", "fattree,4", "-a", "ring", "--hosts", "hosts.yaml", cwd=tmp_path)
    assert "host a: mtu 1500 (the underlay's) is below the lab's links.mtu 1500 + 50" in refused(done, "")


def test_the_cut_may_be_weighed_by_an_algorithms_predicted_bytes(tmp_path):
    import shutil

    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: a, address: 192.0.2.1, mtu: 9000}\n"
                                         "  - {name: b, address: 192.0.2.2, mtu: 9000}\n")
    shutil.copy(Path(__file__).resolve().parents[2] / "topologies" / "clos-2tier.yaml", tmp_path / "clos.yaml")
    done, _ = run_testbed("topology", "clos.yaml", "--hosts", "hosts.yaml", "-a", "ring", "--size", "4MB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "weighed by ring's predicted bytes" in " ".join(done.stdout.split())
    done, _ = run_testbed("topology", "clos.yaml", "-a", "ring", cwd=tmp_path)
    assert "--algorithm: weighs the cut of --hosts: give --hosts FILE too" in refused(done, "")
