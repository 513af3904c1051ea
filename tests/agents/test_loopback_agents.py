"""Real agent processes on loopback: every algorithm completes with exact sums, and the
digits model trains to identical parameters under every algorithm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator import topology
from orchestrator.agent import transports
from tests.transport_params import transport_params
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.control import driver, workloads
from orchestrator.control.local import local_agents
from orchestrator.spec.lab import BCubeSpec, BiGraphSpec

TENSORS = workloads.model_tensors("alexnet", 0.002)  # 16 tensors, ~120 k elements


def _ctx(algorithm: str, workers: int) -> Context:
    if algorithm in ("hips", "bml"):
        return Context(workers, topology.build(BCubeSpec(kind="bcube", n=3, k=1)))
    if algorithm == "hdrm":
        return Context(workers, topology.build(BiGraphSpec(kind="bigraph", switches=4, servers_per_switch=2)))
    if algorithm == "hierarchical":
        return Context(workers, options={"group": 3} if workers % 3 == 0 else {"group": 2})
    if algorithm == "ps":
        return Context(workers, options={"shards": 2})
    return Context(workers)


WORKERS = {"hips": 9, "bml": 9, "hdrm": 8}


@pytest.fixture(scope="module")
def agents():
    with local_agents(11) as endpoints:  # enough for 9 workers + 2 parameter servers
        yield endpoints


@pytest.mark.parametrize("transport", transport_params())
@pytest.mark.parametrize("algorithm", sorted(registry.ALGORITHMS))
def test_every_algorithm_completes_with_exact_sums(agents, algorithm, transport):
    workers = WORKERS.get(algorithm, 6)
    ctx = _ctx(algorithm, workers)
    ranks = registry.builder(algorithm)(ctx, 10).ranks
    endpoints = [
        replace(e, rank=i, role="worker" if i < workers else "ps")
        for i, e in enumerate(agents[:ranks])
    ]
    result = driver.run(endpoints, algorithm, TENSORS, workloads.emulated(TENSORS), iterations=2, ctx=ctx,
                        transport=transport)
    worker_records = [r for r in result.records() if r["rank"] < workers]
    assert len(worker_records) == 2 * workers
    assert all(r["verified"] for r in worker_records)
    assert all(g > 0 for g in result.gst())


def test_partitioned_with_priority_and_credit(agents):
    eps = agents[:5]
    result = driver.run(eps, "ring", TENSORS, workloads.emulated(TENSORS), iterations=2,
                        partition_bytes=16 * 1024, credit_bytes=64 * 1024)
    assert all(r["verified"] for r in result.records())


@pytest.mark.parametrize("algorithm", ["ring", "ps"])
def test_back_to_back_runs_reduce_with_nothing_in_between(agents, algorithm):
    # NCCL-tests' loop: the warm-up reduces a checked gradient; the rest reduce the zeroed
    # buffer again, unrefilled (an agent that refilled it would fail its zero check), with
    # no emulated compute even if the workload asked for some; ps: 2 separate servers
    workers = 3
    eps = [replace(e, rank=i, role="worker" if i < workers else "ps")
           for i, e in enumerate(agents[:5 if algorithm == "ps" else workers])]
    spec = workloads.back_to_back(TENSORS) | {"compute_seconds": 5.0}
    result = driver.run(eps, algorithm, TENSORS, spec, iterations=4, ctx=_ctx(algorithm, workers))
    records = [r for r in result.records() if r["rank"] < workers]
    assert len(records) == 4 * workers and all(r["verified"] for r in records)
    assert all(r["compute_s"] < 1.0 for r in records)
    times = result.back_to_back_times()
    assert len(times) == len(eps) and all(0 < t < max(result.gst()) * 3 for t in times)


def test_a_fixed_window_smaller_than_a_chunk_still_delivers_every_byte():
    # a lab's agents run with a fixed HTTP/2 window (lab_agents.flow_window); flow control
    # must pace, not lose or reorder, chunks larger than the window
    tensors = [300_000, 7, 65_537]
    with local_agents(3, window_bytes=64 * 1024) as eps:
        result = driver.run(eps, "mesh", tensors, workloads.emulated(tensors), iterations=2)
    assert all(r["verified"] for r in result.records())
    assert len(result.records()) == 6


def test_digits_trains_to_identical_parameters_under_every_algorithm(agents):
    workers = 4
    specs = [workloads.digits(workers, rank) for rank in range(workers)]
    tensors = specs[0]["tensors"]
    digests = {}
    for algorithm in ("ring", "mesh", "halving-doubling", "tree", "ps"):
        ctx = Context(workers, options={"shards": 2} if algorithm == "ps" else {})
        ranks = registry.builder(algorithm)(ctx, 10).ranks
        eps = [replace(e, rank=i, role="worker" if i < workers else "ps")
               for i, e in enumerate(agents[:ranks])]
        result = driver.run(eps, algorithm, tensors, specs, iterations=25, ctx=ctx)
        records = [r for r in result.records() if r["rank"] < workers]
        last = [r for r in records if r["iteration"] == 24]
        assert len({r["param_digest"] for r in last}) == 1, algorithm  # every worker agrees
        digests[algorithm] = last[0]["param_digest"]
        first = sum(r["loss"] for r in records if r["iteration"] < 5) / (5 * workers)
        final = sum(r["loss"] for r in records if r["iteration"] >= 20) / (5 * workers)
        assert final < 0.8 * first, (algorithm, first, final)  # the loss falls
    assert len(set(digests.values())) == 1, digests  # and every algorithm trains identically


def test_a_peer_that_dies_mid_run_fails_the_run_naming_a_rank():
    import subprocess
    import threading
    import time

    tensors = [4_000_000]
    with local_agents(4) as eps:
        victim = subprocess.run(["pgrep", "-f", "--", f"--control {eps[2].control}"], capture_output=True, text=True)
        pid = int(victim.stdout.split()[0])
        killer = threading.Timer(1.0, lambda: subprocess.run(["kill", "-9", str(pid)]))
        killer.start()
        started = time.monotonic()
        with pytest.raises(driver.RunError) as failure:
            driver.run(eps, "ring", tensors, workloads.emulated(tensors), iterations=200, timeout=120)
        killer.join()
        # whoever reports it (the dead rank's sender, or the driver polling it), it names rank 2
        assert "rank 2 (local2)" in str(failure.value) and "\n" not in str(failure.value)
        assert time.monotonic() - started < 60  # noticed, not timed out
        survivors = driver.run(eps[:2], "ring", [1000], workloads.emulated([1000]), iterations=1)
        assert all(r["verified"] for r in survivors.records())


def test_a_run_past_its_timeout_is_stopped_and_named_and_the_agents_stay_usable(agents):
    import time

    eps = agents[:3]
    slow = workloads.emulated([1000], compute_seconds=30.0)
    started = time.monotonic()
    with pytest.raises(driver.RunError, match=r"^run timed out waiting for local"):
        driver.run(eps, "ring", [1000], slow, iterations=2, timeout=1.5)
    assert time.monotonic() - started < 15  # the long polls end at the deadline, not after the run
    again = driver.run(eps, "ring", [1000], workloads.emulated([1000]), iterations=1)
    assert all(r["verified"] for r in again.records())


def test_reported_peak_memory_is_the_agents_own_not_its_launchers():
    """Linux carries ru_maxrss across fork and exec: an agent started by a large process
    would report the launcher's size. Launched from a process holding 400 MiB, agents
    moving a small gradient must still report what they use themselves."""
    import numpy as np

    ballast = np.ones(400 * 2**20 // 8)  # touched, so resident in the launcher
    tensors = [250_000]
    with local_agents(3) as eps:
        result = driver.run(eps, "ring", tensors, workloads.emulated(tensors), iterations=2)
    del ballast
    for agent in result.results:
        assert 20 < agent.peak_rss_mib < 200, agent.peak_rss_mib
        assert agent.buffer_mib == pytest.approx(tensors[0] * 4 / 2**20)


@pytest.mark.parametrize("transport", transport_params())
def test_a_traced_run_records_every_transfer_at_both_ends(agents, transport):
    # the trace is what the model's flows are held against: every send of the schedule has
    # its receive, with the same range, and times in order
    workers, elements = 4, 300_000
    eps = [replace(e, rank=i, role="worker") for i, e in enumerate(agents[:workers])]
    ctx = Context(workers)
    result = driver.run(eps, "halving-doubling", [elements], workloads.back_to_back([elements]), iterations=2,
                        ctx=ctx, transport=transport, trace=True)
    rows = result.transfers()
    schedule = registry.builder("halving-doubling")(ctx, elements)
    expected = {(it, step, t.src, t.dst, t.offset, t.length) for it in range(2)
                for step, t in schedule.transfers() if t.length}
    sends = {(r["iteration"], r["step"], r["rank"], r["peer"], r["offset"], r["count"]) for r in rows if r["kind"] == "send"}
    receives = {(r["iteration"], r["step"], r["peer"], r["rank"], r["offset"], r["count"])
                for r in rows if r["kind"] == "receive"}
    assert sends == expected and receives == expected
    assert all(r["begun"] <= r["first"] <= r["last"] for r in rows)
    # a chunk lands after its send began (the sender notes a write once it returns: maybe later)
    began = {(r["iteration"], r["step"], r["rank"], r["peer"], r["offset"]): r["begun"] for r in rows if r["kind"] == "send"}
    assert all(r["first"] >= began[(r["iteration"], r["step"], r["peer"], r["rank"], r["offset"])]
               for r in rows if r["kind"] == "receive")
    untraced = driver.run(eps, "ring", [elements], workloads.back_to_back([elements]), iterations=1, transport=transport)
    assert untraced.transfers() == []


def test_a_run_given_its_compiled_run_runs_it_without_compiling_again(agents, monkeypatch):
    """Issue 30's one compiled run: the runner hands the plan's CompiledRun to the driver,
    which runs those very schedules; another attempt (here: fewer agents) compiles its own."""
    from orchestrator.agent.plan import chunk_bytes_for
    from orchestrator.collectives.partition import partitions
    from orchestrator.cost.compiled import compile_run

    ctx, endpoints = Context(4), [replace(e, rank=i, role="worker") for i, e in enumerate(agents[:4])]
    given = compile_run("ring", ctx, sum(TENSORS), partitions(TENSORS, None),
                        nodes=lambda ranks: driver._rank_nodes(ctx, endpoints, ranks)[0], given=range(4),
                        chunk_bytes=chunk_bytes_for(transports.DEFAULT),
                        send_buffer_bytes=transports.get(transports.DEFAULT).send_buffer,
                        rendezvous=transports.get(transports.DEFAULT).rendezvous)
    compiled_by_driver = []
    real = driver.compile_run
    monkeypatch.setattr(driver, "compile_run", lambda *a, **k: compiled_by_driver.append(a[0]) or real(*a, **k))
    result = driver.run(endpoints, "ring", TENSORS, workloads.emulated(TENSORS), iterations=2, ctx=ctx,
                        compiled=given)
    assert compiled_by_driver == [] and result.compiled is given
    assert all(r["verified"] for r in result.records())
    three = Context(3)
    result = driver.run(endpoints[:3], "ring", TENSORS, workloads.emulated(TENSORS), iterations=1, ctx=three,
                        compiled=given)
    assert compiled_by_driver == ["ring"] and result.compiled is not given
    assert all(r["verified"] for r in result.records())


@pytest.mark.parametrize("algorithm", ["mesh", "ring"])
def test_the_plans_thread_count_bounds_what_the_agents_run(algorithm):
    """experiment/plan.py refuses a run whose agents would need more threads than the host can
    start (agent_threads): that count must hold what real agents run, sampled through the
    run from fresh agents (a run's connections stay open until the next one begins). A mesh
    of 6 runs a writer and a reader per peer in every agent."""
    import os
    import threading

    import psutil

    from orchestrator.collectives.partition import partitions
    from orchestrator.cost.compiled import compile_run
    from orchestrator.experiment.plan import agent_threads

    workers = 6
    with local_agents(workers) as eps:
        pids = [p.pid for p in psutil.process_iter(["cmdline"])
                if any(f"--control {e.control}" in " ".join(p.info["cmdline"] or []) for e in eps)]
        assert len(pids) == workers

        def threads() -> int:
            return sum(len(os.listdir(f"/proc/{pid}/task")) for pid in pids)

        idle, peak, done = threads(), [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], threads())
                done.wait(0.002)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            driver.run(eps, algorithm, TENSORS, workloads.emulated(TENSORS), iterations=3, ctx=Context(workers))
        finally:
            done.set()
            sampler.join()
    estimate = agent_threads(compile_run(algorithm, Context(workers), sum(TENSORS), partitions(TENSORS, None),
                                         nodes=[e.node for e in eps]))
    assert idle < peak[0] <= estimate, (idle, peak[0], estimate)
