"""Address plans and interface names: unique, on the right segments, inside their pools."""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections import defaultdict

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from orchestrator.errors import TopologyError
from orchestrator.topology import Endpoint
from orchestrator.topology.addressing import LinkPool, StructuredPool, bits_for
from orchestrator.topology.model import IFNAMSIZ

DATA = ipaddress.IPv4Network("10.0.0.0/8")
LINKS = ipaddress.IPv4Network("172.16.0.0/12")

BCUBE = st.tuples(st.integers(2, 5), st.integers(0, 2)).map(
    lambda s: ("bcube", {"n": s[0], "k": s[1]}))
FATTREE = st.sampled_from([2, 4, 6, 8]).map(lambda k: ("fattree", {"k": k}))
TORUS = st.tuples(st.integers(2, 6), st.integers(1, 3)).filter(
    lambda s: s[0] ** s[1] <= 216).map(lambda s: ("torus", {"k": s[0], "d": s[1]}))
BIGRAPH = st.tuples(st.sampled_from([2, 4, 6, 8]), st.integers(1, 4)).map(
    lambda s: ("bigraph", {"switches": s[0], "servers_per_switch": s[1]}))
LEAFSPINE = st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4)).map(
    lambda s: ("leafspine", {"leaves": s[0], "spines": s[1], "servers_per_leaf": s[2]}))
STAR = st.integers(1, 40).map(lambda s: ("star", {"servers": s}))
ALL_KINDS = st.one_of(BCUBE, FATTREE, TORUS, BIGRAPH, LEAFSPINE, STAR)


# -- generic checks ------------------------------------------------------------------------


def segments(t) -> dict[Endpoint, int]:
    """L2 segment id of every interface: wires and bridge membership joined (union-find)."""
    parent: dict[Endpoint, Endpoint] = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        parent[find(a)] = find(b)

    for node in t.nodes.values():
        for iface in node.interfaces.values():
            here = Endpoint(node.name, iface.name)
            find(here)
            if iface.master is not None:
                union(here, Endpoint(node.name, iface.master))
    for link in t.links:
        union(link.a, link.b)
    roots = {}
    return {e: roots.setdefault(find(e), len(roots)) for e in parent}


def check_plan(t, data, links) -> None:
    """Unique addresses, one subnet per L2 segment and back, all inside their pools."""
    seen: dict[ipaddress.IPv4Address, str] = {}
    segment = segments(t)
    subnet_of_segment: dict[int, set] = defaultdict(set)
    segment_of_subnet: dict[ipaddress.IPv4Network, set] = defaultdict(set)
    for node in t.nodes.values():
        for name, iface in node.interfaces.items():
            if iface.address is None:
                continue
            ip, net = iface.address.ip, iface.address.network
            assert ip not in seen, f"{ip} on {node.name}:{name} and {seen[ip]}"
            seen[ip] = f"{node.name}:{name}"
            if net.prefixlen < 31:
                assert ip != net.network_address and ip != net.broadcast_address, iface
            assert ip in data or ip in links, f"{ip} outside both pools"
            if net.prefixlen == 31:
                assert net.subnet_of(links), f"/31 {net} outside the links pool"
            if node.is_server or iface.is_bridge:
                assert net.subnet_of(data), f"{node.name}:{name} {net} outside data pool"
            where = segment[Endpoint(node.name, name)]
            subnet_of_segment[where].add(net)
            segment_of_subnet[net].add(where)
    for where, nets in subnet_of_segment.items():
        assert len(nets) == 1, f"segment {where} carries several subnets {nets}"
    for net, wheres in segment_of_subnet.items():
        assert len(wheres) == 1, f"subnet {net} is split over several L2 segments"
    # distinct subnets do not overlap
    nets = sorted(segment_of_subnet, key=lambda n: (int(n.network_address), n.prefixlen))
    for a, b in zip(nets, nets[1:]):
        assert not a.overlaps(b), (a, b)
    # both addressed ends of every wire share one subnet
    for link in t.links:
        ends = [t.nodes[e.node].interfaces[e.interface].address for e in (link.a, link.b)]
        if all(ends):
            assert ends[0].network == ends[1].network, link
    # every server has at least one data address
    for server in t.servers:
        assert server.data_nics(), server.name


