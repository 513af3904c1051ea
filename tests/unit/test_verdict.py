"""The fidelity verdict (experiment/verdict.py): each machine check turns a point "degraded"
with a reason that names what was wrong, and only then; a ratio out of the band on a machine
that kept up is "model off", either way."""

from __future__ import annotations

import pytest

from orchestrator.experiment.verdict import DRIFT_SHARE, judge

GOOD = {"cpu_idle_share": 0.6, "seconds": 10.0, "rate_bytes_per_s": 12.5e6, "ratio": 1.04,
        "link_bytes": {"h0→sw": 100e6, "sw→h1": 90e6}, "link_packets": {"h0→sw": 70_000, "sw→h1": 60_000},
        "link_drops": {"h0→sw": 10}}


def test_a_clean_point_is_ok():
    assert judge(GOOD) == {"verdict": "ok", "reasons": []}


@pytest.mark.parametrize("change, words", [
    ({"cpu_idle_share": 0.05}, "5% idle"),
    ({"cpu_steal_share": 0.3}, "the hypervisor held 30% of the CPU time while it ran"),
    ({"link_bytes": {"h0→sw": 140e6}}, "link h0→sw carried 1.12×"),
    ({"link_drops": {"sw→h1": 1200}}, "link sw→h1 dropped 2.0%"),
])
def test_each_machine_check_degrades_with_its_reason(change, words):
    judged = judge(GOOD | change)
    assert judged["verdict"] == "degraded"
    assert len(judged["reasons"]) == 1 and words in judged["reasons"][0], judged


@pytest.mark.parametrize("ratio, words", [(1.53, "measured/predicted 1.53 > 1.10"), (0.75, "0.75 < 0.90")])
def test_a_mispriced_point_on_a_machine_that_kept_up_is_the_models_fault(ratio, words):
    judged = judge(GOOD | {"ratio": ratio})
    assert judged["verdict"] == "model off"
    assert len(judged["reasons"]) == 1 and words in judged["reasons"][0] and "model is off" in judged["reasons"][0]


def test_a_small_gradient_faster_than_the_model_says_its_messages_cross_whole():
    """Transfers no larger than the run's super-packet cross a shaped link as one packet, sent
    whole after idle: the reason says so (the digits MLP's ps, 9.6 KB pushes in 32 KiB
    super-packets at 50 Mbit); larger ones, or a point slower than the model, do not."""
    small = GOOD | {"ratio": 0.74, "smallest_transfer_bytes": 9_604, "super_packet_bytes": 32 * 1024}
    judged = judge(small)
    assert judged["verdict"] == "model off" and len(judged["reasons"]) == 1
    assert "9,604 bytes, fit one 32 KiB super-packet" in judged["reasons"][0], judged
    assert "super-packet" not in judge(small | {"smallest_transfer_bytes": 512 * 1024})["reasons"][0]
    assert "super-packet" not in judge(small | {"ratio": 1.3})["reasons"][0]


def test_a_busy_machine_is_blamed_before_the_model():
    judged = judge(GOOD | {"ratio": 0.7, "cpu_idle_share": 0.05})
    assert judged["verdict"] == "degraded" and len(judged["reasons"]) == 2
    assert not any("model is off" in reason for reason in judged["reasons"])


def test_stolen_cpu_degrades_a_point_its_idle_share_calls_quiet():
    """A virtual machine whose host gives its CPUs to others counts that time as neither idle
    nor busy: the idle share looks quiet while agents and shapers wait. Over MAX_STEAL the
    point is degraded, whatever its ratio; at the bar, or unknown, or not a number, it is not."""
    from orchestrator.experiment.verdict import MAX_STEAL

    held = judge(GOOD | {"ratio": 1.36, "cpu_steal_share": 0.25, "cpu_steal_machine": "b"})
    assert held["verdict"] == "degraded" and len(held["reasons"]) == 2, held
    assert "held 25% of the CPU time of host b" in held["reasons"][0]
    assert not any("model is off" in reason for reason in held["reasons"])
    for quiet in (MAX_STEAL, 0.0, None, float("nan"), True):
        assert judge(GOOD | {"cpu_steal_share": quiet})["verdict"] == "ok", quiet


