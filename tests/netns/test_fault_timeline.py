"""Fault timelines on live netns labs: links go down and come back at the planned times,
everything is undone at the end (also when the run raised), and a seeded random timeline
injects the same faults every time it runs."""

from __future__ import annotations

import time

import pytest

from orchestrator.emulation import Lab, kernel
from orchestrator.faults.timeline import TimelineRunner, plan
from orchestrator.spec.loader import validate
from orchestrator.spec.timeline import Timeline

NETNS = {"servers.runtime": "netns"}
TOLERANCE = 0.5  # seconds between a planned change and the kernel showing it


def timeline(*events: dict, seed: int = 0) -> Timeline:
    return validate(Timeline, {"seed": seed, "events": list(events)}, "exp.yaml")


def links_up(nl: kernel.Netlink, lab: Lab, interfaces: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    up = {}
    for node, name in interfaces:
        up[(node, name)] = kernel.links_in(nl, lab.namespace(node))[name]["up"]
    return up


def watch(lab: Lab, interfaces: list[tuple[str, str]], seconds: float) -> dict[tuple, list[tuple[float, bool]]]:
    """Each interface's state changes over `seconds`, as (time, up) pairs, sampled every 20 ms."""
    changes: dict = {iface: [] for iface in interfaces}
    last: dict = {}
    end = time.time() + seconds
    with kernel.Netlink() as nl:
        while time.time() < end:
            now = time.time()
            for iface, up in links_up(nl, lab, interfaces).items():
                if last.get(iface) != up:
                    changes[iface].append((now, up))
                    last[iface] = up
            time.sleep(0.02)
    return changes


def test_a_timeline_changes_links_at_the_planned_times_and_undoes_everything(make_lab):
    lab = make_lab("bcube,2,1", name="flrun", **NETNS)
    planned = plan(timeline({"action": "link-down", "target": "h00-l0s0", "at": "0.5s", "for": "1s"},
                            {"action": "link-down", "target": "h11-l1s1", "at": 1.0, "for": 1.0},
                            {"action": "switch-down", "target": "l1s0", "at": 1.5}), lab.topology)
    watched = [("h00", "h00-eth0"), ("h11", "h11-eth1"), ("l1s0", "l1s0-eth0")]
    with TimelineRunner(lab, planned) as run:
        changes = watch(lab, watched, 2.6)
    start = run.started
    expected = {("h00", "h00-eth0"): [(0.0, True), (0.5, False), (1.5, True)],
                ("h11", "h11-eth1"): [(0.0, True), (1.0, False), (2.0, True)],
                ("l1s0", "l1s0-eth0"): [(0.0, True), (1.5, False)]}  # lasts until the run ends
    for iface, seen in changes.items():
        assert [up for _, up in seen] == [up for _, up in expected[iface]], (iface, seen)
        for (at, _), (planned_at, _) in list(zip(seen, expected[iface]))[1:]:
            assert at - start == pytest.approx(planned_at, abs=TOLERANCE), (iface, at - start, planned_at)
    with kernel.Netlink() as nl:
        assert all(links_up(nl, lab, watched).values())  # finish() brought the switch back
    assert lab.state.active_faults() == []
    records = run.events()
    assert [(r.action, r.target) for r in records] == [
        ("link-down", "h00-l0s0"), ("link-down", "h11-l1s1"), ("switch-down", "l1s0")]
    for record, offset in zip(records, (0.5, 1.0, 1.5)):
        assert record.planned == pytest.approx(start + offset, abs=0.01)
        assert record.planned <= record.applied <= record.planned + TOLERANCE <= record.undone
    by_id = {f["id"]: f for f in lab.state.fault_events()}  # what the results and Prometheus read
    assert [by_id[r.fault_id]["planned"] for r in records] == [r.planned for r in records]
    assert all(by_id[r.fault_id]["undone"] is not None for r in records)


def test_a_seeded_random_timeline_run_twice_gives_the_same_faults(make_lab):
    lab = make_lab("bcube,2,1", name="flseed", **NETNS)
    faults = timeline({"action": "link-down", "target": {"any": "link", "count": 2}, "at": 0.1, "for": 0.2,
                       "repeat": {"every": 0.4, "times": 2}},
                      {"action": "switch-down", "target": {"any": "switch"}, "at": 0.3, "for": 0.3},
                      {"action": "server-crash", "target": {"any": "worker"}, "at_iteration": 2}, seed=5)

    def run_once() -> None:
        with TimelineRunner(lab, plan(faults, lab.topology, ps={"h00"})) as run:
            for iteration in range(4):
                run.on_iteration(iteration)
                time.sleep(0.25)

    run_once()
    first = [(f["action"], f["target"]) for f in lab.state.fault_events()]
    run_once()
    both = [(f["action"], f["target"]) for f in lab.state.fault_events()]
    assert len(first) == 6 and both == first + first
    assert first == [(f.action, f.target) for f in plan(faults, lab.topology, ps={"h00"})]
    assert first[-1][0] == "server-crash" and first[-1][1] != "h00"
    assert lab.state.active_faults() == []
    events = faults.model_dump(by_alias=True, exclude_none=True)["events"]
    other = [(f.action, f.target) for f in plan(timeline(*events, seed=6), lab.topology, ps={"h00"})]
    assert other != first  # the seed, not luck, fixed the draw


def test_finish_heals_the_lab_when_the_run_raised(make_lab):
    lab = make_lab("bcube,2,1", name="flheal", **NETNS)
    planned = plan(timeline({"action": "link-down", "target": "h00-l0s0", "at": 0},
                            {"action": "server-pause", "target": "h01", "at_iteration": 0}), lab.topology)
    with pytest.raises(RuntimeError, match="the run broke"):
        with TimelineRunner(lab, planned) as run:
            run.on_iteration(0)
            deadline = time.time() + 10
            while len(lab.state.active_faults()) < 2 and time.time() < deadline:
                time.sleep(0.05)
            with kernel.Netlink() as nl:
                assert links_up(nl, lab, [("h00", "h00-eth0")]) == {("h00", "h00-eth0"): False}
            raise RuntimeError("the run broke")
    assert lab.state.active_faults() == []
    assert all(r.undone is not None for r in run.events())
    with kernel.Netlink() as nl:
        assert links_up(nl, lab, [("h00", "h00-eth0")]) == {("h00", "h00-eth0"): True}
