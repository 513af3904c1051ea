"""The fault timeline without a lab: the file's one-line errors, planning against a
topology (random choices seeded, repeats expanded, targets checked), and the runner's
order of applying and undoing, driven through a recording injector."""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import FaultError, SpecError
from orchestrator.faults.injector import Applied
from orchestrator.faults.timeline import CHOICES, PlannedFault, TimelineRunner, plan
from orchestrator.spec import lab_from_argument
from orchestrator.spec.loader import load, validate
from orchestrator.spec.timeline import RANDOM_KINDS, Timeline
from orchestrator.topology import from_lab


@pytest.fixture(scope="module")
def fattree():
    return from_lab(lab_from_argument("fattree,4"))


@pytest.fixture(scope="module")
def bcube():
    return from_lab(lab_from_argument("bcube,2,1"))


def timeline(*events: dict, seed: int = 0) -> Timeline:
    return validate(Timeline, {"seed": seed, "events": list(events)}, "exp.yaml")


# -- the file ----------------------------------------------------------------------------------
def test_a_timeline_file_reads_durations_in_seconds_and_aliases_for(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text("seed: 7\nevents:\n"
                    "  - {action: link-down, target: p0a0-c0, at: 5s, for: 1500ms}\n"
                    "  - {action: server-crash, target: {any: worker}, at_iteration: 3}\n"
                    "  - {action: link-flap, target: {any: core-link, count: 2}, at: 2, "
                    "repeat: {every: 10s, times: 3}, options: {period: 200ms}}\n")
    read = load(Timeline, path)
    first, second, third = read.events
    assert (first.at, first.duration, first.at_iteration) == (5.0, 1.5, None)
    assert second.at_iteration == 3 and second.target.any == "worker" and second.target.count == 1
    assert third.at == 2.0 and third.repeat.every == 10.0 and third.options == {"period": "200ms"}


@pytest.mark.parametrize("event,message", [
    ({"action": "link-dwn", "target": "a-b", "at": 1}, "exp.yaml: events.0.action: 'link-dwn' is no fault action: "),
    ({"action": "link-down", "target": "a-b"}, "exp.yaml: events.0: give exactly one of at"),
    ({"action": "link-down", "target": "a-b", "at": 1, "at_iteration": 2}, "exactly one of at"),
    ({"action": "link-down", "target": {"any": "cor-link"}, "at": 1},
     "exp.yaml: events.0.target.any: 'cor-link' is not a random choice: use one of core-link"),
    ({"action": "link-down", "target": {"any": "link", "cnt": 2}, "at": 1},
     "events.0.target.cnt: unknown key; did you mean 'count'?"),
    ({"action": "link-down", "target": {"any": "link", "count": 0}, "at": 1}, "events.0.target.count: must lie"),
    ({"action": "link-down", "target": "a-b", "at": "5"}, "events.0.at: '5': give a unit"),
    ({"action": "link-down", "target": "a-b", "at": -1}, "events.0.at: -1 must not be negative"),
    ({"action": "link-down", "target": "a-b", "at": "soon"}, "events.0.at: 'soon' is not a number with a unit"),
    ({"action": "link-down", "target": "a-b", "at": 1, "for": "0s"}, "events.0.for: must be longer than zero"),
    ({"action": "link-down", "target": "a-b", "at": 1, "fro": 3},
     "events.0.fro: unknown key; did you mean 'for'? (known: action, target, at, at_iteration, for,"),
    ({"action": "link-down", "target": "a-b", "at": 1, "for": "5s", "repeat": {"every": "2s", "times": 2}},
     "repeat.every (2 s) must be longer than for (5 s)"),
    ({"action": "link-down", "target": "a-b", "at_iteration": 1, "repeat": {"every": "2s", "times": 2}},
     "an at_iteration event repeats every N iterations"),
    ({"action": "link-down", "target": "a-b", "at": 1, "repeat": {"every": "2s", "times": 0}},
     "events.0.repeat.times: must lie between 1 and"),
    ({"action": "link-down", "target": "", "at": 1}, "events.0.target: '': give a link A-B"),
    ({"action": "link-down", "target": 5, "at": 1}, "events.0.target: 5: give a link A-B"),
    ({"action": "link-down", "target": "a-b", "at": float("nan")}, "events.0.at: nan is not a number (NaN)"),
    ({"action": "link-down", "target": "a-b", "at": 1, "for": float("inf")}, "events.0.for: inf is infinite: "
                                                                             "a quantity must be finite"),
    ({"action": "link-down", "target": "a-b", "at": 1, "for": 1e12},
     "events.0.for: 1000000000000.0 is longer than a day (86,400 s), the most a fault timeline plans"),
    ({"action": "link-down", "target": "a-b", "at": "1e6s"}, "events.0.at: '1e6s' is longer than a day"),
    ({"action": "link-down", "target": "a-b", "at": 1, "for": 1, "repeat": {"every": "2e5s", "times": 2}},
     "repeat.every: '2e5s' is longer than a day"),
    ({"action": "link-down", "target": "a-b", "at": "1e3"}, "events.0.at: '1e3': give a unit"),
])
def test_file_errors_are_one_line_naming_the_event_and_field(event, message):
    with pytest.raises(SpecError) as caught:
        timeline(event)
    text = str(caught.value)
    assert message in text and "\n" not in text, text


def test_a_duration_in_exponent_form_and_of_exactly_a_day_is_read():
    (event,) = timeline({"action": "link-down", "target": "a-b", "at": "1.5e3ms", "for": 86_400}).events
    assert (event.at, event.duration) == (1.5, 86_400.0)


def test_a_timeline_that_would_plan_too_many_faults_is_refused_before_expanding():
    # Regression: 500 events × repeat 10,000 took 2 GB and hung in plan(); now the file is
    # refused as it is read, in one line with the figure and the limit.
    event = {"action": "link-down", "target": "a-b", "at": 1, "for": 1, "repeat": {"every": 2, "times": 10_000}}
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        timeline(*[event] * 500)
    text = str(caught.value)
    assert time.monotonic() - started < 5
    assert text.startswith("exp.yaml: events: 500 events × repeat.times × target.count = 5,000,000 planned faults, "
                           "more than 10,000 (the most, events.0: repeat 10,000 × 1 target = 10,000)"), text
    assert "\n" not in text


def test_random_draws_count_toward_the_bound_and_a_partition_counts_once():
    links = {"action": "link-down", "target": {"any": "link", "count": 3}, "at": 1, "for": 1,
             "repeat": {"every": 2, "times": 4000}}
    with pytest.raises(SpecError, match="12,000 planned faults, more than 10,000 .*repeat 4,000 × 3 targets"):
        timeline(links)
    partition = {"action": "partition", "target": {"any": "server", "count": 3}, "at": 1, "for": 1,
                 "repeat": {"every": 2, "times": 10_000}}
    assert len(timeline(partition).events) == 1  # one fault per occurrence, whatever the count
    assert len(timeline({**links, "repeat": {"every": 2, "times": 3333}}).events) == 1  # 9,999


def test_exactly_the_most_planned_faults_are_planned(bcube):
    event = {"action": "link-down", "target": "h00-l0s0", "at": 0, "for": 1, "repeat": {"every": 2, "times": 5000}}
    faults = plan(timeline(event, {**event, "target": "h01-l0s0"}), bcube)
    assert len(faults) == 10_000


def test_the_choice_kinds_of_the_file_and_of_the_planner_are_one_list():
    assert tuple(CHOICES) == RANDOM_KINDS


# -- planning ----------------------------------------------------------------------------------
def test_a_seeded_random_choice_gives_the_same_plan_twice_and_another_seed_another(fattree):
    def drawn(seed: int) -> list[str]:
        faults = plan(timeline({"action": "link-down", "target": {"any": "link", "count": 3}, "at": 1, "for": 1,
                                "repeat": {"every": 2, "times": 5}}, seed=seed), fattree)
        return [f.target for f in faults]

    assert drawn(11) == drawn(11)
    assert len(drawn(11)) == 15
    assert drawn(11) != drawn(12)  # 48 links, 15 draws: equal by chance ~never
    assert len({tuple(drawn(s)) for s in range(5)}) == 5


def test_appending_an_event_leaves_the_earlier_events_draws_alone(fattree):
    links = {"action": "link-down", "target": {"any": "link", "count": 4}, "at": 1}
    crash = {"action": "server-crash", "target": {"any": "worker", "count": 2}, "at": 1}
    alone = plan(timeline(links, seed=3), fattree)
    both = plan(timeline(links, crash, seed=3), fattree)
    assert [f.target for f in both if f.event == 0] == [f.target for f in alone]
    assert {f.target for f in both if f.event == 1} <= {s.name for s in fattree.servers}


def test_any_core_link_on_fattree_only_picks_core_links(fattree):
    cores = {s.name for s in fattree.switches if s.attrs["layer"] == "core"}
    faults = plan(timeline({"action": "link-down", "target": {"any": "core-link", "count": 16}, "at": 0}), fattree)
    assert len({f.target for f in faults}) == 16  # every core link, each once
    for fault in faults:
        low, high = fault.target.split("-")
        assert high in cores and fattree.nodes[low].attrs["layer"] == "aggregation", fault.target
    edges = plan(timeline({"action": "link-down", "target": {"any": "edge-link", "count": 16}, "at": 0}), fattree)
    assert all(fattree.nodes[f.target.split("-")[0]].is_server for f in edges)


def test_worker_leaves_the_parameter_servers_out_and_partition_draws_one_set(bcube):
    faults = plan(timeline({"action": "server-crash", "target": {"any": "worker", "count": 3}, "at": 0}),
                  bcube, ps={"h00"})
    assert sorted(f.target for f in faults) == ["h01", "h10", "h11"]
    (cut,) = plan(timeline({"action": "partition", "target": {"any": "server", "count": 2}, "at": 0}), bcube)
    assert len(cut.target.split(",")) == 2


def test_repeat_expands_to_its_occurrences_in_time_and_in_iterations(bcube):
    faults = plan(timeline(
        {"action": "link-down", "target": "h00-l0s0", "at": "1.5s", "for": "1s", "repeat": {"every": "4s", "times": 3}},
        {"action": "server-crash", "target": "h10", "at_iteration": 20},
        {"action": "server-pause", "target": "h01", "at_iteration": 10, "for": "2s",
         "repeat": {"every": 5, "times": 2}},
        {"action": "link-down", "target": "l1s0-h00", "at": 0.5, "for": 0.2}), bcube)
    assert [(f.at, f.at_iteration, f.target) for f in faults] == [
        (0.5, None, "l1s0-h00"), (1.5, None, "h00-l0s0"), (5.5, None, "h00-l0s0"), (9.5, None, "h00-l0s0"),
        (None, 10, "h01"), (None, 15, "h01"), (None, 20, "h10")]  # time events by time, then iterations
    assert all(f.duration == 1.0 for f in faults if f.target == "h00-l0s0")
    assert faults[-1].duration is None  # a crash without `for` lasts until the run ends
    assert faults[0].describe() == "t+0.5s: link-down l1s0-h00 for 0.2s (event 3)"
    assert faults[-2].describe() == "iteration 15: server-pause h01 for 2s (event 2)"
    assert faults[-1].describe() == "iteration 20: server-crash h10 until the end (event 1)"


@pytest.mark.parametrize("event,message", [
    ({"action": "link-down", "target": "h00-h11", "at": 1}, "timeline events.0.target: link-down: "
                                                             "lab bcube topology has no link between h00 and h11"),
    ({"action": "link-down", "target": "h00-nope", "at": 1}, "events.0.target: link-down: lab bcube topology has no "
                                                              "node 'nope'"),
    ({"action": "switch-down", "target": "h00", "at": 1}, "events.0.target: switch-down acts on a switch"),
    ({"action": "link-down", "target": {"any": "core-link"}, "at": 1},
     "events.0.target.count: this bcube topology has 0 core-link candidates, fewer than 1: core/aggregation/edge "
     "links exist in Fat-Trees only; use link"),
    ({"action": "server-crash", "target": {"any": "worker", "count": 5}, "at": 1}, "has 4 worker candidates"),
    ({"action": "switch-down", "target": {"any": "server"}, "at": 1},
     "events.0.target.any: switch-down acts on a switch, not a server: use one of switch"),
    ({"action": "partition", "target": {"any": "server", "count": 4}, "at": 1}, "is every server"),
    ({"action": "link-degrade", "target": "h00-l0s0", "at": 1}, "events.0.options: link-degrade needs rate"),
    ({"action": "link-degrade", "target": "h00-l0s0", "at": 1, "options": {"rate": "fast"}},
     "events.0.options.rate: "),
    ({"action": "link-down", "target": "h00-l0s0", "at": 1, "options": {"rate": "1Mbit"}},
     "events.0.options.rate: link-down does not take it (it takes no options)"),
    ({"action": "link-up", "target": "h00-l0s0", "at": 1, "for": 2}, "events.0.for: link-up is done at once"),
    ({"action": "link-down", "target": "h00-l0s0", "at": 1, "repeat": {"every": 2, "times": 2}},
     "events.0.repeat: a repeated link-down needs `for`"),
])
def test_plan_errors_are_one_line_naming_the_event_and_field(bcube, event, message):
    with pytest.raises(FaultError) as caught:
        plan(timeline({"action": "link-down", "target": "h00-l0s0", "at": 0}, event), bcube)
    text = str(caught.value).replace("events.1", "events.0")
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize("event,iterations,message", [
    ({"action": "server-crash", "target": "h10", "at_iteration": 5}, 5,
     "timeline events.0.at_iteration: 5 is never reached: the run has 5 iterations, numbered 0 to 4: give at most 4"),
    ({"action": "server-crash", "target": "h10", "at_iteration": 10**9}, 1,
     "timeline events.0.at_iteration: 1,000,000,000 is never reached: the run has 1 iteration, numbered 0: "
     "give at most 0"),
    ({"action": "server-pause", "target": "h10", "at_iteration": 1, "for": 1, "repeat": {"every": 2, "times": 3}}, 5,
     "timeline events.0.repeat.times: the last of 3 occurrences is at iteration 5, never reached: the run has 5 "
     "iterations, numbered 0 to 4: give times at most 2"),
])
def test_an_iteration_the_run_never_reaches_is_refused_naming_the_run_s_count(bcube, event, iterations, message):
    with pytest.raises(FaultError) as caught:
        plan(timeline(event), bcube, iterations=iterations)
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text, text
    assert plan(timeline(event), bcube)  # without the run's count, nothing to check against


def test_the_last_iteration_of_the_run_is_reachable(bcube):
    # iterations are numbered from 0: the runner calls on_iteration(0) as the run starts
    (fault,) = plan(timeline({"action": "server-crash", "target": "h10", "at_iteration": 4}), bcube, iterations=5)
    assert fault.at_iteration == 4
    faults = plan(timeline({"action": "server-pause", "target": "h10", "at_iteration": 0, "for": 1,
                            "repeat": {"every": 2, "times": 3}}, {"action": "link-down", "target": "h00-l0s0",
                                                                  "at": 1e3}), bcube, iterations=5)
    assert [f.at_iteration for f in faults] == [None, 0, 2, 4]  # a time event has no iteration to check


# -- running, with a recording injector --------------------------------------------------------
class Recorder:
    """An injector that records calls: what the runner asks for and when."""

    class _State:
        def __init__(self, recorder):
            self.recorder = recorder

        def active_faults(self):
            return [{"id": i} for i in self.recorder.active]

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.active: list[str] = []
        self.fail_on = fail_on
        self.state = self._State(self)

    def target(self, act, text):
        return text

    def inject(self, name, target, options=None, duration=None, planned=None, wait=True, then=None):
        if target == self.fail_on:
            raise RuntimeError("the kernel said no")
        fault_id = f"f{sum(kind == 'inject' for kind, _, _ in self.calls)}"
        self.calls.append(("inject", f"{name} {target}", time.time()))
        self.active.append(fault_id)
        fault = type("Fault", (), {"id": fault_id})()
        return Applied(fault, 0.0, time.time())

    def undo(self, fault_id):
        self.calls.append(("undo", fault_id, time.time()))
        self.active.remove(fault_id)


def runner(faults: list[PlannedFault], injector: Recorder) -> TimelineRunner:
    lab = type("Lab", (), {"state": injector.state})()
    return TimelineRunner(lab, faults, injector=injector)


def test_the_runner_applies_at_the_planned_times_undoes_at_the_end_and_heals_the_rest():
    injector = Recorder()
    faults = [PlannedFault(0, "link-down", "a-b", at=0.1, duration=0.2),
              PlannedFault(1, "switch-down", "s1", at=0.2),
              PlannedFault(2, "server-pause", "h1", at_iteration=3),
              PlannedFault(3, "link-down", "c-d", at=30.0)]  # the run ends first
    with runner(faults, injector) as run:
        start = run.started
        run.on_iteration(2)
        time.sleep(0.45)
        run.on_iteration(5)  # iteration 3 was skipped: its event fires now
        time.sleep(0.1)
    assert [(kind, what) for kind, what, _ in injector.calls] == [
        ("inject", "link-down a-b"), ("inject", "switch-down s1"), ("undo", "f0"),
        ("inject", "server-pause h1"), ("undo", "f2"), ("undo", "f1")]  # the rest newest first
    times = [at - start for _, _, at in injector.calls]
    assert times[0] == pytest.approx(0.1, abs=0.05) and times[1] == pytest.approx(0.2, abs=0.05)
    assert times[2] == pytest.approx(0.3, abs=0.05)
    records = run.events()
    assert records[0].planned == pytest.approx(start + 0.1) and records[0].applied >= records[0].planned
    assert records[0].undone == pytest.approx(start + 0.3, abs=0.05)
    assert records[3].planned == pytest.approx(start + 30) and records[3].applied is None
    assert injector.active == []


def test_a_failure_in_the_thread_is_raised_by_finish_naming_the_event_after_healing():
    injector = Recorder(fail_on="bad-link")
    faults = [PlannedFault(0, "link-down", "a-b", at=0.0), PlannedFault(1, "link-down", "bad-link", at=0.05)]
    run = runner(faults, injector).start()
    time.sleep(0.2)
    with pytest.raises(FaultError, match=r"^timeline events.1 \(apply link-down bad-link\): the kernel said no$"):
        run.finish()
    assert injector.active == []  # the first fault was undone all the same


def test_the_run_s_own_error_wins_and_the_faults_are_undone_still():
    injector = Recorder(fail_on="bad-link")
    faults = [PlannedFault(0, "link-down", "a-b", at=0.0), PlannedFault(1, "link-down", "bad-link", at=0.0)]
    with pytest.raises(KeyError) as caught:
        with runner(faults, injector):
            time.sleep(0.15)
            raise KeyError("the run broke")
    assert injector.active == []
    assert any("the fault timeline failed: timeline events.1" in note for note in caught.value.__notes__)