def test_the_runner_reads_stolen_time_from_the_cpu_counters():
    """_judge takes the steal share from the machines' CPU seconds (the most any machine lost,
    named on a split lab), keeps it with the verdict, and says nothing of it when a reading
    has no steal (a kernel or host that does not count it)."""
    from orchestrator.experiment.runner import _judge

    def counters(here: tuple[float, float, float], hosts: dict[str, tuple[float, float, float]]) -> dict:
        def cpu(idle, busy, steal):
            return {"idle": idle, "busy": busy, "steal": steal}
        return {"cpu": cpu(*here), "bytes": {}, "packets": {}, "drops": {}, "marks": {},
                "host_cpus": {host: cpu(*v) for host, v in hosts.items()}}

    before = counters((0.0, 0.0, 0.0), {"x": (0.0, 0.0, 0.0)})
    after = counters((8.0, 1.0, 1.0), {"x": (6.0, 1.0, 3.0)})  # this machine lost 10 %, host x 30 %
    judged = _judge({"wall_s": 1.0, "ratio": 1.0}, before, after, 1e6)
    assert judged["verdict"] == "degraded" and judged["cpu_steal_share"] == 0.3, judged
    assert any("of host x" in reason for reason in judged["reasons"]), judged["reasons"]
    unknown = {**after, "cpu": {"idle": 9.0, "busy": 1.0}, "host_cpus": {}}
    judged = _judge({"wall_s": 1.0, "ratio": 1.0}, {**before, "host_cpus": {}}, unknown, 1e6)
    assert judged["verdict"] == "ok" and "cpu_steal_share" not in judged, judged


def test_host_cpu_reads_steal_beside_idle_and_busy():
    """/proc/stat's eighth column is steal: host_cpu keeps it apart from idle and busy, and
    steal_share is its part of all three between two readings."""
    from orchestrator.monitoring.exporter import host_cpu, steal_share

    reading = host_cpu()
    assert set(reading) == {"idle", "busy", "steal"} and all(v >= 0 for v in reading.values())
    assert steal_share({"idle": 0.0, "busy": 0.0, "steal": 0.0}, {"idle": 6.0, "busy": 2.0, "steal": 2.0}) == 0.2
    assert steal_share({"idle": 1.0, "busy": 1.0}, {"idle": 2.0, "busy": 2.0}) is None
    assert steal_share(reading, reading) is None


def test_the_band_edges_are_ok():
    assert judge(GOOD | {"ratio": 0.90})["verdict"] == judge(GOOD | {"ratio": 1.10})["verdict"] == "ok"


def test_missing_facts_skip_their_checks():
    assert judge({"ratio": None})["verdict"] == "ok"
    assert len(judge(GOOD | {"cpu_idle_share": 0.1, "ratio": 2.0})["reasons"]) == 2


def test_a_split_labs_cpu_headroom_is_its_busiest_hosts():
    """On a lab split over hosts the agents load the hosts, not the machine that drives: the
    verdict holds the least idle machine against the bar and names it."""
    from orchestrator.experiment.runner import _judge

    def counters(idle_here: float, busy_here: float, hosts: dict[str, tuple[float, float]]) -> dict:
        return {"cpu": {"idle": idle_here, "busy": busy_here}, "bytes": {}, "packets": {}, "drops": {}, "marks": {},
                "host_cpus": {host: {"idle": idle, "busy": busy} for host, (idle, busy) in hosts.items()}}

    before = counters(0.0, 0.0, {"x": (0.0, 0.0), "y": (0.0, 0.0)})
    after = counters(9.0, 1.0, {"x": (8.0, 2.0), "y": (0.5, 9.5)})  # y was 5 % idle; this machine 90 %
    judged = _judge({"wall_s": 1.0, "ratio": 1.0}, before, after, 1e6)
    assert judged["verdict"] == "degraded" and judged["cpu_idle_share"] == 0.05
    assert judged["cpu_idle_by_host"] == {"x": 0.8, "y": 0.05}
    assert any("on host y" in reason for reason in judged["reasons"]), judged["reasons"]
    one_host = _judge({"wall_s": 1.0, "ratio": 1.0}, {**before, "host_cpus": {}}, {**after, "host_cpus": {}}, 1e6)
    assert one_host["verdict"] == "ok" and "cpu_idle_by_host" not in one_host and one_host["cpu_idle_share"] == 0.9


