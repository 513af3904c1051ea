"""The fault table, target parsing against a lab's topology, parameters, the partition
ruleset and the fault timeline's reader: all without root."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import FAULT_ACTIONS
from orchestrator.emulation.journal import LabState
from orchestrator.errors import FaultError
from orchestrator.faults import ACTIONS
from orchestrator.faults.actions import action, parse_params, partition_ruleset
from orchestrator.faults.targets import KINDS
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab


class PaperLab:
    """What target parsing reads of a Lab: its name, topology and links."""

    def __init__(self, shorthand: str) -> None:
        self.name = "ftpaper"
        self.topology = from_lab(lab_from_argument(shorthand))

    def links_between(self, a: str, b: str):
        return [l for l in self.topology.links if set(l.nodes()) == {a, b}]


@pytest.fixture(scope="module")
def lab():
    return PaperLab("bcube,2,1")


def test_every_action_has_a_known_target_kind_and_an_undo_and_the_cli_lists_it():
    for name, act in ACTIONS.items():
        assert act.target in KINDS and callable(act.apply) and callable(act.undo)
        assert name in FAULT_ACTIONS
        assert all(healed in ACTIONS for healed in act.heals)
    assert FAULT_ACTIONS.count(",") + 1 == len(ACTIONS)


def test_targets_are_parsed_and_normalised(lab):
    link = KINDS["link"](lab, "l0s0-h00", "link-down")
    assert link.text == "l0s0-h00" and len(link.links) == 1
    switch = KINDS["switch"](lab, "l0s0", "switch-down")
    assert len(switch.links) == 2  # BCube(2,1): a switch holds n servers
    servers = KINDS["servers"](lab, "h00,h01,h00", "partition")
    assert servers.text == "h00,h01" and servers.links == ()


@pytest.mark.parametrize("kind,text,message", [
    ("link", "h00-h11", "has no link between h00 and h11"),
    ("link", "h00-nope", "has no node 'nope'"),
    ("link", "h00", "NODE-NODE"),
    ("switch", "h00", "acts on a switch; h00 is a server"),
    ("server", "l1s0", "acts on a server; l1s0 is a switch"),
    ("servers", "h00,h01,h10,h11", "every server"),
    ("servers", ",", "takes servers"),
])
def test_bad_targets_are_one_line_fault_errors(lab, kind, text, message):
    with pytest.raises(FaultError, match=message) as caught:
        KINDS[kind](lab, text, "an-action")
    assert "\n" not in str(caught.value)


def test_parameters_are_parsed_and_refused_by_name():
    assert parse_params(ACTIONS["link-degrade"], {"rate": "10Mbit", "delay": None}) == {"rate": 10_000_000}
    assert parse_params(ACTIONS["link-flap"], {"period": "200ms", "count": "4"}) == {"period": 0.2, "count": 4}
    with pytest.raises(FaultError, match="does not take --rate"):
        parse_params(ACTIONS["switch-down"], {"rate": "1Mbit"})
    with pytest.raises(FaultError, match="needs --rate"):
        parse_params(ACTIONS["link-degrade"], {})
    with pytest.raises(FaultError, match="count must be at least 1"):
        parse_params(ACTIONS["link-flap"], {"count": "0"})
    with pytest.raises(FaultError, match="no fault action 'boom'"):
        action("boom")
    # a bare number would be tc's milliseconds: a 1 ms flap is never what was meant
    with pytest.raises(FaultError, match="link-flap --period: '1': give a unit"):
        parse_params(ACTIONS["link-flap"], {"period": "1"})


@pytest.mark.parametrize("params,shape", [
    ({"period": 0.2, "count": 1}, ["up"]),
    ({"period": 0.2, "count": 3}, ["up", "down", "up", "down", "up"]),
    ({"period": 1.0, "duration": 2.0}, ["up", "down", "up"]),
    ({}, ["up", "down", "up", "down", "up"]),  # 1 s period, 3 cycles
])
def test_a_flap_is_a_first_cut_then_steps_at_half_periods_ending_up(params, shape):
    steps = ACTIONS["link-flap"].later(params)
    period = params.get("period", 1.0)
    assert [wait for wait, _ in steps] == [period / 2] * len(shape)
    assert [step.__name__ for _, step in steps] == ["_restore" if s == "up" else "_cut" for s in shape]
    assert ACTIONS["link-flap"].apply.__name__ == "_cut"
    assert ACTIONS["link-flap"].takes_duration and not ACTIONS["link-up"].takes_duration


@pytest.mark.parametrize("direction,hooks", [("both", {"input", "output"}), ("in", {"input"}), ("out", {"output"})])
def test_partition_ruleset_drops_the_other_sides_addresses_in_the_asked_direction(direction, hooks):
    script = partition_ruleset("abc123", ["10.0.0.2", "10.0.1.2"], direction)
    assert script.startswith("table inet testbed_fault_abc123\ndelete table inet testbed_fault_abc123\n")
    assert {hook for hook in ("input", "output") if f"hook {hook}" in script} == hooks
    assert "{ 10.0.0.2, 10.0.1.2 }" in script and "forward" not in script


def test_fault_events_merge_phases_and_skip_a_line_cut_short(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path))
    state = LabState("ftevents")
    state.create({}, {"status": "up"})
    state.record_fault_event("a1", "planned", "link-down", "h00-l0s0", {}, at=10.0)
    state.record_fault_event("a1", "applied", "link-down", "h00-l0s0", {}, at=10.5)
    state.record_fault_event("b2", "planned", "server-pause", "h01", {}, at=11.0)
    assert [f["id"] for f in state.active_faults()] == ["a1", "b2"]
    state.record_fault_event("a1", "undone", "link-down", "h00-l0s0", {}, at=12.0)
    with open(state.dir / "faults.jsonl", "a") as handle:
        handle.write('{"id": "c3", "phase": "pla')  # a kill mid-line
    events = state.fault_events()
    assert events[0] == {"id": "a1", "action": "link-down", "target": "h00-l0s0", "params": {}, "planned": 10.0,
                         "applied": 10.5, "undone": 12.0}
    assert [f["id"] for f in state.active_faults()] == ["b2"]
    events[0]["undone"] = None  # callers get copies: the cache stays right
    assert state.fault_events()[0]["undone"] == 12.0
    assert json.loads((state.dir / "faults.jsonl").read_text().splitlines()[0])["phase"] == "planned"
