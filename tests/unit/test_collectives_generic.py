"""Properties every allreduce schedule must have, for every generic algorithm.

- simulated on int64 data, every worker ends with exactly the sum of all workers over the
  range and keeps its own values outside it (any N, sizes, offsets; schedules validate);
- partitioned (ByteScheduler) or not, one schedule per partition run in sequence reduces
  the whole buffer;
- bytes and steps equal REFERENCE.md §2 where the sizes divide evenly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.collectives.algorithms.double_tree import dtree_parents
from orchestrator.collectives.algorithms.flextree import choose_widths
from orchestrator.collectives.algorithms.halving_doubling import hd_steps
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.collectives.registry import builder, schedules
from orchestrator.collectives.schedule import Schedule, simulate, validate

ITEM = 4  # bytes per element in Schedule.bytes_sent


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ordered_factorizations(n: int) -> list[tuple[int, ...]]:
    """Independent of flextree's own enumeration: every ordered factorization into factors ≥ 2."""
    if n == 1:
        return [()]
    return [(f, *rest) for f in divisors(n)[1:] for rest in ordered_factorizations(n // f)]


# label → (registry name, options drawn for N workers). Only combinations that are valid by
# definition are drawn; the invalid ones (hierarchical group not dividing N, flextree widths
# whose product is not N, more colocated shards than workers) are tested for their
# ValueError in test_invalid_options, not silently skipped.
CASES = {
    "ring": ("ring", lambda data, n: {}),
    "mesh": ("mesh", lambda data, n: {}),
    "ps-separate": ("ps", lambda data, n: {"shards": data.draw(st.integers(1, n + 3), label="shards")}),
    "ps-colocated": (
        "ps",
        lambda data, n: {"colocated": True, "shards": data.draw(st.integers(1, n), label="shards")},
    ),
    "ps-default": ("ps", lambda data, n: {}),
    "halving-doubling": ("halving-doubling", lambda data, n: {}),
    "tree": ("tree", lambda data, n: {}),
    "double-tree-1": ("double-tree", lambda data, n: {"pipeline": 1}),
    "double-tree-3": ("double-tree", lambda data, n: {"pipeline": 3}),
    "hierarchical": (
        "hierarchical",
        lambda data, n: {"group": data.draw(st.sampled_from(divisors(n)), label="group")},
    ),
    "hierarchical-default": ("hierarchical", lambda data, n: {}),
    "flextree-widths": (
        "flextree",
        lambda data, n: {"widths": list(data.draw(st.sampled_from(ordered_factorizations(n)), label="widths"))},
    ),
    "flextree-chosen": (
        "flextree",
        lambda data, n: {"flow_alpha": data.draw(st.sampled_from([0.0, 2e-6, 5e-6, 20e-6]), label="flow_alpha")},
    ),
}

# fixed option sets for the deterministic sweeps (N = 1 … 17)
FIXED = {
    "ring": ("ring", {}),
    "mesh": ("mesh", {}),
    "ps-separate": ("ps", {"shards": 3}),
    "ps-colocated": ("ps", {"colocated": True, "shards": 1}),
    "ps-mesh": ("ps", {"colocated": True}),
    "halving-doubling": ("halving-doubling", {}),
    "tree": ("tree", {}),
    "double-tree-1": ("double-tree", {"pipeline": 1}),
    "double-tree-3": ("double-tree", {"pipeline": 3}),
    "hierarchical-default": ("hierarchical", {}),
    "flextree-chosen": ("flextree", {}),
    "flextree-tuned": ("flextree", {"flow_alpha": 5e-6}),
}


def gradients(seed: int, n: int, size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-(10**6), 10**6, size, dtype=np.int64) for _ in range(n)]


def check_allreduce(schedule: Schedule, n: int, grads: list[np.ndarray], offset: int, length: int) -> None:
    assert schedule.workers == tuple(range(n))
    out = simulate(schedule, grads)  # validates first
    total = np.sum(grads, axis=0)
    end = offset + length
    for w in range(n):
        assert np.array_equal(out[w][offset:end], total[offset:end]), f"worker {w} range not reduced"
        assert np.array_equal(out[w][:offset], grads[w][:offset]), f"worker {w} changed before the range"
        assert np.array_equal(out[w][end:], grads[w][end:]), f"worker {w} changed after the range"


# -- exact sums ----------------------------------------------------------------------------


@pytest.mark.parametrize("label", CASES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_exact_sum_random(label, data):
    name, options = CASES[label]
    n = data.draw(st.integers(2, 17), label="n")
    opts = options(data, n)
    length = data.draw(st.integers(1, 5 * n + 7), label="length")
    offset = data.draw(st.integers(0, 9), label="offset")
    size = offset + length + data.draw(st.integers(0, 9), label="after")
    schedule = builder(name)(Context(n, options=opts), size, offset, length)
    check_allreduce(schedule, n, gradients(data.draw(st.integers(0, 2**32 - 1)), n, size), offset, length)


@pytest.mark.parametrize("label", FIXED)
def test_exact_sum_every_n(label):
    """Every N from 1 to 17 (primes, powers of two), lengths 0, 1, < N, N, 5N+7."""
    name, opts = FIXED[label]
    for n in range(1, 18):
        for length in sorted({0, 1, max(1, n - 1), n, n + 1, 5 * n + 7}):
            schedule = builder(name)(Context(n, options=opts), length + 3, 2, length)
            check_allreduce(schedule, n, gradients(n * 1000 + length, n, length + 3), 2, length)
            if n == 1 or length == 0:
                assert schedule.steps == [], "nothing to exchange"


def test_length_none_means_to_the_end():
    for name, opts in FIXED.values():
        schedule = builder(name)(Context(5, options=opts), 23, 4)
        check_allreduce(schedule, 5, gradients(7, 5, 23), 4, 19)


# -- partitioning --------------------------------------------------------------------------


@pytest.mark.parametrize("label", CASES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_partitioned_buffer_reduces(label, data):
    name, options = CASES[label]
    n = data.draw(st.integers(2, 17), label="n")
    ctx = Context(n, options=options(data, n))
    tensor_sizes = data.draw(st.lists(st.integers(0, 3 * n + 5), min_size=1, max_size=6), label="tensors")
    max_bytes = data.draw(st.none() | st.integers(1, 80), label="max_bytes")
    size = sum(tensor_sizes)
    parts = partitions(tensor_sizes, max_bytes)
    grads = gradients(data.draw(st.integers(0, 2**32 - 1)), n, size)
    buffers = [g.copy() for g in grads]
    # correctness of many tiny partitions, not the plan budget (test_work_budget.py): no limit
    for part, schedule in schedules(name, ctx, size, parts, limit=10**7):
        assert schedule.size == size
        touched = {(t.offset, t.end) for _, t in schedule.transfers()}
        assert all(part.offset <= a and b <= part.offset + part.length for a, b in touched)
        out = simulate(schedule, buffers)
        buffers = [out[w] for w in schedule.workers]
    total = np.sum(grads, axis=0)
    for w in range(n):
        assert np.array_equal(buffers[w], total)


# -- bytes and steps (REFERENCE.md §2) ---------------------------------------------------------


@pytest.mark.parametrize("name", ["ring", "mesh"])
@pytest.mark.parametrize("n", range(2, 18))
def test_ring_and_mesh_bytes(name, n):
    length = 3 * n
    schedule = builder(name)(Context(n), length)
    each = 2 * (n - 1) * 3 * ITEM  # 2(N−1)/N · S
    assert schedule.bytes_sent() == [each] * n
    assert schedule.bytes_received() == [each] * n
    assert len(schedule.steps) == (2 * (n - 1) if name == "ring" else 2)


@pytest.mark.parametrize("n", range(2, 18))
def test_ps_separate_bytes(n):
    for m in range(1, n + 3):
        length = 5 * m
        s = length * ITEM
        schedule = builder("ps")(Context(n, options={"shards": m}), length)
        assert schedule.ranks == n + m and schedule.servers == tuple(range(n, n + m))
        assert len(schedule.steps) == 2
        sent, received = schedule.bytes_sent(), schedule.bytes_received()
        assert sent[:n] == [s] * n and received[:n] == [s] * n  # worker: S each way
        assert sent[n:] == [n * s // m] * m and received[n:] == [n * s // m] * m  # server: N·S/M
        assert {t.op for t in schedule.steps[0]} == {"reduce"} and {t.op for t in schedule.steps[1]} == {"copy"}


@pytest.mark.parametrize("n", range(2, 18))
def test_ps_colocated_bytes(n):
    for m in range(1, n + 1):
        length = 5 * m
        shard = 5 * ITEM
        schedule = builder("ps")(Context(n, options={"shards": m, "colocated": True}), length)
        assert schedule.ranks == n and schedule.servers == ()
        for w in range(n):
            owner = w < m
            # pushes every shard it does not own; an owner also sends its shard to N−1 workers
            expected = (m - owner) * shard + owner * (n - 1) * shard
            assert schedule.bytes_sent()[w] == expected
            assert schedule.bytes_received()[w] == expected
    mesh = builder("mesh")(Context(n), 7 * n)
    colocated = builder("ps")(Context(n, options={"colocated": True}), 7 * n)
    assert [set(step) for step in colocated.steps] == [set(step) for step in mesh.steps]  # M = N is mesh


@pytest.mark.parametrize("n", range(2, 18))
def test_halving_doubling_bytes_and_steps(n):
    p = 1 << (n.bit_length() - 1)
    r = n - p
    d = p.bit_length() - 1
    length = 4 * p
    s = length * ITEM
    schedule = builder("halving-doubling")(Context(n), length)
    hd = 2 * (p - 1) * s // p  # 2(p−1)/p · S
    assert len(schedule.steps) == 2 * d + (2 if r else 0)
    expected = [hd] * n
    for i in range(r):
        expected[2 * i] = s  # sits out: sends its whole range, gets the result back
        expected[2 * i + 1] = hd + s
    assert schedule.bytes_sent() == expected
    assert schedule.bytes_received() == expected


@pytest.mark.parametrize("n", range(2, 18))
def test_tree_bytes_and_steps(n):
    """Rank r ≠ 0 sends S up and receives S down; it receives S from and sends S to each child
    r + 2^t (2^t below r's lowest set bit, r + 2^t < N); so the root receives and sends
    ⌈log2 N⌉ · S, and 2(N−1) · S cross the network."""
    levels = math.ceil(math.log2(n))
    length = 3
    s = length * ITEM
    schedule = builder("tree")(Context(n), length)
    assert len(schedule.steps) == 2 * levels
    for r in range(n):
        low = r & -r if r else 1 << levels
        children = sum(1 for t in range(levels) if (1 << t) < low and r + (1 << t) < n)
        expected = ((r != 0) + children) * s
        assert schedule.bytes_sent()[r] == expected
        assert schedule.bytes_received()[r] == expected
    assert schedule.bytes_sent()[0] == schedule.bytes_received()[0] == levels * s
    assert sum(schedule.bytes_sent()) == 2 * (n - 1) * s


@pytest.mark.parametrize("pipeline", [1, 2, 3])
@pytest.mark.parametrize("n", range(2, 18))
def test_double_tree_bytes_steps_and_shape(n, pipeline):
    trees = dtree_parents(n)
    half = pipeline * 3 * ITEM  # S/2, divisible into `pipeline` chunks
    schedule = builder("double-tree")(Context(n, options={"pipeline": pipeline}), 2 * pipeline * 3)
    interiors, leaves, height = [], [], 0
    for parents in trees:
        assert parents.count(-1) == 1
        for r in range(n):  # every rank reaches the root
            seen, v = 0, r
            while parents[v] >= 0:
                v, seen = parents[v], seen + 1
                assert seen < n, "cycle"
            height = max(height, seen)
        interiors.append({p for p in parents if p >= 0})
        leaves.append(set(range(n)) - interiors[-1])
    # complementary: no rank is a leaf in both; only rank 0 (odd N) is interior in both
    assert not leaves[0] & leaves[1]
    assert interiors[0] & interiors[1] == (set() if n % 2 == 0 else {0})
    for r in range(n):
        expected = sum(((parents[r] >= 0) + parents.count(r)) * half for parents in trees)
        assert schedule.bytes_sent()[r] == expected <= 2 * 2 * half  # ≤ 2S per rank
        assert schedule.bytes_received()[r] == expected
    assert sum(schedule.bytes_sent()) == 2 * (n - 1) * 2 * half  # S/2 each way on 2(N−1) edges
    assert len(schedule.steps) == 2 * height + pipeline - 1


@pytest.mark.parametrize("n", range(2, 18))
def test_hierarchical_cross_group_bytes(n):
    for x in divisors(n):
        y = n // x
        length = 2 * n
        s = length * ITEM
        schedule = builder("hierarchical")(Context(n, options={"group": x}), length)
        group = {r: r // x for r in range(n)}
        across = [0] * n
        for _, t in schedule.transfers():
            if group[t.src] != group[t.dst]:
                across[t.src] += t.length * ITEM
        assert across == [2 * (y - 1) * s // (x * y)] * n  # 2(Y−1)/(XY) · S
        assert schedule.bytes_sent() == [2 * (n - 1) * s // n] * n  # ring's bytes
        assert len(schedule.steps) == 2 * (x - 1) + 2 * (y - 1)


def test_hierarchical_groups_from_topology(topo):
    leafspine = topo("leafspine", leaves=3, spines=2, servers_per_leaf=4)
    names = [node.name for node in leafspine.servers]
    schedule = builder("hierarchical")(Context(12, topology=leafspine), 24)
    assert schedule.meta["groups"] == [list(range(i, i + 4)) for i in (0, 4, 8)]
    # ranks follow ctx.nodes: interleave the leaves, and groups become strided
    nodes = tuple(names[i::4][j] for i in range(4) for j in range(3))
    ctx = Context(12, topology=leafspine, nodes=nodes)
    schedule = builder("hierarchical")(ctx, 24)
    assert sorted(map(sorted, schedule.meta["groups"])) == [list(range(j, 12, 3)) for j in range(3)]
    check_allreduce(schedule, 12, gradients(1, 12, 24), 0, 24)
    # groups that do not cover the workers evenly, or BCube's per-level dict: the default
    assert builder("hierarchical")(Context(6, topology=leafspine), 12).meta["groups"] == [[0, 1], [2, 3], [4, 5]]
    bcube = topo("bcube", n=3, k=1)
    assert builder("hierarchical")(Context(9, topology=bcube), 9).meta["groups"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    # the option wins over the topology
    assert builder("hierarchical")(Context(12, topology=leafspine, options={"group": 6}), 24).meta["groups"] == [
        list(range(6)),
        list(range(6, 12)),
    ]


@pytest.mark.parametrize("n", range(2, 18))
def test_flextree_bytes_and_steps(n):
    length = 2 * n
    s = length * ITEM
    for widths in ordered_factorizations(n) + [(1, n), (n, 1, 1)]:
        schedule = builder("flextree")(Context(n, options={"widths": list(widths)}), length)
        assert schedule.bytes_sent() == [2 * (n - 1) * s // n] * n
        assert schedule.bytes_received() == [2 * (n - 1) * s // n] * n
        assert len(schedule.steps) == 2 * sum(1 for w in widths if w > 1)
        levels = [i for i, w in enumerate(widths) if w > 1]
        for index, step in enumerate(schedule.steps):  # scatter levels up, gather levels down
            level = levels[min(index, len(schedule.steps) - 1 - index)]
            for t in step:  # peers differ in the level's digit only
                assert [a != b for a, b in zip(digits(t.src, widths), digits(t.dst, widths))] == [
                    i == level for i in range(len(widths))
                ]


def digits(rank: int, widths: tuple[int, ...]) -> list[int]:
    out = []
    for w in widths:
        rank, digit = divmod(rank, w)
        out.append(digit)
    return out


def flextree_model(widths, flow_alpha, nbytes=4e6, alpha=20e-6, beta=8e-9) -> float:
    """The cost flextree documents, written out again: Σ 2α + 2(w−1)α_flow + 2(w−1)/w·S_i·β."""
    total, data = 0.0, nbytes
    for w in widths:
        total += 2 * alpha + 2 * (w - 1) * flow_alpha + 2 * (w - 1) / w * data * beta
        data /= w
    return total


def test_flextree_choice():
    # the seed slides' two-level factorizations are all candidates
    assert {(2, 6), (3, 4), (4, 3), (6, 2)} <= set(ordered_factorizations(12))
    assert set(ordered_factorizations(15)) == {(15,), (3, 5), (5, 3)}
    for n in range(1, 40):
        # the REFERENCE model's bandwidth terms telescope: one level (mesh) always wins
        assert choose_widths(n, 4e6) == ((n,) if n > 1 else ())
        for flow_alpha in (1e-6, 5e-6, 20e-6):
            chosen = choose_widths(n, 4e6, 20e-6, 8e-9, flow_alpha)
            best = min(flextree_model(w, flow_alpha) for w in ordered_factorizations(n))
            assert math.prod(chosen) == n
            assert flextree_model(chosen, flow_alpha) <= best * (1 + 1e-9)
    assert choose_widths(12, 4e6, flow_alpha=5e-6) == (3, 4)
    ctx = Context(12, options={"flow_alpha": 5e-6})
    assert builder("flextree")(ctx, 48).meta["widths"] == [3, 4]


# -- helpers and invalid options ---------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_hd_steps_among_mapped_ranks(data):
    """hd_steps among any ranks, in any order (HDRM's rank mapping), sums only those ranks."""
    total_ranks = data.draw(st.integers(1, 12))
    p = data.draw(st.sampled_from([q for q in (1, 2, 4, 8) if q <= total_ranks]))
    ranks = data.draw(st.permutations(range(total_ranks)))[:p]
    offset, length = data.draw(st.integers(0, 5)), data.draw(st.integers(0, 30))
    size = offset + length + 2
    schedule = Schedule("hd-subset", total_ranks, size)
    steps = hd_steps(ranks, offset, length, nic=1)
    assert len(steps) == 2 * (p.bit_length() - 1)
    for step in steps:
        schedule.add_step(step)
    assert all(t.nic == 1 for _, t in schedule.transfers())
    grads = gradients(data.draw(st.integers(0, 1000)), total_ranks, size)
    out = simulate(schedule, grads)
    total = np.sum([grads[r] for r in ranks], axis=0)
    for r in range(total_ranks):
        expected = grads[r].copy()
        if r in ranks:
            expected[offset : offset + length] = total[offset : offset + length]
        assert np.array_equal(out[r], expected)


@pytest.mark.parametrize(
    "name, n, options, message",
    [
        ("hierarchical", 12, {"group": 5}, "does not divide"),
        ("hierarchical", 7, {"group": 2}, "does not divide"),
        ("hierarchical", 6, {"group": 0}, "does not divide"),
        ("flextree", 12, {"widths": [3, 3]}, "product 12"),
        ("flextree", 6, {"widths": [6, 0]}, "product 6"),
        ("ps", 4, {"shards": 5, "colocated": True}, "colocated shards"),
        ("ps", 4, {"shards": 0}, "at least 1"),
        ("double-tree", 4, {"pipeline": 0}, "at least 1"),
    ],
)
def test_invalid_options(name, n, options, message):
    with pytest.raises(ValueError, match=message):
        builder(name)(Context(n, options=options), 60)


def test_hd_steps_needs_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        hd_steps([0, 1, 2], 0, 10)


def test_schedules_validate_with_tiny_ranges():
    """Ranges shorter than N leave empty chunks; no zero-length transfer survives."""
    for name, opts in FIXED.values():
        for n in (5, 12, 16):
            schedule = builder(name)(Context(n, options=opts), 3)
            validate(schedule)
            assert all(t.length > 0 for _, t in schedule.transfers())
