"""Routing: walk the static tables hop by hop (Topology.paths) for every ordered server pair.

A walk raises RoutingError on a black hole or a loop; here every pair must arrive, over real
wires, along shortest paths, with the hop counts REFERENCE.md section 1 gives per kind. The
first tests prove the walker itself catches broken tables, so the rest cannot pass vacuously.
"""

from __future__ import annotations

import ipaddress
import itertools

import networkx as nx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.topology import RoutingError, bcube
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop

# -- the walker catches broken tables ------------------------------------------------------


def _line(forwards: bool = True):
    """a - b - c, three servers wired in a line on /30s; b may relay."""
    b = TopologyBuilder("line", {})
    b.server("a")
    b.server("b", forwards=forwards)
    b.server("c")
    ab = ipaddress.IPv4Network("10.0.0.0/30")
    bc = ipaddress.IPv4Network("10.0.0.4/30")
    b.link("a", "b", ipaddress.IPv4Interface(f"{ab[1]}/30"), ipaddress.IPv4Interface(f"{ab[2]}/30"))
    b.link("b", "c", ipaddress.IPv4Interface(f"{bc[1]}/30"), ipaddress.IPv4Interface(f"{bc[2]}/30"))
    return b


C = ipaddress.IPv4Address("10.0.0.6")
A = ipaddress.IPv4Address("10.0.0.1")


def test_walker_follows_good_routes():
    b = _line()
    b.route("a", C, [b.hop("a", "b")])
    b.route("c", A, [b.hop("c", "b")])
    t = b.build({})
    assert t.paths("a", "c") == [["a", "b", "c"]]
    assert t.path("c", "a") == ["c", "b", "a"]
    assert t.path("a", "b") == ["a", "b"]


def test_walker_reports_black_hole():
    t = _line().build({})
    with pytest.raises(RoutingError, match="black hole"):
        t.paths("a", "c")


def test_walker_reports_loop():
    b = _line()
    b.route("a", C, [b.hop("a", "b")])
    b.route("b", C, [b.hop("b", "a")])  # sends it back
    t = b.build({})
    with pytest.raises(RoutingError, match="loop"):
        t.paths("a", "c")


def test_walker_reports_non_forwarding_relay():
    b = _line(forwards=False)
    b.route("a", C, [b.hop("a", "b")])
    t = b.build({})
    with pytest.raises(RoutingError):
        t.paths("a", "c")


def test_walker_reports_unreachable_gateway_and_unknown_address():
    b = _line()
    b.route("a", C, [NextHop("a-eth0", ipaddress.IPv4Address("10.0.0.5"))])  # c's link peer
    t = b.build({})
    with pytest.raises(RoutingError):
        t.paths("a", "c")
    with pytest.raises(RoutingError):
        t.paths("a", ipaddress.IPv4Address("192.0.2.1"))


def test_walker_reports_loop_on_one_ecmp_branch_only():
    b = _line()
    b.route("a", C, [b.hop("a", "b")])
    b.route("b", C, [NextHop("b-eth1", None), b.hop("b", "a")])
    t = b.build({})
    assert t.path("a", "c") == ["a", "b", "c"]  # the first branch is fine...
    with pytest.raises(RoutingError):
        t.paths("a", "c")  # ...but every branch is walked


# -- helpers -------------------------------------------------------------------------------


class Walker:
    """Walks every ordered pair of one topology and checks the generic properties."""

    def __init__(self, topology):
        self.t = topology
        self.g = nx.Graph()
        for link in topology.links:
            self.g.add_edge(*link.nodes())
        self.names = [s.name for s in topology.servers]
        self._dist: dict[str, dict[str, int]] = {}

    def dist(self, src: str, dst: str) -> int:
        if src not in self._dist:
            self._dist[src] = nx.single_source_shortest_path_length(self.g, src)
        return self._dist[src][dst]

    def pairs(self):
        return itertools.permutations(self.names, 2)

    def walk(self, src: str, dst, owner: str | None = None) -> list[list[str]]:
        t = self.t
        owner = owner or (dst if isinstance(dst, str) else t.owner(dst).node)
        paths = t.paths(src, dst)
        assert paths, (src, dst)
        assert t.path(src, dst) == paths[0]
        assert len({tuple(p) for p in paths}) == len(paths), "duplicate ECMP branches"
        for path in paths:
            assert path[0] == src and path[-1] == owner, path
            assert len(set(path)) == len(path), f"loop in {path}"
            for here, there in zip(path, path[1:]):
                assert self.g.has_edge(here, there), f"{here}->{there} is not a wire"
            for relay in path[1:-1]:
                node = t.nodes[relay]
                # an l2 switch bridges; anything else in the middle must route
                assert node.kind == "l2" or node.forwards, f"{relay} relays but does not forward"
            # routing follows shortest paths
            assert len(path) - 1 == self.dist(src, owner), path
        return paths


