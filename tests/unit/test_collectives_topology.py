"""Topology-aware allreduce schedules: HiPS (BCube, torus), BML (BCube), HDRM (BiGraph).

- simulated on int64 data, every live worker ends with exactly the sum over the range and
  keeps its own values outside it (random offsets, lengths down to 1, shuffled rank order);
- every transfer can leave by the NIC it names: the source NIC and a NIC of the destination
  share a subnet (BCube: the same level-l switch; torus: the very link of that direction);
- per-NIC bytes equal the formulas in the module docstrings (REFERENCE.md §2) exactly when
  the sizes divide evenly; HiPS reproduces the seed GST figures 0.938 / 0.656 / 0.498;
- BML's set ownership, and its failure mode; HDRM's one-flow-per-link property.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.collectives.algorithms import bml, hdrm, hips
from orchestrator.collectives.context import Context
from orchestrator.collectives.registry import builder
from orchestrator.collectives.schedule import Schedule, chunks, simulate, validate
from orchestrator.topology import Endpoint

ITEM = 4
SETTINGS = settings(max_examples=50, deadline=None)

BCUBES = [(n, k) for n in range(2, 6) for k in range(3) if n ** (k + 1) <= 125]
TORI = [(k, d) for k in range(2, 6) for d in range(1, 4) if k**d <= 125]
BIGRAPHS = [(n, m) for n in (2, 4, 8) for m in (1, 2, 4) if m <= n // 2]
BIGRAPH_FALLBACKS = [(2, 2), (2, 3), (4, 3), (4, 4), (6, 1), (6, 2), (8, 3)]


def names(topology) -> list[str]:
    return [s.name for s in topology.servers]


def context(topology, shuffle: int | None = None, **options) -> Context:
    """All servers as workers; with `shuffle`, ranks map to servers in a shuffled order."""
    order = names(topology)
    if shuffle is not None:
        random.Random(shuffle).shuffle(order)
    return Context(len(order), topology, tuple(order), options)


def check_exact(schedule: Schedule, size: int, offset: int, length: int, seed: int) -> None:
    """Live workers end with the exact sum over [offset, offset+length), their own data elsewhere."""
    validate(schedule)
    rng = np.random.default_rng(seed)
    grads = [rng.integers(-1000, 1000, size) for _ in schedule.workers]
    out = simulate(schedule, grads)
    total = np.sum(grads, axis=0)
    inside = slice(offset, offset + length)
    for rank, grad in zip(schedule.workers, grads):
        assert np.array_equal(out[rank][inside], total[inside]), f"rank {rank} has a wrong sum"
        outside = np.ones(size, bool)
        outside[inside] = False
        assert np.array_equal(out[rank][outside], grad[outside]), f"rank {rank} was written outside"


def layout(data, ranks: int) -> tuple[int, int, int]:
    """(size, offset, length) with lengths from 1 through a few times the rank count."""
    length = data.draw(
        st.one_of(st.just(1), st.integers(1, ranks), st.integers(1, 4 * ranks + 17)), label="length"
    )
    offset = data.draw(st.integers(0, 9), label="offset")
    return offset + length + data.draw(st.integers(0, 9), label="tail"), offset, length


def check_nics(topology, ctx: Context, schedule: Schedule) -> None:
    """Each transfer leaves by `{src}-eth{nic}` straight to dst: the destination owns an
    address on that NIC's subnet (same switch / same link), and in BCube the two servers
    differ in exactly the digit of level nic; in a torus the wire from that NIC ends at dst."""
    for _, t in schedule.transfers():
        src, dst = ctx.nodes[t.src], ctx.nodes[t.dst]
        assert t.nic is not None, t
        iface = f"{src}-eth{t.nic}"
        network = topology.node(src).interfaces[iface].address.network
        shared = [i for i in topology.node(dst).data_nics() if i.address.network == network]
        assert shared, f"{dst} is not on the subnet of {iface}"
        if topology.kind == "bcube":
            a, b = topology.node(src).attrs["digits"], topology.node(dst).attrs["digits"]
            differ = [len(a) - 1 - i for i in range(len(a)) if a[i] != b[i]]
            assert differ == [t.nic], (src, dst, t.nic)
            switch = topology.peer(Endpoint(src, iface)).node
            assert topology.peer(Endpoint(dst, shared[0].name)).node == switch
        else:
            assert topology.peer(Endpoint(src, iface)).node == dst, (src, dst, t.nic)


def nic_bytes(schedule: Schedule) -> Counter:
    sent: Counter = Counter()
    for _, t in schedule.transfers():
        sent[(t.src, t.nic)] += t.length * ITEM
    return sent


# -- HiPS ----------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_hips_bcube_exact_and_one_hop(topo, data):
    n, k = data.draw(st.sampled_from(BCUBES), label="bcube")
    t = topo("bcube", n=n, k=k)
    ctx = context(t, shuffle=data.draw(st.integers(0, 3)))
    size, offset, length = layout(data, n ** (k + 1))
    schedule = hips.build(ctx, size, offset, length)
    check_exact(schedule, size, offset, length, data.draw(st.integers(0, 2**16)))
    check_nics(t, ctx, schedule)


@SETTINGS
@given(data=st.data())
def test_hips_torus_exact_and_one_hop(topo, data):
    k, d = data.draw(st.sampled_from(TORI), label="torus")
    t = topo("torus", k=k, d=d)
    ctx = context(t, shuffle=data.draw(st.integers(0, 3)))
    size, offset, length = layout(data, k**d)
    schedule = hips.build(ctx, size, offset, length)
    check_exact(schedule, size, offset, length, data.draw(st.integers(0, 2**16)))
    check_nics(t, ctx, schedule)


@pytest.mark.parametrize("n,k", BCUBES)
def test_hips_bcube_per_nic_bytes(topo, n, k):
    """Every NIC of every server sends and receives 2(n^h−1)/(h·n^h)·w; steps = 2h."""
    h = k + 1
    t = topo("bcube", n=n, k=k)
    ctx = context(t, shuffle=1)
    length = 2 * h * n**h
    w = length * ITEM
    schedule = hips.build(ctx, length + 3, 3, length)
    expected = 2 * (n**h - 1) * w // (h * n**h)
    sent = nic_bytes(schedule)
    assert set(sent) == {(r, level) for r in range(n**h) for level in range(h)}
    assert set(sent.values()) == {expected}
    received: Counter = Counter()
    for _, tr in schedule.transfers():
        received[(tr.dst, tr.nic)] += tr.length * ITEM  # BCube: arrives on the same level
    assert set(received.values()) == {expected}
    assert len(schedule.steps) == 2 * h
    assert schedule.bytes_sent() == [2 * (n**h - 1) * w // n**h] * n**h


@pytest.mark.parametrize("k,d", TORI)
def test_hips_torus_per_nic_bytes(topo, k, d):
    """Each of the 2d NICs sends (k^d−1)/(d·k^d)·w (k = 2: d NICs, twice that); 2d(k−1) steps."""
    t = topo("torus", k=k, d=d)
    ctx = context(t, shuffle=2)
    length = 2 * d * k**d * 3
    w = length * ITEM
    schedule = hips.build(ctx, length, 0, length)
    nics = d if k == 2 else 2 * d
    per_nic = (k**d - 1) * w // (d * k**d) * (2 if k == 2 else 1)
    sent = nic_bytes(schedule)
    assert set(sent) == {(r, nic) for r in range(k**d) for nic in range(nics)}
    assert set(sent.values()) == {per_nic}
    assert schedule.bytes_received() == [2 * (k**d - 1) * w // k**d] * k**d
    assert len(schedule.steps) == 2 * d * (k - 1)


@pytest.mark.parametrize("k,expected", [(1, 0.938), (2, 0.656), (3, 0.498)])
def test_hips_bcube_seed_gst(topo, k, expected):
    """REFERENCE seed figures: HiPS GST on BCube n=4, h = 2/3/4, in units of w/B, computed as
    the busiest NIC's bytes over the gradient's bytes."""
    h = k + 1
    t = topo("bcube", n=4, k=k)
    length = h * 4**h
    schedule = hips.build(context(t), length)
    gst = max(nic_bytes(schedule).values()) / (length * ITEM)
    assert abs(gst - expected) < 5e-4
    assert gst == pytest.approx(2 * (4**h - 1) / (h * 4**h))


def test_hips_torus_gst(topo):
    """Torus GST (n^h−1)/(h·n^h)·w/B with 2h links: 4-ary 2-cube gives 15/32."""
    t = topo("torus", k=4, d=2)
    length = 2 * 2 * 16 * 5
    schedule = hips.build(context(t), length)
    assert max(nic_bytes(schedule).values()) / (length * ITEM) == pytest.approx(15 / 32)


def test_hips_parts_start_on_every_level(topo):
    """In every step of a BCube HiPS schedule all h levels carry traffic (all parts move)."""
    for n, k in [(3, 1), (2, 2), (4, 1)]:
        schedule = hips.build(context(topo("bcube", n=n, k=k)), 6 * n ** (k + 1))
        for step in schedule.steps:
            assert {tr.nic for tr in step} == set(range(k + 1))


# -- BML -----------------------------------------------------------------------------------


def aggregated(schedule: Schedule, length: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Buffers after the aggregation steps only, and the full sum."""
    head = Schedule(schedule.algorithm, schedule.ranks, schedule.size,
                    schedule.steps[: schedule.meta["aggregation_steps"]], schedule.workers)
    rng = np.random.default_rng(seed)
    grads = [rng.integers(-1000, 1000, schedule.size) for _ in schedule.workers]
    return simulate(head, grads), np.sum(grads, axis=0)


