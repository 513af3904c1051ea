"""Work budgeted from the plan before anything is allocated (issue 27, items 1 and 2).

Every algorithm's options go through its own model (unknown keys, bad booleans, counts out
of range refused in one line naming the option); every algorithm states an upper bound of
its transfers, checked here against what it really builds, so a plan too big to build is
refused from arithmetic alone; and a build that outgrows the budget anyway (a plugin with no
estimate) is stopped by the guard with its memory bounded.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from orchestrator import topology as topology_lib
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import MAX_PARTITIONS, partitions
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.spec import lab_from_argument


def topo(shorthand: str):
    return topology_lib.from_lab(lab_from_argument(shorthand))


def ctx_on(shorthand: str, **options) -> Context:
    t = topo(shorthand)
    names = tuple(s.name for s in t.servers)
    return Context(len(names), t, names, options)


def held(schedules) -> int:
    return sum(len(step) for _, schedule in schedules for step in schedule.steps)


# -- the estimates bound what is built, and closely ----------------------------------------------
GENERIC = ["ring", "mesh", "ps", "halving-doubling", "tree", "double-tree", "hierarchical", "flextree"]
OPTIONS = {"ps": [{}, {"shards": 3}, {"shards": 2, "colocated": True}], "double-tree": [{}, {"pipeline": 4}],
           "hierarchical": [{}, {"group": 1}], "flextree": [{}]}


@pytest.mark.parametrize("name", GENERIC)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 8, 9, 12, 16, 17])
def test_estimate_bounds_generic_algorithms(name, n):
    for options in OPTIONS.get(name, [{}]):
        if options.get("colocated") and options["shards"] > n:
            continue
        ctx = Context(n, options=options)
        parts = partitions([1000, 37], 2048)
        built = registry.schedules(name, ctx, 1037, parts)
        bound = registry.estimate(name, ctx, parts)
        actual = held(built)
        assert actual <= bound, (name, n, options, actual, bound)
        # tight: a size-independent count, off only by ranges too small to cut
        big = registry.schedules(name, ctx, 10**6, partitions([10**6], None))
        assert held(big) == registry.estimate(name, ctx, partitions([10**6], None)), (name, n, options)


@pytest.mark.parametrize("name, labs", [
    ("hips", ["bcube,2,1", "bcube,4,1", "bcube,3,2", "torus,4,2", "torus,3,3", "torus,5,2"]),
    ("bml", ["bcube,2,1", "bcube,4,1", "bcube,3,2", "bcube,5,1"]),
    ("hdrm", ["bigraph,4,4", "bigraph,2,2", "bigraph,6,3", "bigraph,4,3"]),
])
def test_estimate_bounds_topology_algorithms(name, labs):
    for lab in labs:
        ctx = ctx_on(lab)
        parts = partitions([10**6], None)
        actual = held(registry.schedules(name, ctx, 10**6, parts))
        assert actual == registry.estimate(name, ctx, parts), (name, lab)


@pytest.mark.parametrize("lab, failed", [("bcube,4,1", ["h11"]), ("bcube,3,2", ["h000", "h111"]),
                                         ("bcube,5,1", ["h00", "h22", "h44"]), ("bcube,2,1", ["h01"])])
@pytest.mark.parametrize("name", ["bml", "hips"])
def test_estimate_bounds_failures(name, lab, failed):
    ctx = ctx_on(lab, failed=failed)
    parts = partitions([10**5], None)
    try:
        actual = held(registry.schedules(name, ctx, 10**5, parts))
    except ValueError as exc:  # a failure set the algorithm cannot survive says so
        assert "fail" in str(exc)
        return
    assert actual <= registry.estimate(name, ctx, parts)


# -- the plan is refused before it is built -----------------------------------------------------
def test_quadratic_plan_refused_from_arithmetic():
    ctx = ctx_on("star,4000")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"31,992,000 transfers .* more than the 60,000"):
            registry.schedules("mesh", ctx, 10**6, partitions([10**6], None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak


def test_partitions_counted_before_made():
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"partition_bytes: 1 B cuts .* 1,048,576 partitions, more than 10,000"):
            partitions([1 << 20], 1, itemsize=4)  # 4 MiB in 1-byte partitions (1 element each)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert len(partitions([MAX_PARTITIONS], 4)) == MAX_PARTITIONS  # the limit itself is fine


def test_many_partitions_times_transfers_refused():
    parts = partitions([5000 * 64], 256)  # 5,000 partitions
    with pytest.raises(ValueError, match=r"in 5,000 partitions is 560,000 transfers"):
        registry.schedules("ring", Context(8), 5000 * 64, parts)


def test_guard_stops_a_builder_without_estimate():
    def endless(ctx, size, offset=0, length=None):
        schedule = Schedule("endless", ctx.workers, size)
        step = []
        while True:  # a plugin's bug: never stops making transfers
            step.append(Transfer(0, 1, offset, 1, "reduce"))

    registry.register("endless-test", endless)
    try:
        tracemalloc.start()
        with pytest.raises(ValueError, match=r"endless-test made more than 120,000 transfers"):
            registry.schedules("endless-test", Context(2), 10, partitions([10], None))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 256 << 20, peak
    finally:
        del registry.ALGORITHMS["endless-test"]


def test_guard_counts_what_schedules_hold():
    def wide(ctx, size, offset=0, length=None):
        schedule = Schedule("wide", 2, size)
        for _ in range(3):
            schedule.add_step([Transfer(0, 1, offset, 1, "reduce")] * 100)  # 300 held, 3 made
        return schedule

    registry.register("wide-test", wide)
    try:
        with pytest.raises(ValueError, match=r"holds 300 transfers per allreduce, more than the 200"):
            registry.schedules("wide-test", Context(2), 10, partitions([10], None), limit=200)
    finally:
        del registry.ALGORITHMS["wide-test"]


# -- options: one model per algorithm -------------------------------------------------------------
@pytest.mark.parametrize("name, options, message", [
    ("ps", {"shards": 1_000_000_000}, "option shards: Input should be less than or equal to 4096"),
    ("ps", {"shards": 0}, "option shards: Input should be greater than or equal to 1"),
    ("ps", {"colocated": "maybe"}, "option colocated: Input should be a valid boolean"),
    ("ps", {"bogus": 1}, "option bogus: ps has no such option (its options: shards, colocated)"),
    ("mesh", {"x": "y"}, "option x: mesh has no such option (its options: none)"),
    ("ring", {"order": "abc"}, "option order: Input should be a valid list"),
    ("double-tree", {"pipeline": 10**9}, "option pipeline: Input should be less than or equal to 1024"),
    ("hierarchical", {"group": -1}, "option group: Input should be greater than or equal to 1"),
    ("flextree", {"alpha": float("nan")}, "option alpha: Input should be a finite number"),
    ("flextree", {"widths": []}, "option widths: List should have at least 1 item"),
    ("bml", {"failed": 3}, "option failed"),
])
def test_bad_options_refused_in_one_line(name, options, message):
    with pytest.raises(ValueError) as caught:
        registry.check_options(name, options)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_options_normalised_not_extended():
    assert registry.check_options("ps", {"colocated": "true"}) == {"colocated": True}
    assert registry.check_options("ps", {}) == {}
    assert registry.check_options("bml", {"failed": "h11, h22"}) == {"failed": ["h11", "h22"]}


def test_ring_order_must_be_a_permutation():
    with pytest.raises(ValueError, match="order must list each of the 4 workers"):
        registry.schedules("ring", Context(4, options={"order": [0, 1, 1, 3]}), 8, partitions([8], None))


def test_register_refuses_duplicates_and_bad_names():
    with pytest.raises(ValueError, match=r"ring is registered already \(built-in\)"):
        registry.register("ring", lambda *a: None)
    with pytest.raises(ValueError, match="lower case"):
        registry.register("Bad Name", lambda *a: None)


# -- the model: path search and event loop bounded ------------------------------------------------
def test_path_work_refused_before_any_path_is_searched(monkeypatch):
    from orchestrator.cost.predict import MAX_PATH_WORK, check_path_work
    from orchestrator.topology.model import Topology

    t = topo("star,4000")
    schedules = registry.schedules("halving-doubling", Context(4000), 4000, partitions([4000], None))
    searched = []
    monkeypatch.setattr(Topology, "_l2_tree", lambda self, start: searched.append(start) or {})
    monkeypatch.setattr(Topology, "paths", lambda self, a, b: [[a, "sw", b]])
    with pytest.raises(ValueError, match=f"path-search steps, more than the {MAX_PATH_WORK:,}"):
        check_path_work(t, schedules)
    assert not searched


def test_event_loop_stops_at_its_work_limit():
    from orchestrator.cost import Network
    from orchestrator.cost.routes import Routes
    from orchestrator.cost.simulate import ModelTooLarge, simulate

    t = topo("star,16")
    schedules = registry.schedules("ring", Context(16), 1 << 20, partitions([1 << 20], None))
    nodes = [s.name for s in t.servers]
    network = Network(bandwidth=1e9)
    whole = simulate(Routes(t), schedules, nodes, network)
    with pytest.raises(ModelTooLarge, match="flow updates"):
        simulate(Routes(t), schedules, nodes, network, max_work=whole.events)  # fewer than it needs


def test_l2_search_trees_give_the_same_paths_when_evicted(monkeypatch):
    from orchestrator.topology import model

    fresh = topo("bcube,3,1")
    servers = [s.name for s in fresh.servers]
    expected = {(a, b): fresh.paths(a, b) for a in servers for b in servers if a != b}
    monkeypatch.setattr(model, "L2_TREE_ENTRIES", 8)  # every tree evicts the last
    small = topo("bcube,3,1")
    for (a, b), paths in expected.items():
        assert small.paths(a, b) == paths
    assert small._l2_entries <= 8 + max(len(tree) for tree in small._l2_trees.values())


def test_ranges_touching_is_recomputed_after_a_change():
    from orchestrator.cost.ranges import Ranges

    ranges = Ranges()
    ranges.put(0, 10, 0, "a")
    first = ranges.touching(0, 10)
    assert ranges.touching(0, 10) is first  # shared until a change
    ranges.put(5, 10, 1, "b")
    assert sorted(item for item, _, _ in ranges.touching(0, 10)) == ["a", "b"]
    ranges.clear(0, 10)
    assert ranges.touching(0, 10) == []


def test_plan_refuses_a_gradient_beyond_this_machines_memory():
    from orchestrator.errors import SpecError
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "big", "lab": {"name": "big", "topology": {"kind": "star", "servers": 8}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "2G"}}})
    assert make_plan(spec, "big.yaml").points  # no memory given: planned (for another machine)
    with pytest.raises(SpecError, match=r"big.yaml: agents.workload: 8 agents of about 2,144 MiB each .* 16,384 MiB"):
        make_plan(spec, "big.yaml", memory=16 << 30)


def test_plan_counts_the_agents_threads_and_refuses_a_run_this_host_cannot_start():
    """A mesh of 8 runs 8 × (16 + 2 × 7) = 240 threads (every connection: a writer at its
    sender, a reader at its receiver), a ring 8 × 18 = 144; a run past 80 % of the threads
    the host can still start is refused in one line naming the algorithm's field."""
    from orchestrator.errors import SpecError
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "many", "lab": {"name": "many", "topology": {"kind": "star", "servers": 8}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring", "mesh"], "workload": {"kind": "back-to-back", "size": "1M"}}})
    assert [p.threads for p in make_plan(spec, "many.yaml").points] == [144, 240]
    assert make_plan(spec, "many.yaml", tasks=300).points  # 240 ≤ 0.8 × 300
    with pytest.raises(SpecError) as refused:
        make_plan(spec, "many.yaml", tasks=299)
    assert str(refused.value).startswith("many.yaml: agents.algorithms.1: run ")
    assert "its 8 agents need about 240 threads (16 each and 2 per connection) and this host can start 299 more" \
        in str(refused.value) and "\n" not in str(refused.value)


def test_super_packets_are_sized_for_eight_per_smallest_transfer_within_the_kernels_limits():
    from orchestrator.collectives.context import Context
    from orchestrator.collectives.partition import partitions
    from orchestrator.cost.compiled import compile_run
    from orchestrator.emulation.lab import super_packet_bytes

    kib = 1024
    assert [super_packet_bytes(t, 128 * kib) for t in (0, 8 * kib, 512 * kib, 1024 * kib - 4, 1024 * kib, 50 << 20)] \
        == [64 * kib] * 4 + [128 * kib] * 2
    assert super_packet_bytes(50 << 20, 64 * kib) == 64 * kib  # a kernel without BIG TCP: its own limit
    # and at most 5.5 ms of their link's line time (a super-packet crosses whole: the link's unit
    # of time), from 16 KiB: 32 KiB at 50 Mbit, 64 at 100, 128 from 200 Mbit
    assert [super_packet_bytes(50 << 20, 128 * kib, rate) for rate in (1e6, 20e6, 50e6, 100e6, 200e6, 1e9)] \
        == [16 * kib, 16 * kib, 32 * kib, 64 * kib, 128 * kib, 128 * kib]
    assert super_packet_bytes(8 * kib, 128 * kib, 50e6) == 32 * kib  # small transfers: the smaller of the two
    assert super_packet_bytes(50 << 20, 64 * kib, 50e6) == 32 * kib
    # a mesh of 8 at 4 MiB moves 512 KiB transfers (a uneven split: the smallest counts)
    mesh = compile_run("mesh", Context(8), 1 << 20, partitions([1 << 20], None), nodes=[f"h{i}" for i in range(8)])
    assert mesh.smallest_transfer == 4 * ((1 << 20) // 8)
    odd = compile_run("ring", Context(3), 10, partitions([10], None), nodes=["a", "b", "c"])
    assert odd.smallest_transfer == 4 * 3  # 10 elements over 3: 3, 3 and 4


def _split(machine_of: dict[str, str], memory: int | None = None, tasks: int | None = None):
    """Machines of hosts a and b (each on the machine `machine_of` names) with `memory` and
    `tasks` each, as their workers would report them."""
    from orchestrator.experiment.machines import Machines
    from orchestrator.topology.partition import Host

    hosts = [Host(name) for name in sorted(machine_of)]
    return Machines.of_hosts(hosts, {name: {"machine": machine, "memory": memory, "tasks": tasks}
                                     for name, machine in machine_of.items()})


def test_a_split_run_is_held_against_each_machine_its_agents_run_on():
    """Split over two hosts on two machines, each machine holds the agents placed on it: a
    gradient one machine cannot hold for 8 agents fits two holding 4 each; two hosts that are
    one machine (fake hosts: one boot id) still hold all 8, and the refusal names them."""
    from orchestrator.errors import SpecError
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "big", "lab": {"name": "big", "topology": {"kind": "star", "servers": 8}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "1G"}}})
    memory = 7 << 30  # 80 %: 5.6 GiB, for 8 × 1.09 GiB = 8.8 GiB or 4 × 1.09 = 4.4 GiB
    with pytest.raises(SpecError, match=r"8 agents .* this machine has available"):
        make_plan(spec, "big.yaml", memory=memory)
    planned = make_plan(spec, "big.yaml", machines=_split({"a": "m1", "b": "m2"}, memory)).points
    assert sorted(planned[0].threads_on.values()) == [72, 72]  # 4 ring agents of 18 threads each
    assert sum(planned[0].threads_on.values()) == planned[0].threads
    with pytest.raises(SpecError, match=r"8 agents .* 7,168 MiB hosts a, b \(one machine\) have available: give a "
                                        r"smaller size or fewer servers, or more hosts"):
        make_plan(spec, "big.yaml", machines=_split({"a": "m1", "b": "m1"}, memory))
    # unknown (the hosts not up on a dry run): not checked
    assert make_plan(spec, "big.yaml", machines=_split({"a": "m1", "b": "m1"})).points


