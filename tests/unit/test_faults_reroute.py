"""Routes around dead links, checked by walking the routing tables as the kernel would
hold them after the fault: every live server address stays reachable, without loops."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import replace

import pytest

from orchestrator.spec import lab_from_argument
from orchestrator.topology import Topology, from_lab
from orchestrator.topology.model import Endpoint, Route
from orchestrator.topology.reroute import _overrides, dead_ends, destinations, overrides

SHAPES = ["fattree,4", "bcube,4,1", "bcube,2,1", "bcube,3,2", "torus,4,2", "torus,3,2", "bigraph,4,2",
          "leafspine,3,2,2", "star,3"]


def topology(shorthand: str) -> Topology:
    return from_lab(lab_from_argument(shorthand))


def after_fault(topo: Topology, dead) -> Topology:
    """The network as the kernel holds it once `dead` links are down and the overrides are
    in: routes through a dead end lose that hop (gone if none is left), connected routes
    of dead interfaces vanish, the overrides replace routes of the same prefix."""
    cut = dead_ends(dead)
    nodes = {}
    for name, node in topo.nodes.items():
        interfaces = {
            i.name: (replace(i, address=None) if Endpoint(name, i.name) in cut else i) for i in node.interfaces.values()
        }
        nodes[name] = replace(node, interfaces=interfaces)
    extra = overrides(topo, dead)
    routes = {}
    for name in topo.nodes:
        table = {}
        for route in topo.routes_of(name):
            hops = tuple(h for h in route.nexthops if Endpoint(name, h.dev) not in cut)
            if hops:
                table[route.prefix] = Route(route.prefix, hops)
        for prefix, hops in extra.get(name, {}).items():
            table[prefix] = Route(prefix, hops)
        routes[name] = list(table.values())
    links = [link for link in topo.links if link not in dead]
    return Topology(topo.kind, topo.params, nodes, links, routes, topo.facts)


def reachable_by_graph(topo: Topology, dead) -> set[tuple[str, ipaddress.IPv4Address]]:
    """(source, address) pairs the surviving network connects at all (ignoring routing)."""
    from orchestrator.topology.reroute import adjacency, distances

    graph = adjacency(topo, dead)
    pairs = set()
    for owner, address in destinations(topo, dead):
        dist = distances(topo, graph, owner)
        pairs |= {(s.name, address) for s in topo.servers if s.name in dist and s.name != owner}
    return pairs


def assert_routes_reach_everything_reachable(topo: Topology, dead) -> None:
    walked = after_fault(topo, dead)
    expected = reachable_by_graph(topo, dead)
    assert expected, "the fault left nothing to check"
    for src, address in sorted(expected):
        walked.paths(src, address)  # raises RoutingError on a black hole or a loop


@pytest.mark.parametrize("shorthand", SHAPES)
def test_a_topologys_own_routes_need_no_override(shorthand):
    assert _overrides(topology(shorthand), []) == {}


@pytest.mark.parametrize("shorthand", ["fattree,4", "bcube,2,1", "bcube,3,1", "torus,3,2", "bigraph,4,2",
                                       "leafspine,3,2,2", "star,3"])
def test_every_single_dead_link_is_routed_around(shorthand):
    topo = topology(shorthand)
    # Fat-Tree's pods are alike: pod 0's links (host, edge-agg, agg-core) stand for all
    links = [l for l in topo.links if any(n.startswith("p0") for n in l.nodes())] if "fattree" in shorthand else topo.links
    for link in links:
        assert_routes_reach_everything_reachable(topo, [link])


@pytest.mark.parametrize("shorthand", ["fattree,4", "bcube,3,2", "bcube,4,1", "torus,4,2", "bigraph,4,2"])
def test_random_sets_of_dead_links_are_routed_around(shorthand):
    topo, rng = topology(shorthand), random.Random(17)
    for _ in range(4):
        dead = rng.sample(topo.links, 3)
        expected = reachable_by_graph(topo, dead)
        walked = after_fault(topo, dead)
        for src, address in sorted(expected):
            walked.paths(src, address)


def test_fattree_core_link_down_takes_the_core_out_of_the_ecmp_groups_towards_that_pod():
    topo = topology("fattree,4")
    link = next(l for l in topo.links if set(l.nodes()) == {"p0a0", "c0"})
    extra = overrides(topo, [link])
    pod0 = {ipaddress.IPv4Network(a) for owner, a in destinations(topo, [link]) if owner.startswith("p0")}
    c0_hop = topo.lookup("p1a0", topo.address_of("p0e0h0"))
    assert len(c0_hop) == 2  # p1a0 spreads over c0 and c1 before the fault
    for pod in ("p1a0", "p2a0", "p3a0"):
        assert set(extra[pod]) == pod0
        for hops in extra[pod].values():
            assert [topo.owner(h.via).node for h in hops] == ["c1"]


def test_bcube_detours_over_a_parallel_path_when_a_server_link_dies():
    topo = topology("bcube,4,1")
    link = next(l for l in topo.links if set(l.nodes()) == {"h00", "l0s0"})
    walked = after_fault(topo, [link])
    level1 = topo.nodes["h00"].interfaces["h00-eth1"].address.ip
    path = walked.path("h01", level1)
    assert path[0] == "h01" and path[-1] == "h00" and "l0s0" not in path
    assert len([n for n in path if topo.nodes[n].is_server]) == 4  # h01 → h11 → h10 → h00