@SETTINGS
@given(data=st.data())
def test_bml_exact_and_one_hop(topo, data):
    n, k = data.draw(st.sampled_from(BCUBES), label="bcube")
    t = topo("bcube", n=n, k=k)
    ctx = context(t, shuffle=data.draw(st.integers(0, 3)))
    size, offset, length = layout(data, n ** (k + 1))
    schedule = bml.build(ctx, size, offset, length)
    check_exact(schedule, size, offset, length, data.draw(st.integers(0, 2**16)))
    check_nics(t, ctx, schedule)


@pytest.mark.parametrize("n,k", BCUBES)
def test_bml_sets_and_bytes(topo, n, k):
    """h·N sets of length/(h·N); server a owns set Σ_s a_(g+s)·n^(h−1−s) of group g and holds
    its exact sum after the h aggregation steps; each NIC sends 2(N−1)/(h·N)·w."""
    h, N = k + 1, n ** (k + 1)
    t = topo("bcube", n=n, k=k)
    ctx = context(t, shuffle=3)
    length = h * N * 2
    schedule = bml.build(ctx, length, 0, length)
    owners = schedule.meta["owners"]
    assert len(owners) == h and all(sorted(group) == list(range(N)) for group in owners)
    assert sum(len(group) for group in owners) == h * N
    assert schedule.meta["aggregation_steps"] == h and len(schedule.steps) == 2 * h
    digits = {ctx.rank_of(s.name): tuple(reversed(s.attrs["digits"])) for s in t.servers}
    buffers, total = aggregated(schedule, length)
    set_length = length // (h * N)
    for g, group in enumerate(owners):
        for j, rank in enumerate(group):
            a = digits[rank]
            assert j == sum(a[(g + s) % h] * n ** (h - 1 - s) for s in range(h))
            start = (g * N + j) * set_length
            assert np.array_equal(buffers[rank][start : start + set_length], total[start : start + set_length])
    assert bml.owners(ctx) == [[ctx.nodes[r] for r in group] for group in owners]
    expected = 2 * (N - 1) * length * ITEM // (h * N)
    assert set(nic_bytes(schedule).values()) == {expected}


