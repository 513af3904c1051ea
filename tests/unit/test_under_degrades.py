"""Link-degrades priced over the iterations they held (control/iterations.py), worked by hand:
one function serves the experiment's timeline and a degrade made by hand during the Python
API's run (issue 30)."""

from __future__ import annotations

import pytest

from orchestrator.control.iterations import Degrade, degrades_of, under_degrades

# two agents; iteration i computes 0.1 s before 10 + 2i and synchronises 1.0 s (rank 1: 0.8 s),
# so it spans [9.9 + 2i, 11.0 + 2i]: 0 [9.9, 11], 1 [11.9, 13], 2 [13.9, 15], 3 [15.9, 17],
# 4 [17.9, 19], 5 [19.9, 21]; its time per synchronisation is 2 s less 0.1 s of compute
# (the first: 1.0 s)
RECORDS = [{"rank": r, "iteration": i, "start_time": 10.0 + 2 * i, "compute_s": 0.1, "gst_s": 1.0 - 0.2 * r}
           for i in range(6) for r in range(2)]


def _priced(calls: list):
    def predict(rates: dict) -> float:
        calls.append(dict(rates))
        return 1.0 + len(rates)  # what the model says depends on how many directions are slowed
    return predict


def test_a_degrade_is_priced_over_the_iterations_it_held_from_start_to_end():
    calls: list = []
    # applied between iterations 1 and 2, undone during 4: it held 2 and 3 whole
    [entry] = under_degrades(RECORDS, [Degrade("link-degrade", "h0-sw", 50e6, 13.5, 18.5)], 1, _priced(calls))
    assert calls == [{("h0", "sw"): 50e6, ("sw", "h0"): 50e6}]
    assert entry == {"action": "link-degrade", "target": "h0-sw", "rate": "50Mbit", "iterations": [2, 3],
                     "alongside": [], "measured_s": pytest.approx(1.9), "predicted_s": 3.0,
                     "ratio": pytest.approx(1.9 / 3.0)}


def test_the_warm_up_is_left_out_and_a_degrade_never_undone_holds_to_the_end():
    calls: list = []
    [entry] = under_degrades(RECORDS, [Degrade("link-degrade", "h0-sw", 50e6, 0.0, None, "50Mbit")], 2, _priced(calls))
    assert entry["iterations"] == [2, 3, 4, 5] and entry["rate"] == "50Mbit"


def test_a_degrade_that_held_no_iteration_whole_is_listed_unpriced():
    calls: list = []
    [entry] = under_degrades(RECORDS, [Degrade("link-degrade", "h0-sw", 50e6, 12.0, 12.5)], 0, _priced(calls))
    assert entry["iterations"] == [] and entry["predicted_s"] is None and entry["ratio"] is None and calls == []


def test_overlapping_degrades_price_their_shared_iterations_together_and_skip_those_they_changed_under():
    calls: list = []
    first = Degrade("link-degrade", "h0-sw", 50e6, 11.5, 22.0)  # holds 1 to 5
    second = Degrade("link-degrade", "h1-sw", 20e6, 15.5, 17.5)  # holds 3, between 2 and 4
    out = under_degrades(RECORDS, [first, second], 0, _priced(calls))
    by = {(e["target"], tuple(e["alongside"])): e for e in out}
    assert len(out) == 3
    assert by[("h0-sw", ())]["iterations"] == [1, 2, 4, 5]
    assert by[("h0-sw", ("h1-sw",))]["iterations"] == [3]
    assert by[("h1-sw", ("h0-sw",))]["iterations"] == [3]
    assert {("h0", "sw"): 50e6, ("sw", "h0"): 50e6, ("h1", "sw"): 20e6, ("sw", "h1"): 20e6} in calls
    assert by[("h0-sw", ("h1-sw",))]["predicted_s"] == by[("h1-sw", ("h0-sw",))]["predicted_s"] == 5.0
    assert len(calls) == 2  # the two share iteration 3's rates: the model is asked once for them


def test_an_iteration_a_degrade_began_within_is_priced_by_none():
    calls: list = []
    first = Degrade("link-degrade", "h0-sw", 50e6, 11.5, 22.0)
    second = Degrade("link-degrade", "h1-sw", 20e6, 16.5, 30.0)  # begins inside iteration 3
    out = under_degrades(RECORDS, [first, second], 0, _priced(calls))
    alone = next(e for e in out if e["target"] == "h0-sw" and not e["alongside"])
    assert alone["iterations"] == [1, 2]
    together = next(e for e in out if e["target"] == "h0-sw" and e["alongside"])
    assert together["iterations"] == [4, 5]


def test_the_later_of_two_degrades_on_one_link_is_the_rate_in_effect():
    calls: list = []
    out = under_degrades(RECORDS, [Degrade("link-degrade", "h0-sw", 20e6, 13.0, None),
                                   Degrade("link-degrade", "h0-sw", 50e6, 11.5, None)], 0, _priced(calls))
    both = [e for e in out if e["alongside"]]
    assert [e["iterations"] for e in both] == [[2, 3, 4, 5], [2, 3, 4, 5]]
    assert calls[0] == {("h0", "sw"): 20e6, ("sw", "h0"): 20e6}  # applied 13.0, after the other's 11.5
    alone = [e for e in out if not e["alongside"]]
    assert [(e["rate"], e["iterations"]) for e in alone] == [("50Mbit", [1])]  # before the second


def test_the_lab_fault_log_gives_applied_degrades_with_a_rate_on_a_link():
    events = [
        {"id": "f1", "action": "link-degrade", "target": "h0-sw", "params": {"rate": 50000000}, "applied": 5.0,
         "undone": 9.0},
        {"id": "f2", "action": "link-degrade", "target": "h1-sw", "params": {"delay": 0.01}, "applied": 5.0,
         "undone": None},  # no rate: nothing the model prices
        {"id": "f3", "action": "link-down", "target": "h1-sw", "params": {}, "applied": 5.0, "undone": None},
        {"id": "f4", "action": "link-degrade", "target": "h2-sw", "params": {"rate": 1e7}, "applied": None,
         "undone": None},  # planned, never applied
        {"id": "f5", "action": "link-degrade", "target": "sw", "params": {"rate": 1e7}, "applied": 1.0,
         "undone": None},  # not a link
    ]
    assert degrades_of(events) == [Degrade("link-degrade", "h0-sw", 50e6, 5.0, 9.0)]


def test_a_degrade_not_shown_only_keeps_the_others_company():
    """The Python API leaves out a degrade in effect all through the run (the run's own
    prediction has it) but prices the others' iterations with its rate too."""
    calls: list = []
    old = Degrade("link-degrade", "h1-sw", 20e6, 0.0, None)
    new = Degrade("link-degrade", "h0-sw", 50e6, 13.5, None)
    [entry] = under_degrades(RECORDS, [old, new], 0, _priced(calls), shown=lambda d: d is new)
    assert entry["target"] == "h0-sw" and entry["alongside"] == ["h1-sw"] and entry["iterations"] == [2, 3, 4, 5]
    assert calls == [{("h0", "sw"): 50e6, ("sw", "h0"): 50e6, ("h1", "sw"): 20e6, ("sw", "h1"): 20e6}]