def check_names(t) -> None:
    ports = set()
    for node in t.nodes.values():
        for key, iface in node.interfaces.items():
            assert key == iface.name
            assert 1 <= len(iface.name) <= IFNAMSIZ, (node.name, iface.name)
            assert re.fullmatch(r"[A-Za-z0-9._-]+", iface.name), iface.name
            if not iface.is_bridge:
                # ports are veth ends, made in one namespace before they move: unique overall
                assert iface.name not in ports, iface.name
                ports.add(iface.name)
        assert len(node.interfaces) == len({i.name for i in node.interfaces.values()})


# -- default pools -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(case=ALL_KINDS)
def test_default_pools_plan(topo, case):
    kind, params = case
    t = topo(kind, **params)
    check_plan(t, DATA, LINKS)
    check_names(t)


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fattree_al_fares_addresses(topo, k):
    """Host 10.pod.switch.ID with ID 2..k/2+1; the edge switch answers on 10.pod.switch.1."""
    t = topo("fattree", k=k)
    half = k // 2
    hosts = [s for s in t.servers]
    assert len(hosts) == k * half * half
    for host in hosts:
        pod, edge, j = host.attrs["pod"], host.attrs["edge"], host.attrs["index"]
        assert host.name == f"p{pod}e{edge}h{j}"
        (nic,) = host.data_nics()
        assert nic.address.ip == ipaddress.IPv4Address(f"10.{pod}.{edge}.{j + 2}")
        assert 2 <= nic.address.ip.packed[3] <= half + 1
        edge_switch = t.nodes[f"p{pod}e{edge}"]
        assert edge_switch.attrs["layer"] == "edge"
        gateway = edge_switch.interfaces["br0"].address
        assert gateway.ip == ipaddress.IPv4Address(f"10.{pod}.{edge}.1")
        assert nic.address.network == gateway.network
        # the host's default way out is its edge switch's address
        (route,) = t.routes_of(host.name)
        assert [h.via for h in route.nexthops] == [gateway.ip]


def test_bcube_readable_addresses(topo):
    """bcube.py docstring: NIC l of server a is 10.l.<switch index>.<a_l + 1> in a /8 pool."""
    for n, k in [(4, 1), (3, 2), (2, 0), (5, 1)]:
        t = topo("bcube", n=n, k=k)
        for server in t.servers:
            a = server.attrs["digits"]  # a_k ... a_0
            for level in range(k + 1):
                nic = server.interfaces[f"{server.name}-eth{level}"]
                assert nic.level == level
                rest = a[: k - level] + a[k - level + 1 :]
                index = 0
                for value in rest:
                    index = index * n + value
                ip = ipaddress.IPv4Address(f"10.{level}.{index}.{a[k - level] + 1}")
                assert nic.address.ip == ip, (server.name, level)


def test_torus_link_subnets_are_slash_30_pairs(topo):
    for k, d in [(2, 2), (3, 2), (4, 3)]:
        t = topo("torus", k=k, d=d)
        for link in t.links:
            a = t.nodes[link.a.node].interfaces[link.a.interface].address
            b = t.nodes[link.b.node].interfaces[link.b.interface].address
            assert a.network == b.network and a.network.prefixlen == 30
            assert {a.ip.packed[3] & 3, b.ip.packed[3] & 3} == {1, 2}


# -- small and too small pools -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(case=ALL_KINDS)
def test_small_data_pool_still_unique_and_inside(topo, case):
    kind, params = case
    t = topo(kind, data="10.9.0.0/20", **params)
    check_plan(t, ipaddress.IPv4Network("10.9.0.0/20"), LINKS)
    for node in t.nodes.values():
        for iface in node.data_nics():
            if node.is_server or iface.is_bridge:
                assert iface.address.ip in ipaddress.IPv4Network("10.9.0.0/20")


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("bcube", {"n": 4, "k": 1}),
        ("bcube", {"n": 3, "k": 2}),
        ("fattree", {"k": 4}),
        ("fattree", {"k": 6}),
        ("torus", {"k": 4, "d": 2}),
        ("bigraph", {"switches": 6, "servers_per_switch": 3}),
        ("leafspine", {"leaves": 4, "spines": 2, "servers_per_leaf": 3}),
        ("star", {"servers": 12}),
    ],
)
def test_small_pool_routes_every_pair(topo, kind, params):
    """Packed subnets (and the aggregates cores and routers use) must still route."""
    t = topo(kind, data="10.9.0.0/20", **params)
    for src, dst in itertools.permutations([s.name for s in t.servers], 2):
        for target in [nic.address.ip for nic in t.nodes[dst].data_nics()]:
            for path in t.paths(src, target):
                assert path[0] == src and path[-1] == dst