def test_bml_example_bcube_4_2(topo):
    """BML's BCube(4, 2) = our bcube n=4 k=1: 32 sets; GST (m²−1)/m²·T with T = P/B."""
    t = topo("bcube", n=4, k=1)
    length = 32 * 5
    schedule = bml.build(context(t), length)
    assert sum(len(g) for g in schedule.meta["owners"]) == 32
    assert max(nic_bytes(schedule).values()) / (length * ITEM) == pytest.approx(15 / 16)


def far_apart(coords: list[tuple[int, ...]], chosen: list[int]) -> bool:
    return all(sum(x != y for x, y in zip(coords[a], coords[b])) >= 3 for a, b in itertools.combinations(chosen, 2))


@SETTINGS
@given(data=st.data())
def test_bml_failures(topo, data):
    """Failed servers send and receive nothing, own no set; the N−f live servers each own one
    set per group, hold its exact sum after aggregation, and end with the exact total."""
    n, k = data.draw(st.sampled_from(BCUBES), label="bcube")
    t = topo("bcube", n=n, k=k)
    servers = names(t)
    coords = [tuple(s.attrs["digits"]) for s in t.servers]
    if k == 0:
        dead = data.draw(st.lists(st.integers(0, len(servers) - 1), min_size=1, max_size=n - 1, unique=True))
    else:
        dead = [data.draw(st.integers(0, len(servers) - 1), label="dead")]
        if k == 2 and data.draw(st.booleans(), label="second"):
            others = [r for r in range(len(servers)) if far_apart(coords, dead + [r])]
            dead.append(data.draw(st.sampled_from(others), label="dead2"))
    ctx = context(t, shuffle=data.draw(st.integers(0, 3)), failed=[servers[r] for r in dead])
    failed = {ctx.rank_of(servers[r]) for r in dead}
    size, offset, length = layout(data, len(servers))
    schedule = bml.build(ctx, size, offset, length)
    assert set(schedule.workers) == set(range(len(servers))) - failed
    for _, tr in schedule.transfers():
        assert tr.src not in failed and tr.dst not in failed, tr
    check_exact(schedule, size, offset, length, data.draw(st.integers(0, 2**16)))
    check_nics(t, ctx, schedule)
    live = len(servers) - len(failed)
    for group in schedule.meta["owners"]:
        assert sorted(group) == sorted(schedule.workers) and len(group) == live
    # ownership is real: after aggregation each owner holds the total of its set
    buffers, total = aggregated(schedule, length, seed=1)
    for g, (start, count) in enumerate(chunks(offset, length, k + 1)):
        sets = schedule.meta["sets"][g]
        assert [a for a, _ in sets] == [start] + [a + m for a, m in sets[:-1]]  # they tile the group
        assert sum(m for _, m in sets) == count
        for rank, (a, m) in zip(schedule.meta["owners"][g], sets):
            assert np.array_equal(buffers[rank][a : a + m], total[a : a + m])


