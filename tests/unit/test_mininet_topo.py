"""The Mininet Topo of a topology has the same nodes, links and interface names."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from orchestrator import topology
from orchestrator.topology.kinds import shorthand
from orchestrator.topology.mininet_topo import BridgeSwitch, RouterSwitch, TestbedHost, to_mininet
from types import SimpleNamespace

CASES = {
    "bcube": (4, 1), "fattree": (4,), "torus": (3, 2), "bigraph": (4, 2), "leafspine": (3, 2, 2), "star": (5,),
}


def _build(kind: str, values):
    return topology.build(SimpleNamespace(kind=kind, **dict(zip(shorthand()[kind], values))))


@pytest.mark.parametrize("kind", sorted(CASES))
def test_same_nodes_and_links(kind):
    topo = _build(kind, CASES[kind])
    mn = to_mininet(topo)
    assert sorted(mn.hosts()) == sorted(s.name for s in topo.servers)
    assert sorted(mn.switches()) == sorted(s.name for s in topo.switches)
    ours = sorted(tuple(sorted([(l.a.node, l.a.interface), (l.b.node, l.b.interface)])) for l in topo.links)
    theirs = sorted(
        tuple(sorted([(a, info["intfName1"]), (b, info["intfName2"])]))
        for a, b, info in mn.links(withInfo=True)
    )
    assert theirs == ours
    for switch in topo.switches:
        cls = mn.nodeInfo(switch.name)["cls"]
        assert cls is (BridgeSwitch if switch.kind == "l2" else RouterSwitch)
    for server in topo.servers:
        info = mn.nodeInfo(server.name)
        assert info["cls"] is TestbedHost
        assert info["addresses"] == {i.name: str(i.address) for i in server.data_nics()}


def test_shaped_links_carry_bandwidth():
    mn = to_mininet(_build("star", (3,)), bandwidth_mbit=100)
    assert {info["bw"] for _, _, info in mn.links(withInfo=True)} == {100}


def test_custom_file_offers_every_kind():
    path = Path(__file__).resolve().parents[2] / "topologies" / "mn_custom.py"
    namespace = runpy.run_path(str(path))
    assert set(namespace["topos"]) == set(shorthand())
    mn = namespace["topos"]["bcube"](3, 1)
    assert len(mn.hosts()) == 9 and len(mn.switches()) == 6