def switches_on(t, path) -> int:
    return t.hop_counts(path)[1]


def hamming(a, b) -> int:
    return sum(x != y for x, y in zip(a, b))


def wrap_manhattan(a, b, k) -> int:
    return sum(min((y - x) % k, (x - y) % k) for x, y in zip(a, b))


# -- BCube ---------------------------------------------------------------------------------

BCUBE_SMALL = [(n, k) for n in range(2, 6) for k in range(3) if n ** (k + 1) <= 64]


def check_bcube_pair(w: Walker, src: str, dst: str) -> None:
    t = w.t
    digits = {s.name: s.attrs["digits"] for s in t.servers}
    h = hamming(digits[src], digits[dst])
    # the primary address and EVERY NIC address of the destination
    targets = [dst] + [nic.address.ip for nic in t.nodes[dst].data_nics()]
    for target in targets:
        paths = w.walk(src, target, owner=dst)
        assert len(paths) == 1, "BCube routes are single-path"
        path = paths[0]
        assert switches_on(t, path) == h, (src, target, path)
        assert len(path) - 1 == 2 * h
        servers = [digits[name] for name in path if t.nodes[name].is_server]
        for a, b in zip(servers, servers[1:]):
            assert hamming(a, b) == 1, f"{a}->{b} corrects more than one digit"


@pytest.mark.parametrize(("n", "k"), BCUBE_SMALL)
def test_bcube_all_pairs(topo, n, k):
    w = Walker(topo("bcube", n=n, k=k))
    for src, dst in w.pairs():
        check_bcube_pair(w, src, dst)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 5), k=st.integers(0, 2), data=st.data())
def test_bcube_sampled_pairs(topo, n, k, data):
    w = Walker(topo("bcube", n=n, k=k))
    src, dst = data.draw(st.permutations(w.names).map(lambda p: p[:2]))
    check_bcube_pair(w, src, dst)


# -- BCube parallel paths ------------------------------------------------------------------


@st.composite
def bcube_pair(draw, n_max=5, k_max=3):
    n = draw(st.integers(2, n_max))
    k = draw(st.integers(0, k_max))
    digit = st.integers(0, n - 1)
    src = tuple(draw(st.lists(digit, min_size=k + 1, max_size=k + 1)))
    dst = tuple(draw(st.lists(digit, min_size=k + 1, max_size=k + 1)))
    assume(src != dst)
    return n, k, src, dst


def level_of_step(a, b) -> int:
    """The level (digit index from the least significant) a one-digit step corrects."""
    (position,) = [i for i in range(len(a)) if a[i] != b[i]]
    return len(a) - 1 - position