def test_a_split_run_counts_threads_on_each_machine():
    """A mesh of 8 runs 240 threads: on two machines, 120 each (each agent's 16 and one per
    connection it writes or reads), so 160 threads a machine suffice; on one, they do not."""
    from orchestrator.errors import SpecError
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({
        "name": "many", "lab": {"name": "many", "topology": {"kind": "star", "servers": 8}, "servers": {"runtime": "netns"}},
        "agents": {"algorithms": ["mesh"], "workload": {"kind": "back-to-back", "size": "1M"}}})
    planned = make_plan(spec, "many.yaml", machines=_split({"a": "m1", "b": "m2"}, tasks=160)).points[0]
    assert sorted(planned.threads_on.values()) == [120, 120]
    with pytest.raises(SpecError) as refused:
        make_plan(spec, "many.yaml", machines=_split({"a": "m1", "b": "m1"}, tasks=160))
    assert "its 8 agents need about 240 threads (16 each and 2 per connection) on hosts a, b (one machine) and " \
           "hosts a, b (one machine) can start 160 more" in str(refused.value)
    assert "split the lab over more hosts" in str(refused.value) and "\n" not in str(refused.value)


def test_a_host_reports_its_machine_and_what_it_has():
    """What a host's worker runs (hosts/parts.limits_part), here: this machine's boot id,
    MemAvailable and the threads it can still start."""
    from orchestrator.emulation.capacity import host_limits
    from orchestrator.hosts.parts import limits_part

    limits = limits_part("any")
    assert limits["machine"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert 0 < limits["memory"] and limits["memory"] >> 20 == pytest.approx(host_limits().mem_available_mib, rel=0.2)
    assert limits["tasks"] > 0