@pytest.mark.parametrize("n", [3, 4, 5])
def test_bml_failure_keeps_stage_chunks_equal(topo, n):
    """With a failed server, every switch group still aggregates equal chunks at the first
    stage: the dead server's set is shared by its last-level siblings (bml._nested)."""
    t = topo("bcube", n=n, k=1)
    length = 2 * n * n * (n - 1) * 7
    dead = t.servers[n + 1].name
    schedule = bml.build(context(t, failed=[dead]), length)
    for g in range(2):  # group g's first stage is at level g: chunks by the level-g digit
        sizes = {sum(m for (a, m), o in zip(schedule.meta["sets"][g], schedule.meta["owners"][g])
                     if t.servers[o].attrs["digits"][-1 - g] == v) for v in range(n)}
        assert max(sizes) - min(sizes) <= n, sizes  # rounding only (a set is ≥ 5·n² elements)


def test_bml_one_failure_cost(topo):
    """One failure on BML's BCube(4, 2): 15 owners per group, 2h + 2 = 6 steps (the detours
    add one step to each phase), and the busiest NIC sends 47/48·w (healthy 0.9375·w), as the
    bml docstring states."""
    t = topo("bcube", n=4, k=1)
    length = 2 * 12 * 16 * 4
    for dead in ("h00", "h11", "h32"):
        schedule = bml.build(context(t, failed=[dead]), length)
        assert [len(g) for g in schedule.meta["owners"]] == [15, 15]
        assert len(schedule.steps) == 6
        assert max(nic_bytes(schedule).values()) / (length * ITEM) == pytest.approx(47 / 48)