@settings(max_examples=300, deadline=None)
@given(case=bcube_pair())
def test_bcube_parallel_paths(case):
    n, k, src, dst = case
    paths = bcube.parallel_paths(src, dst, n)
    h = hamming(src, dst)
    assert len(paths) == k + 1
    edge_sets, switch_sets, inner_sets = [], [], []
    for path in paths:
        assert path[0] == src and path[-1] == dst
        assert all(len(p) == k + 1 and all(0 <= x < n for x in p) for p in path)
        assert len(set(path)) == len(path), "a path revisits a server"
        # REFERENCE.md (recalled): Hamming distance, or Hamming + 2 with a detour
        assert len(path) - 1 in (h, h + 2)
        edges, switches = set(), set()
        for a, b in zip(path, path[1:]):
            assert hamming(a, b) == 1, f"{a}->{b} is not one switch apart"
            level = level_of_step(a, b)
            # a and b share the level-l switch: the step uses wires (a, l) and (b, l),
            # a server's level-l NIC being its only wire to that switch
            edges |= {(a, level), (b, level)}
            switches.add((level, bcube.switch_index(a, level, n)))
            assert bcube.switch_index(a, level, n) == bcube.switch_index(b, level, n)
        edge_sets.append(edges)
        switch_sets.append(switches)
        inner_sets.append(set(path[1:-1]))
    for i, j in itertools.combinations(range(len(paths)), 2):
        assert not edge_sets[i] & edge_sets[j], f"paths {i} and {j} share a wire"
        # Guo et al.'s parallel paths also share no intermediate server and no switch
        assert not inner_sets[i] & inner_sets[j], f"paths {i} and {j} share a server"
        assert not switch_sets[i] & switch_sets[j], f"paths {i} and {j} share a switch"
    # each path leaves src on a different level (one per NIC)
    assert sorted(level_of_step(p[0], p[1]) for p in paths) == list(range(k + 1))
    # exactly the paths that start at a digit where src and dst agree take the detour
    lengths = sorted(len(p) - 1 for p in paths)
    assert lengths == sorted([h] * h + [h + 2] * (k + 1 - h))


@pytest.mark.parametrize(("n", "k"), [(2, 1), (3, 1), (4, 1), (3, 2)])
def test_bcube_parallel_paths_exist_in_topology(topo, n, k):
    """Every step of every parallel path is two wires through one switch of the topology."""
    t = topo("bcube", n=n, k=k)
    by_digits = {s.attrs["digits"]: s.name for s in t.servers}
    switch_of = {}
    for link in t.links:
        server, switch = (link.a, link.b) if t.nodes[link.a.node].is_server else (link.b, link.a)
        level = t.nodes[server.node].interfaces[server.interface].level
        switch_of[(server.node, level)] = switch.node
    for src, dst in itertools.permutations(by_digits, 2):
        for path in bcube.parallel_paths(src, dst, n):
            for a, b in zip(path, path[1:]):
                level = level_of_step(a, b)
                assert switch_of[(by_digits[a], level)] == switch_of[(by_digits[b], level)]


# -- Torus ---------------------------------------------------------------------------------

TORUS_SMALL = [(k, d) for k in range(2, 7) for d in range(1, 4) if k**d <= 64]


def check_torus_pair(w: Walker, src: str, dst: str, every_address: bool) -> None:
    t = w.t
    coords = {s.name: s.attrs["coords"] for s in t.servers}
    k = t.params["k"]
    expected = wrap_manhattan(coords[src], coords[dst], k)
    targets = [dst]
    if every_address:
        targets += [nic.address.ip for nic in t.nodes[dst].data_nics()]
    for target in targets:
        paths = w.walk(src, target, owner=dst)
        assert len(paths) == 1
        path = paths[0]
        links, switches = t.hop_counts(path)
        assert switches == 0
        assert links == expected, (src, target, path)
        # dimension order: the dimension being corrected never decreases
        dims = []
        for a, b in zip(path, path[1:]):
            (dim,) = [i for i in range(len(coords[a])) if coords[a][i] != coords[b][i]]
            dims.append(dim)
        assert dims == sorted(dims), path


@pytest.mark.parametrize(("k", "d"), TORUS_SMALL)
def test_torus_all_pairs(topo, k, d):
    w = Walker(topo("torus", k=k, d=d))
    for src, dst in w.pairs():
        check_torus_pair(w, src, dst, every_address=k**d <= 27)


@settings(max_examples=60, deadline=None)
@given(
    size=st.tuples(st.integers(2, 6), st.integers(1, 3)).filter(lambda s: s[0] ** s[1] <= 216),
    data=st.data(),
)
def test_torus_sampled_pairs(topo, size, data):
    k, d = size
    w = Walker(topo("torus", k=k, d=d))
    assume(len(w.names) >= 2)
    src, dst = data.draw(st.permutations(w.names).map(lambda p: p[:2]))
    check_torus_pair(w, src, dst, every_address=True)


# -- Fat-Tree ------------------------------------------------------------------------------