def build_error(topo, kind, params, **pools) -> TopologyError:
    with pytest.raises(TopologyError) as caught:
        topo(kind, **pools, **params)
    error = caught.value
    assert error.exit_code == 2
    assert "\n" not in str(error)
    return error


def test_too_small_data_pool_names_addressing_data(topo):
    error = build_error(topo, "bcube", {"n": 4, "k": 1}, data="10.9.9.0/28")
    assert "addressing.data" in str(error)
    assert "10.9.9.0/28" in str(error)


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("fattree", {"k": 4}),
        ("bigraph", {"switches": 8, "servers_per_switch": 1}),
        ("leafspine", {"leaves": 6, "spines": 4, "servers_per_leaf": 1}),
    ],
)
def test_too_small_links_pool_names_addressing_links(topo, kind, params):
    error = build_error(topo, kind, params, links="172.16.0.0/28")
    assert "addressing.links" in str(error)
    assert "172.16.0.0/28" in str(error)


def suggested_prefix(message: str) -> int:
    match = re.search(r"/(\d+) or larger", message)
    assert match, message
    return int(match[1])


POOL_KINDS = st.one_of(BCUBE, FATTREE, TORUS, BIGRAPH, LEAFSPINE, STAR.filter(
    lambda c: c[1]["servers"] > 1))


@settings(max_examples=80, deadline=None)
@given(case=POOL_KINDS, prefix=st.integers(20, 30))
def test_any_data_pool_either_works_or_says_how_large(topo, case, prefix):
    """A pool is used inside its bounds, or the error's suggested size is exactly enough."""
    kind, params = case
    pool = ipaddress.IPv4Network(("10.64.0.0", prefix))
    try:
        t = topo(kind, data=str(pool), **params)
    except TopologyError as error:
        event("pool too small")
        message = str(error)
        assert "addressing.data" in message and str(pool) in message
        needed = suggested_prefix(message)
        assert needed < prefix
        bigger = ipaddress.IPv4Network(("10.64.0.0", needed))
        t = topo(kind, data=str(bigger), **params)  # the suggestion must be enough
        check_plan(t, bigger, LINKS)
        if needed < 30:
            event("checked the suggestion is tight")  # and it must not overstate the need
            smaller = ipaddress.IPv4Network(("10.64.0.0", needed + 1))
            build_error(topo, kind, params, data=str(smaller))
        return
    check_plan(t, pool, LINKS)


@settings(max_examples=40, deadline=None)
@given(
    case=st.one_of(FATTREE.filter(lambda c: c[1]["k"] > 2), BIGRAPH, LEAFSPINE),
    prefix=st.integers(20, 31),
)
def test_any_links_pool_either_works_or_says_how_large(topo, case, prefix):
    kind, params = case
    pool = ipaddress.IPv4Network(("172.16.0.0", prefix))
    try:
        t = topo(kind, links=str(pool), **params)
    except TopologyError as error:
        message = str(error)
        assert "addressing.links" in message and str(pool) in message
        needed = suggested_prefix(message)
        bigger = ipaddress.IPv4Network(("172.16.0.0", needed))
        t = topo(kind, links=str(bigger), **params)
        check_plan(t, DATA, bigger)
        smaller = ipaddress.IPv4Network(("172.16.0.0", needed + 1))
        build_error(topo, kind, params, links=str(smaller))
        return
    check_plan(t, DATA, pool)


# -- the pool primitives -------------------------------------------------------------------


@pytest.mark.parametrize(("count", "bits"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (256, 8),
                                             (257, 9)])
def test_bits_for(count, bits):
    assert bits_for(count) == bits
    assert 2**bits >= count and (bits == 0 or 2 ** (bits - 1) < count)