def test_bml_failed_given_as_text_names_servers(topo):
    """`-o failed=h11` (and `failed=h00,h33` on one switch) names servers, not a string's letters."""
    t = topo("bcube", n=4, k=1)
    assert bml.build(context(t, failed="h11"), 480).meta["failed"] == \
        bml.build(context(t, failed=["h11"]), 480).meta["failed"]
    star = topo("bcube", n=4, k=0)
    assert len(bml.build(context(star, failed="h0, h2"), 480).meta["failed"]) == 2


@pytest.mark.parametrize(
    "n,k,failed",
    [(4, 1, ["h00", "h11"]), (3, 2, ["h000", "h011"]), (2, 2, ["h000", "h001"]), (3, 0, ["h0", "h1", "h2"]),
     (3, 1, ["x9"])],
)
def test_bml_unsupported_failures(topo, n, k, failed):
    with pytest.raises(ValueError, match="bml"):
        bml.build(context(topo("bcube", n=n, k=k), failed=failed), 100)


# -- HDRM ----------------------------------------------------------------------------------


def link_use(topology, ctx: Context, schedule: Schedule) -> list[list[tuple[str, str]]]:
    """Per step, the (switch, switch) hop of each transfer crossing two switches, from the
    topology's routed path; fails if a flow crosses more than two switches."""
    upper, lower = set(topology.facts["upper"]), set(topology.facts["lower"])
    steps = []
    for step in schedule.steps:
        hops = []
        for tr in step:
            path = topology.path(ctx.nodes[tr.src], ctx.nodes[tr.dst])
            switches = [x for x in path if not topology.nodes[x].is_server]
            assert len(switches) <= 2, f"{path} needs two switch hops"
            if len(switches) == 2:
                a, b = switches
                assert (a in upper and b in lower) or (a in lower and b in upper), path
                hops.append((a, b))
        steps.append(hops)
    return steps


@pytest.mark.parametrize("n,m", BIGRAPHS)
@pytest.mark.parametrize("shuffle", [None, 5])
def test_hdrm_one_flow_per_link_direction(topo, n, m, shuffle):
    """m ≤ n/2, N a power of two: every flow crosses one upper–lower link (or stays on a
    switch) and no link carries two flows in one direction in one step."""
    t = topo("bigraph", switches=n, servers_per_switch=m)
    ctx = context(t, shuffle=shuffle)
    N = n * m
    schedule = hdrm.build(ctx, 4 * N, 0, 4 * N)
    assert schedule.meta["contention_free"]
    steps = link_use(t, ctx, schedule)
    assert len(steps) == 2 * (N.bit_length() - 1)
    for hops in steps:
        assert len(hops) == len(set(hops)), Counter(hops).most_common(1)
    assert schedule.bytes_sent() == [2 * (N - 1) * 4 * ITEM] * N
    check_exact(schedule, 4 * N, 0, 4 * N, seed=n * m)