def check_fattree_pair(w: Walker, src: str, dst: str) -> None:
    t = w.t
    half = t.params["k"] // 2
    a, b = t.nodes[src].attrs, t.nodes[dst].attrs
    paths = w.walk(src, dst)
    lengths = {len(p) - 1 for p in paths}
    assert max(lengths) <= 6
    if (a["pod"], a["edge"]) == (b["pod"], b["edge"]):
        assert lengths == {2} and len(paths) == 1
    elif a["pod"] == b["pod"]:
        assert lengths == {4} and len(paths) == half  # one per aggregation switch
    else:
        assert lengths == {6}
        assert len(paths) == half * half  # one per core switch
        assert len({p[3] for p in paths}) == half * half
        assert all(t.nodes[p[3]].attrs["layer"] == "core" for p in paths)


@pytest.mark.parametrize("k", [2, 4, 6])
def test_fattree_all_pairs(topo, k):
    w = Walker(topo("fattree", k=k))
    for src, dst in w.pairs():
        check_fattree_pair(w, src, dst)


@settings(max_examples=60, deadline=None)
@given(k=st.sampled_from([2, 4, 6, 8]), data=st.data())
def test_fattree_sampled_pairs(topo, k, data):
    w = Walker(topo("fattree", k=k))
    src, dst = data.draw(st.permutations(w.names).map(lambda p: p[:2]))
    check_fattree_pair(w, src, dst)


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fattree_ecmp_groups(topo, k):
    """Edge and aggregation routers spread upward traffic over exactly k/2 uplinks."""
    t = topo("fattree", k=k)
    half = k // 2
    up = {"edge": "aggregation", "aggregation": "core"}
    far_host = {pod: next(s for s in t.servers if s.attrs["pod"] != pod) for pod in range(k)}
    for switch in t.switches:
        layer = switch.attrs["layer"]
        routes = t.routes_of(switch.name)
        if layer == "core":
            assert not any(r.is_ecmp for r in routes)
            for host in t.servers:
                assert len(t.lookup(switch.name, t.address_of(host.name))) == 1
            continue
        for route in routes:
            if len(route.nexthops) > 1:
                assert len(route.nexthops) == half, (switch.name, route)
        target = t.address_of(far_host[switch.attrs["pod"]].name)
        hops = t.lookup(switch.name, target)
        assert len(hops) == half
        assert len({h.dev for h in hops}) == half
        reached = {t.owner(h.via).node for h in hops}
        assert len(reached) == half
        assert {t.nodes[r].attrs["layer"] for r in reached} == {up[layer]}
    for host in t.servers:
        for route in t.routes_of(host.name):
            assert len(route.nexthops) == 1


# -- BiGraph, leaf-spine, star -------------------------------------------------------------


def attached_switch(t, server: str) -> str:
    (link,) = t.links_of(server)
    return link.other(server).node


@pytest.mark.parametrize(("switches", "m"), [(s, m) for s in (2, 4, 6, 8) for m in (1, 2, 3, 4)])
def test_bigraph_all_pairs(topo, switches, m):
    t = topo("bigraph", switches=switches, servers_per_switch=m)
    w = Walker(t)
    upper = set(t.facts["upper"])
    for src, dst in w.pairs():
        sa, sb = attached_switch(t, src), attached_switch(t, dst)
        paths = w.walk(src, dst)
        crossed = {switches_on(t, p) for p in paths}
        if sa == sb:
            assert crossed == {1} and len(paths) == 1
        elif (sa in upper) != (sb in upper):
            assert crossed == {2} and len(paths) == 1
        else:
            assert crossed == {3}
            assert len(paths) == switches // 2  # ECMP over every switch of the other half
            middles = {p[2] for p in paths}
            assert len(middles) == switches // 2
            assert all((x in upper) != (sa in upper) for x in middles)


