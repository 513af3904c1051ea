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


def test_a_busy_machine_is_blamed_before_the_model():
    judged = judge(GOOD | {"ratio": 0.7, "cpu_idle_share": 0.05})
    assert judged["verdict"] == "degraded" and len(judged["reasons"]) == 2
    assert not any("model is off" in reason for reason in judged["reasons"])


def test_the_band_edges_are_ok():
    assert judge(GOOD | {"ratio": 0.90})["verdict"] == judge(GOOD | {"ratio": 1.10})["verdict"] == "ok"


def test_missing_facts_skip_their_checks():
    assert judge({"ratio": None})["verdict"] == "ok"
    assert len(judge(GOOD | {"cpu_idle_share": 0.1, "ratio": 2.0})["reasons"]) == 2
