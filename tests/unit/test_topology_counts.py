"""Topology inventories against the papers' formulas (REFERENCE.md section 1).

Every expectation here is derived from the construction in REFERENCE.md (BCube in Guo et
al.'s notation, Al-Fares fat-tree, k-ary d-cube torus, EFLOPS BiGraph) or, for leaf-spine
and star, from the obvious analogous construction; graphs for the independent checks are
built here from `Topology.links`, not with describe.graph.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import TopologyError
from orchestrator.topology import Endpoint, describe

# -- sizes ---------------------------------------------------------------------------------

BCUBE = st.tuples(st.integers(2, 5), st.integers(0, 2))
FATTREE = st.sampled_from([2, 4, 6, 8])
TORUS = st.tuples(st.integers(2, 6), st.integers(1, 3)).filter(lambda kd: kd[0] ** kd[1] <= 216)
BIGRAPH = st.tuples(st.sampled_from([2, 4, 6, 8]), st.integers(1, 4))
LEAFSPINE = st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4))
STAR = st.integers(1, 40)

SETTINGS = settings(max_examples=25, deadline=None)


def own_graph(topology) -> nx.MultiGraph:
    g = nx.MultiGraph()
    g.add_nodes_from(topology.nodes)
    for link in topology.links:
        g.add_edge(link.a.node, link.b.node)
    return g


def server_names(topology) -> list[str]:
    return [s.name for s in topology.servers]


def true_diameter(topology) -> int:
    """Max over ALL ordered server pairs of the shortest-path length in links."""
    g = nx.Graph(own_graph(topology))
    names = server_names(topology)
    best = 0
    for src in names:
        lengths = nx.single_source_shortest_path_length(g, src)
        best = max([best] + [lengths[dst] for dst in names if dst != src])
    return best


def ports(node) -> list:
    """Interfaces that are plugged into a wire (everything but the bridge device)."""
    return [i for i in node.interfaces.values() if not i.is_bridge]


def check_links_are_well_formed(topology) -> None:
    seen = set()
    for link in topology.links:
        assert link.a.node != link.b.node, link
        for end in (link.a, link.b):
            assert end.node in topology.nodes, end
            assert end.interface in topology.nodes[end.node].interfaces, end
            assert end not in seen, f"{end} is plugged into two links"
            seen.add(end)
            assert topology.peer(end) == link.other(end.node)
    # every non-bridge interface carries exactly one wire
    for node in topology.nodes.values():
        for iface in ports(node):
            assert (node.name, iface.name) in {(e.node, e.interface) for e in seen}, iface


def check_summary(topology, servers, switches, links, nics, diameter, relaying) -> None:
    summary = describe.summary(topology)
    assert summary["servers"] == servers == len(topology.servers)
    assert summary["switches"] == switches == len(topology.switches)
    assert summary["links"] == links == len(topology.links)
    assert summary["nics_per_server"] == nics
    assert (summary["diameter_links"], summary["diameter_switches"]) == diameter
    assert summary["relaying_servers"] is relaying
    for server in topology.servers:
        assert len(server.data_nics()) == nics, server.name
        assert len(ports(server)) == nics, server.name
    check_links_are_well_formed(topology)


# -- BCube(n, k), Guo notation -------------------------------------------------------------


@SETTINGS
@given(size=BCUBE)
def test_bcube_counts(topo, size):
    n, k = size
    t = topo("bcube", n=n, k=k)
    check_summary(
        t,
        servers=n ** (k + 1),
        switches=(k + 1) * n**k,
        links=(k + 1) * n ** (k + 1),
        nics=k + 1,
        diameter=(2 * (k + 1), k + 1),  # k+1 digits to correct, one switch and two links each
        relaying=k > 0,
    )
    assert describe.summary(t)["switches_by_kind"] == {"l2": (k + 1) * n**k}


@SETTINGS
@given(size=BCUBE)
def test_bcube_structure(topo, size):
    """Level-l switch joins the n servers that differ only in digit l; NIC l on port a_l."""
    n, k = size
    t = topo("bcube", n=n, k=k)
    digits = {s.name: tuple(s.attrs["digits"]) for s in t.servers}
    assert sorted(digits.values()) == list(itertools.product(range(n), repeat=k + 1))
    for link in t.links:
        ends = {t.nodes[link.a.node].is_server, t.nodes[link.b.node].is_server}
        assert ends == {True, False}, "BCube switches connect only servers"
    for switch in t.switches:
        level = switch.attrs["level"]
        members = []
        for port in ports(switch):
            far = t.peer(Endpoint(switch.name, port.name))
            assert far is not None and t.nodes[far.node].is_server, port.name
            nic = t.nodes[far.node].interfaces[far.interface]
            assert nic.level == level
            address = digits[far.node]
            # server port l attaches to switch port a_l
            assert int(re.search(r"eth(\d+)$", port.name)[1]) == address[k - level]
            members.append(address)
        assert len(members) == n
        assert {a[k - level] for a in members} == set(range(n))
        rest = {a[: k - level] + a[k - level + 1 :] for a in members}
        assert len(rest) == 1, f"{switch.name} joins servers differing outside digit {level}"


@settings(max_examples=15, deadline=None)
@given(size=BCUBE)
def test_bcube_one_switch_apart_iff_one_digit_differs(topo, size):
    n, k = size
    t = topo("bcube", n=n, k=k)
    switch_of = {}
    for link in t.links:
        server, switch = (link.a.node, link.b.node) if t.nodes[link.a.node].is_server else (
            link.b.node, link.a.node)
        switch_of.setdefault(server, set()).add(switch)
    for a, b in itertools.combinations(t.servers, 2):
        hamming = sum(x != y for x, y in zip(a.attrs["digits"], b.attrs["digits"]))
        shared = switch_of[a.name] & switch_of[b.name]
        assert (len(shared) == 1) == (hamming == 1), (a.name, b.name)
        assert len(shared) <= 1


@SETTINGS
@given(size=BCUBE)
def test_bcube_groups_fact(topo, size):
    n, k = size
    t = topo("bcube", n=n, k=k)
    groups = t.facts["groups"]
    assert sorted(groups) == list(range(k + 1))
    for level, members in groups.items():
        assert len(members) == n**k
        assert sorted(itertools.chain.from_iterable(members)) == sorted(server_names(t))
        for group in members:
            digits = [t.nodes[name].attrs["digits"] for name in group]
            assert [d[k - level] for d in digits] == list(range(n)), "port order"
            assert len({d[: k - level] + d[k - level + 1 :] for d in digits}) == 1


def test_bcube_notation_is_guo(topo):
    """REFERENCE.md: `bcube n=4 k=1` is 16 servers on 2 levels (Guo), not 4 (HiPS/BML)."""
    t = topo("bcube", n=4, k=1)
    assert len(t.servers) == 16
    assert len(t.switches) == 8
    assert {s.attrs["level"] for s in t.switches} == {0, 1}


# -- Fat-Tree(k) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "hosts", "switches", "links"), [(4, 16, 20, 48), (8, 128, 80, 384)])
def test_fattree_published_numbers(topo, k, hosts, switches, links):
    t = topo("fattree", k=k)
    assert (len(t.servers), len(t.switches), len(t.links)) == (hosts, switches, links)


@SETTINGS
@given(k=FATTREE)
def test_fattree_counts(topo, k):
    t = topo("fattree", k=k)
    check_summary(
        t,
        servers=k**3 // 4,
        switches=5 * k**2 // 4,
        links=3 * k**3 // 4,
        nics=1,
        diameter=(6, 5),  # host-edge-agg-core-agg-edge-host across pods
        relaying=False,
    )
    assert describe.summary(t)["switches_by_kind"] == {"l3": 5 * k**2 // 4}


@SETTINGS
@given(k=FATTREE)
def test_fattree_structure(topo, k):
    half = k // 2
    t = topo("fattree", k=k)
    g = own_graph(t)
    layers = Counter(s.attrs["layer"] for s in t.switches)
    assert layers == {"core": half * half, "aggregation": k * half, "edge": k * half}
    for switch in t.switches:
        assert len(ports(switch)) == k, f"{switch.name}: every fat-tree switch has k ports"
        neighbours = [t.nodes[m] for m in g.neighbors(switch.name)]
        assert len(neighbours) == k
        layer = switch.attrs["layer"]
        if layer == "edge":
            hosts = [m for m in neighbours if m.is_server]
            aggs = [m for m in neighbours if not m.is_server]
            assert len(hosts) == len(aggs) == half
            assert all(m.attrs["layer"] == "aggregation" for m in aggs)
            assert {m.attrs["pod"] for m in hosts + aggs} == {switch.attrs["pod"]}
        elif layer == "aggregation":
            edges = [m for m in neighbours if m.attrs.get("layer") == "edge"]
            cores = [m for m in neighbours if m.attrs.get("layer") == "core"]
            assert len(edges) == len(cores) == half
            assert {m.attrs["pod"] for m in edges} == {switch.attrs["pod"]}
        else:
            assert all(m.attrs["layer"] == "aggregation" for m in neighbours)
            assert sorted(m.attrs["pod"] for m in neighbours) == list(range(k)), \
                "a core reaches every pod exactly once"
    assert len(t.facts["groups"]) == k * half
    assert all(len(group) == half for group in t.facts["groups"])


# -- Torus k-ary d-cube --------------------------------------------------------------------


@SETTINGS
@given(size=TORUS)
def test_torus_counts(topo, size):
    k, d = size
    t = topo("torus", k=k, d=d)
    n = k**d
    check_summary(
        t,
        servers=n,
        switches=0,
        links=d * n if k > 2 else d * n // 2,
        nics=2 * d if k > 2 else d,
        diameter=(d * (k // 2), 0),
        relaying=n > 2,
    )


@SETTINGS
@given(size=TORUS)
def test_torus_neighbours(topo, size):
    """Node x links to x_i ± 1 mod k in every dimension i, and to nothing else."""
    k, d = size
    t = topo("torus", k=k, d=d)
    g = own_graph(t)
    coords = {s.name: tuple(s.attrs["coords"]) for s in t.servers}
    by_coords = {c: name for name, c in coords.items()}
    assert sorted(by_coords) == list(itertools.product(range(k), repeat=d))
    for name, x in coords.items():
        expected = set()
        for i in range(d):
            for delta in (1, -1):
                y = list(x)
                y[i] = (y[i] + delta) % k
                expected.add(by_coords[tuple(y)])
        assert set(g.neighbors(name)) == expected, name
        # one wire per neighbour and direction: 2d wires for k > 2, d for k == 2
        assert g.degree(name) == (2 * d if k > 2 else d)
    for link in t.links:
        a, b = coords[link.a.node], coords[link.b.node]
        dims = [i for i in range(d) if a[i] != b[i]]
        assert len(dims) == 1
        for end in (link.a, link.b):
            assert t.nodes[end.node].interfaces[end.interface].level == dims[0]


# -- BiGraph -------------------------------------------------------------------------------


@SETTINGS
@given(size=BIGRAPH)
def test_bigraph_counts(topo, size):
    switches, m = size
    t = topo("bigraph", switches=switches, servers_per_switch=m)
    check_summary(
        t,
        servers=m * switches,
        switches=switches,
        links=switches**2 // 4 + m * switches,
        nics=1,
        # same half, different switch: 3 switches; with one switch per half only 2
        diameter=(4, 3) if switches > 2 else (3, 2),
        relaying=False,
    )


@SETTINGS
@given(size=BIGRAPH)
def test_bigraph_structure(topo, size):
    switches, m = size
    t = topo("bigraph", switches=switches, servers_per_switch=m)
    upper, lower = set(t.facts["upper"]), set(t.facts["lower"])
    assert len(upper) == len(lower) == switches // 2
    assert upper | lower == {s.name for s in t.switches}
    fabric = set()
    for link in t.links:
        a, b = link.nodes()
        if t.nodes[a].is_server or t.nodes[b].is_server:
            continue
        assert (a in upper) != (b in upper), f"link {a}-{b} inside one half"
        fabric.add(frozenset((a, b)))
    assert fabric == {frozenset((u, l)) for u in upper for l in lower}
    assert len(fabric) == switches**2 // 4
    g = own_graph(t)
    for switch in t.switches:
        servers = [x for x in g.neighbors(switch.name) if t.nodes[x].is_server]
        assert len(servers) == m
    for server in t.servers:
        assert g.degree(server.name) == 1


# -- leaf-spine and star -------------------------------------------------------------------


@SETTINGS
@given(size=LEAFSPINE)
def test_leafspine_counts(topo, size):
    leaves, spines, per_leaf = size
    t = topo("leafspine", leaves=leaves, spines=spines, servers_per_leaf=per_leaf)
    n = leaves * per_leaf
    if leaves > 1:
        diameter = (4, 3)  # server-leaf-spine-leaf-server
    elif per_leaf > 1:
        diameter = (2, 1)
    else:
        diameter = (0, 0)
    check_summary(
        t,
        servers=n,
        switches=leaves + spines,
        links=n + leaves * spines,
        nics=1,
        diameter=diameter,
        relaying=False,
    )
    g = own_graph(t)
    leaf_names = {s.name for s in t.switches if s.attrs.get("layer") == "leaf"}
    spine_names = {s.name for s in t.switches if s.attrs.get("layer") == "spine"}
    assert len(leaf_names) == leaves and len(spine_names) == spines
    fabric = {frozenset(link.nodes()) for link in t.links
              if not any(t.nodes[x].is_server for x in link.nodes())}
    assert fabric == {frozenset((a, b)) for a in leaf_names for b in spine_names}
    for leaf in leaf_names:
        assert sum(t.nodes[x].is_server for x in g.neighbors(leaf)) == per_leaf


@settings(max_examples=40, deadline=None)
@given(servers=STAR)
def test_star_counts(topo, servers):
    t = topo("star", servers=servers)
    check_summary(
        t,
        servers=servers,
        switches=1,
        links=servers,
        nics=1,
        diameter=(2, 1) if servers > 1 else (0, 0),
        relaying=False,
    )
    (switch,) = t.switches
    assert switch.kind == "l2"
    assert all(switch.name in link.nodes() for link in t.links)


# -- describe.diameter against all pairs ---------------------------------------------------

ALL_KINDS = st.one_of(
    BCUBE.map(lambda s: ("bcube", {"n": s[0], "k": s[1]})),
    FATTREE.filter(lambda k: k <= 6).map(lambda k: ("fattree", {"k": k})),
    TORUS.map(lambda s: ("torus", {"k": s[0], "d": s[1]})),
    BIGRAPH.map(lambda s: ("bigraph", {"switches": s[0], "servers_per_switch": s[1]})),
    LEAFSPINE.map(lambda s: ("leafspine", {"leaves": s[0], "spines": s[1],
                                           "servers_per_leaf": s[2]})),
    STAR.map(lambda s: ("star", {"servers": s})),
)


@settings(max_examples=40, deadline=None)
@given(case=ALL_KINDS)
def test_describe_diameter_is_max_over_all_pairs(topo, case):
    """describe.diameter uses one source (symmetry); the max over every pair must agree."""
    kind, params = case
    t = topo(kind, **params)
    links, _ = describe.diameter(t)
    assert links == true_diameter(t)


@settings(max_examples=40, deadline=None)
@given(case=ALL_KINDS)
def test_describe_graph_matches_links(topo, case):
    kind, params = case
    t = topo(kind, **params)
    g = describe.graph(t)
    assert set(g.nodes) == set(t.nodes)
    assert g.number_of_edges() == len(t.links)
    assert Counter(frozenset(e) for e in g.edges()) == Counter(
        frozenset(link.nodes()) for link in t.links)


# -- limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("bcube", {"n": 8, "k": 4}),  # 8^5 = 32768 servers
        ("torus", {"k": 10, "d": 4}),  # 10^4 servers
        ("fattree", {"k": 64}),  # 65536 hosts
        ("bigraph", {"switches": 128, "servers_per_switch": 128}),  # 16384 servers
    ],
)
def test_too_large_topologies_raise_topology_error(topo, kind, params):
    with pytest.raises(TopologyError) as caught:
        topo(kind, **params)
    assert caught.value.exit_code == 2
    assert "\n" not in str(caught.value)