def test_workers_that_drifted_apart_are_named_when_the_model_is_off_either_way():
    """Halving-doubling on star,8 (2 MiB, 200 Mbit, tests/netns/test_entry_spread.py): its
    workers entered each allreduce 37.3 ms apart where the model, from their first entries,
    has them 8.1 ms apart, 1.52 × the model; the reason says so, with both figures. Entries
    within DRIFT_SHARE of a synchronisation of the model's, a point in the band, or facts
    missing or not numbers say nothing of it."""
    drifted = GOOD | {"ratio": 1.52, "entry_spread_s": {"measured": 0.0373, "predicted": 0.0081}, "sync_s": 0.279}
    judged = judge(drifted)
    assert judged["verdict"] == "model off" and len(judged["reasons"]) == 1
    assert "entered each allreduce 37.3 ms apart where the model has them 8.1 ms apart" in judged["reasons"][0], judged
    assert "such skew" in judge(drifted | {"ratio": 0.83})["reasons"][0]  # the skew can speed it up too
    # a tree's workers leave its broadcast apart in the model as well: only the excess counts
    tree = drifted | {"entry_spread_s": {"measured": 0.19, "predicted": 0.176}, "sync_s": 0.9}
    assert "skew" not in judge(tree)["reasons"][0]
    edge = drifted | {"entry_spread_s": {"measured": 0.0081 + DRIFT_SHARE * 0.279, "predicted": 0.0081}}  # that share
    assert "skew" not in judge(edge)["reasons"][0]
    assert judge(drifted | {"ratio": 1.05}) == {"verdict": "ok", "reasons": []}
    for broken in ({"entry_spread_s": None}, {"entry_spread_s": [0.03]}, {"sync_s": None}, {"sync_s": 0.0},
                   {"entry_spread_s": {"measured": float("nan"), "predicted": 0.0}},
                   {"entry_spread_s": {"measured": True, "predicted": 0.0}},
                   {"entry_spread_s": {"measured": "0.03", "predicted": 0.0}}):
        judged = judge(drifted | broken)
        assert judged["verdict"] == "model off" and "skew" not in judged["reasons"][0], broken


def test_a_runs_entries_reach_its_verdict():
    """The runner measures how far apart the workers entered the timed allreduces from their
    records (after the warm-up, workers only, start times that are numbers) and hands that,
    the model's figure and the time per synchronisation to the verdict."""
    from orchestrator.experiment.results import entry_spread
    from orchestrator.experiment.runner import _judge

    records = [{"rank": r, "iteration": i, "start_time": 100.0 + i + 0.01 * r * i} for i in range(4) for r in range(3)]
    records.append({"rank": 3, "iteration": 2, "start_time": 500.0})  # a parameter server: not a worker
    records.append({"rank": 3, "iteration": 3, "start_time": 500.0})
    # a start that is not a number leaves its allreduce short of a worker: not counted
    records += [{"rank": r, "iteration": 4, "start_time": 104.0 + r} for r in (1, 2)]
    records.append({"rank": 0, "iteration": 4, "start_time": float("nan")})
    # iterations 1-3 (warm-up 1): 0.02, 0.04, 0.06 s apart over ranks 0-2
    assert entry_spread(records, 3, 1) == pytest.approx(0.04)
    assert entry_spread(records, 3, 9) is None and entry_spread(records, 0, 1) is None
    counters = {"cpu": {"idle": 9.0, "busy": 1.0}, "bytes": {}, "packets": {}, "drops": {}, "marks": {}}
    zero = {**counters, "cpu": {"idle": 0.0, "busy": 0.0}}
    entry = {"wall_s": 1.0, "ratio": 1.4, "sync_s": {"fault_free_mean": 0.2},
             "entry_spread_s": {"measured": 0.04, "predicted": 0.001}}
    judged = _judge(entry, zero, counters, 1e6)
    assert judged["verdict"] == "model off" and "entered each allreduce 40.0 ms apart" in judged["reasons"][0], judged
    assert "skew" not in _judge({**entry, "entry_spread_s": None}, zero, counters, 1e6)["reasons"][0]