@pytest.mark.parametrize("switches", [4, 6, 8])
def test_bigraph_same_half_ecmp_group(topo, switches):
    t = topo("bigraph", switches=switches, servers_per_switch=2)
    upper, lower = t.facts["upper"], t.facts["lower"]
    for half, other in ((upper, lower), (lower, upper)):
        for here, there in itertools.permutations(half, 2):
            server = next(s.name for s in t.servers if attached_switch(t, s.name) == there)
            hops = t.lookup(here, t.address_of(server))
            assert len(hops) == switches // 2
            assert {t.owner(h.via).node for h in hops} == set(other)
        for here in half:
            for there in other:
                server = next(s.name for s in t.servers if attached_switch(t, s.name) == there)
                hops = t.lookup(here, t.address_of(server))
                assert [t.owner(h.via).node for h in hops] == [there]


@pytest.mark.parametrize(
    ("leaves", "spines", "per_leaf"),
    [(1, 1, 1), (1, 2, 3), (2, 1, 1), (2, 2, 2), (4, 2, 4), (3, 4, 2), (6, 3, 3)],
)
def test_leafspine_all_pairs(topo, leaves, spines, per_leaf):
    t = topo("leafspine", leaves=leaves, spines=spines, servers_per_leaf=per_leaf)
    w = Walker(t)
    for src, dst in w.pairs():
        paths = w.walk(src, dst)
        crossed = {switches_on(t, p) for p in paths}
        if attached_switch(t, src) == attached_switch(t, dst):
            assert crossed == {1} and len(paths) == 1
        else:
            assert crossed == {3}
            assert len(paths) == spines
            spine_names = {s.name for s in t.switches if s.attrs["layer"] == "spine"}
            assert {p[2] for p in paths} == spine_names  # ECMP over every spine


@settings(max_examples=12, deadline=None)
@given(servers=st.integers(1, 40))
def test_star_all_pairs(topo, servers):
    t = topo("star", servers=servers)
    w = Walker(t)
    for src, dst in w.pairs():
        paths = w.walk(src, dst)
        assert len(paths) == 1
        assert t.hop_counts(paths[0]) == (2, 1)


# -- routed diameter equals describe.diameter -----------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("bcube", {"n": 3, "k": 2}),
        ("fattree", {"k": 4}),
        ("torus", {"k": 5, "d": 2}),
        ("bigraph", {"switches": 6, "servers_per_switch": 2}),
        ("leafspine", {"leaves": 3, "spines": 2, "servers_per_leaf": 2}),
        ("star", {"servers": 5}),
    ],
)
def test_routed_diameter_equals_describe_diameter(topo, kind, params):
    from orchestrator.topology import describe

    t = topo(kind, **params)
    longest = (0, 0)
    for src, dst in itertools.permutations([s.name for s in t.servers], 2):
        for path in t.paths(src, dst):
            longest = max(longest, t.hop_counts(path))
    assert longest == describe.diameter(t)


# -- the model's lookups are the tables the lab installs -----------------------------------------
@pytest.mark.parametrize(("kind", "params"), [
    ("bcube", {"n": 2, "k": 1}), ("bcube", {"n": 3, "k": 1}), ("bcube", {"n": 2, "k": 2}), ("bcube", {"n": 4, "k": 0}),
    ("torus", {"k": 2, "d": 3}), ("torus", {"k": 3, "d": 2}), ("torus", {"k": 4, "d": 2}), ("torus", {"k": 5, "d": 1}),
])
def test_lookup_without_tables_answers_as_the_installed_tables(topo, kind, params):
    """BCube and torus answer the model's lookups from their first-hop rule (HostRouting), not
    from tables: every node asked for every address of the lab (and one nobody has) gives what
    longest-prefix match over the routes the lab installs gives, the same tuple for one hop."""
    from orchestrator.topology.model import _Table

    t = topo(kind, **params)
    addresses = [iface.address.ip for node in t.nodes.values() for iface in node.interfaces.values()
                 if iface.address is not None] + [ipaddress.IPv4Address("192.0.2.1")]
    routed = 0
    for node in t.nodes.values():
        table = _Table(node, t.routes_of(node.name))
        seen: dict = {}
        for address in addresses:
            hops = t.lookup(node.name, address)
            assert hops == table.lookup(address), (node.name, address)
            assert seen.setdefault(hops, hops) is hops  # one tuple per hop: the model keys on it
            routed += bool(hops and hops[0].via)
    assert routed > 0 or not any(node.forwards for node in t.servers)  # bcube,n,0: one switch, no relays
