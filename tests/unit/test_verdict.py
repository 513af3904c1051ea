"""The fidelity verdict (experiment/verdict.py): each machine check turns a point "degraded"
with a reason that names what was wrong, and only then; a ratio out of the band on a machine
that kept up is "model off", either way."""

from __future__ import annotations

import pytest

from orchestrator.experiment.verdict import judge

GOOD = {"cpu_idle_share": 0.6, "seconds": 10.0, "rate_bytes_per_s": 12.5e6, "ratio": 1.04,
        "link_bytes": {"h0→sw": 100e6, "sw→h1": 90e6}, "link_packets": {"h0→sw": 70_000, "sw→h1": 60_000},
        "link_drops": {"h0→sw": 10}}


def test_a_clean_point_is_ok():
    assert judge(GOOD) == {"verdict": "ok", "reasons": []}


@pytest.mark.parametrize("change, words", [
    ({"cpu_idle_share": 0.05}, "5% idle"),
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