@settings(max_examples=100, deadline=None)
@given(
    dims=st.lists(st.integers(1, 12), min_size=0, max_size=3),
    host_bits=st.integers(2, 8),
    prefix=st.integers(8, 24),
)
def test_structured_pool_subnets_are_disjoint_and_inside(dims, host_bits, prefix):
    pool = ipaddress.IPv4Network(("10.0.0.0", prefix))
    try:
        carve = StructuredPool(pool, dims, host_bits, "addressing.data", "test", 2)
    except TopologyError as error:
        assert "addressing.data" in str(error)
        return
    subnets = [carve.subnet(*key) for key in itertools.product(*(range(d) for d in dims))]
    assert len(set(subnets)) == len(subnets)
    for net in subnets:
        assert net.subnet_of(pool)
        assert net.prefixlen == 32 - carve.host_bits
    ordered = sorted(subnets, key=lambda n: int(n.network_address))
    for a, b in zip(ordered, ordered[1:]):
        assert not a.overlaps(b)
    if dims:
        for first in range(dims[0]):
            aggregate = carve.aggregate(first)
            assert aggregate.subnet_of(pool)
            for key in itertools.product(*(range(d) for d in dims)):
                # a subnet lies in the aggregate of its first key part and no other
                assert carve.subnet(*key).overlaps(aggregate) == (key[0] == first)
                if key[0] == first:
                    assert carve.subnet(*key).subnet_of(aggregate)


@settings(max_examples=60, deadline=None)
@given(needed=st.integers(1, 300), prefix=st.integers(20, 31))
def test_link_pool(needed, prefix):
    pool = ipaddress.IPv4Network(("172.16.0.0", prefix))
    if needed > pool.num_addresses // 2:
        with pytest.raises(TopologyError, match="addressing.links"):
            LinkPool(pool, needed, "addressing.links")
        return
    links = LinkPool(pool, needed, "addressing.links")
    seen = set()
    for _ in range(needed):
        a, b = links.allocate()
        assert a.network == b.network and a.network.prefixlen == 31
        assert a.network.subnet_of(pool)
        assert a.ip not in seen and b.ip not in seen
        seen |= {a.ip, b.ip}


# -- interface names -----------------------------------------------------------------------


def test_names_fit_for_largest_ready_lab(topo):
    t = topo("fattree", k=8)
    check_names(t)
    assert max(len(i) for n in t.nodes.values() for i in n.interfaces) <= IFNAMSIZ


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("bcube", {"n": 8, "k": 2}),
        ("bcube", {"n": 2, "k": 7}),  # the deepest BCube the spec allows
        ("bcube", {"n": 11, "k": 1}),  # two-digit labels
        ("fattree", {"k": 16}),
        ("torus", {"k": 12, "d": 2}),
        ("torus", {"k": 4, "d": 4}),
        ("torus", {"k": 3, "d": 5}),
        ("bigraph", {"switches": 32, "servers_per_switch": 16}),
        ("leafspine", {"leaves": 40, "spines": 8, "servers_per_leaf": 12}),
        ("star", {"servers": 300}),
    ],
)
def test_names_fit_at_moderate_sizes(topo, kind, params):
    check_names(topo(kind, **params))


def test_six_dimensional_torus_can_be_named(topo):
    # Regression: TorusSpec accepts d up to 6, but torus.node_name joins coordinates with "x", so
    # every d=6 torus has names like 't1x1x1x1x1x1-eth5' (17 characters > IFNAMSIZ 15) and
    # torus.build raises TopologyError "interface name ... is longer than Linux's 15
    # characters" — even for the 64-server binary 6-cube {kind: torus, k: 2, d: 6} (also
    # k=3 and k=4, i.e. every d=6 torus within MAX_SERVERS). Either the spec should cap d at
    # 5 or the names must be shorter.
    t = topo("torus", k=2, d=6)
    assert len(t.servers) == 64
    check_names(t)


def test_from_lab_uses_the_lab_pools(tmp_path):
    from orchestrator.spec import load_lab
    from orchestrator.topology import from_lab

    path = tmp_path / "lab.yaml"
    path.write_text(
        "name: small-pools\n"
        "topology: {kind: fattree, k: 4}\n"
        "addressing: {data: 10.9.0.0/20, links: 192.168.100.0/25}\n"
    )
    t = from_lab(load_lab(path))
    data = ipaddress.IPv4Network("10.9.0.0/20")
    links = ipaddress.IPv4Network("192.168.100.0/25")  # 64 /31s; k^3/2 = 32 are needed
    check_plan(t, data, links)
    assert all(t.address_of(s.name) in data for s in t.servers)