@pytest.mark.parametrize("n,m", BIGRAPHS + [(4, 4), (2, 4)])
def test_hdrm_mapping_is_the_recalled_one(topo, n, m):
    """Pairs (2i, 2i+1) on an upper/lower pair; group g = ranks 2gq..2gq+2q−1 holds node g of
    every switch; the lower member of i = g·q + s sits on sl{s}, the upper on su{(s−g) mod q}."""
    t = topo("bigraph", switches=n, servers_per_switch=m)
    order = hdrm.virtual_servers(t)
    q = n // 2
    assert sorted(order) == sorted(names(t))
    switch = {s.name: s.attrs["switch"] for s in t.servers}
    for i in range(len(order) // 2):
        g, s = divmod(i, q)
        pair = {switch[order[2 * i]], switch[order[2 * i + 1]]}
        assert pair == {f"sl{s}", f"su{(s - g) % q}"}
        assert all(name.endswith(f"h{g}") for name in order[2 * i : 2 * i + 2])


@pytest.mark.parametrize("n,m", BIGRAPH_FALLBACKS)
def test_hdrm_fallbacks_are_exact(topo, n, m):
    t = topo("bigraph", switches=n, servers_per_switch=m)
    ctx = context(t, shuffle=n + m)
    N = n * m
    for size, offset, length in [(N + 9, 4, N + 3), (10, 2, 1), (N, 0, N - 1)]:
        schedule = hdrm.build(ctx, size, offset, length)
        check_exact(schedule, size, offset, length, seed=length)
    contention_free = hdrm.build(ctx, 4 * N).meta["contention_free"]
    assert not contention_free
    if N & (N - 1) == 0:  # m > n/2: still one upper–lower link per flow
        link_use(t, ctx, hdrm.build(ctx, 4 * N))


@SETTINGS
@given(data=st.data())
def test_hdrm_exact(topo, data):
    n, m = data.draw(st.sampled_from(BIGRAPHS + BIGRAPH_FALLBACKS), label="bigraph")
    t = topo("bigraph", switches=n, servers_per_switch=m)
    ctx = context(t, shuffle=data.draw(st.integers(0, 3)))
    size, offset, length = layout(data, n * m)
    check_exact(hdrm.build(ctx, size, offset, length), size, offset, length, data.draw(st.integers(0, 99)))


# -- contexts they refuse ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kind,params",
    [("hips", "bigraph", {"switches": 4, "servers_per_switch": 1}),
     ("bml", "torus", {"k": 3, "d": 2}),
     ("hdrm", "bcube", {"n": 2, "k": 1})],
)
def test_wrong_topology(topo, name, kind, params):
    t = topo(kind, **params)
    with pytest.raises(ValueError, match=name):
        builder(name)(context(t), 10)
    with pytest.raises(ValueError, match=name):
        builder(name)(Context(4), 10)


@pytest.mark.parametrize("name,kind,params", [
    ("hips", "bcube", {"n": 2, "k": 1}), ("hips", "torus", {"k": 3, "d": 1}),
    ("bml", "bcube", {"n": 3, "k": 0}), ("hdrm", "bigraph", {"switches": 2, "servers_per_switch": 2}),
])
def test_wrong_worker_count(topo, name, kind, params):
    t = topo(kind, **params)
    servers = names(t)
    with pytest.raises(ValueError, match="one worker per server"):
        builder(name)(Context(len(servers) + 1, t), 10)
    with pytest.raises(ValueError, match="exactly once"):
        builder(name)(Context(len(servers), t, tuple(servers[:-1] + servers[:1])), 10)


@pytest.mark.parametrize("dead", ["h00", "h21", "h33"])
def test_hips_on_bcube_goes_on_without_a_server_as_bml_does(topo, dead):
    """A surviving run re-forms HiPS with `failed` (membership.keep_ranks): on BCube it runs
    BML's scheme for failures, exact sums over the 15 live servers, nothing to or from the dead."""
    t = topo("bcube", n=4, k=1)
    ctx = context(t, failed=[dead])
    size, offset, length = 2 * 15 * 16 * 3, 0, 2 * 15 * 16 * 3
    schedule = hips.build(ctx, size, offset, length)
    assert schedule.algorithm == "hips" and schedule.steps == bml.build(ctx, size, offset, length).steps
    gone = ctx.rank_of(dead)
    assert gone not in schedule.workers and all(gone not in (tr.src, tr.dst) for _, tr in schedule.transfers())
    check_exact(schedule, size, offset, length, 7)
    with pytest.raises(ValueError, match="torus cannot go on"):
        torus = topo("torus", k=4, d=2)
        hips.build(context(torus, failed=[names(torus)[0]]), 64)
