"""A fault timeline: planned (pure) from an experiment's `faults:` and the topology, then run
against a live lab.

    planned = plan(timeline, topology, ps={"h00"})     # FaultError for an event that cannot be
    for fault in planned: print(fault.describe())      # (a --dry-run prints this)
    with TimelineRunner(lab, planned) as faults:       # time events fire from here on
        for i in range(iterations):
            faults.on_iteration(i)                     # iteration events
            ...
    results["faults"] = faults.events()                # planned/applied/undone per fault

Random choices (`{any: core-link}`) draw from candidates listed in a fixed order from the
topology, with one `random.Random` per event seeded from the timeline's seed and the
event's index: the same file gives the same faults, and appending an event changes no
earlier event's draw. Each occurrence of a repeated event draws again.

The runner changes the lab only through `Injector` (journalled before acting, so `testbed
clean` undoes what a crash left; every phase recorded for the results and Prometheus). It
undoes a fault at its end and whatever is still active at `finish()`, even after the run
raised; a failure inside its thread is kept and raised by `finish()`, naming the event.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection

from orchestrator.errors import FaultError
from orchestrator.faults import targets
from orchestrator.faults.actions import ACTIONS, action, parse_params
from orchestrator.faults.injector import Injector
from orchestrator.spec.timeline import RANDOM_KINDS, Choice, Event, Timeline
from orchestrator.topology import Link, Topology


@dataclass(frozen=True)
class PlannedFault:
    event: int  # index of the timeline event it comes from
    action: str
    target: str  # concrete and normalised, as the injector records it
    at: float | None = None  # seconds from the run's start, or
    at_iteration: int | None = None  # the iteration that triggers it
    duration: float | None = None  # None: a lasting fault lasts until the run ends
    options: dict[str, str] = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        when = f"t+{self.at:g}s" if self.at is not None else f"iteration {self.at_iteration}"
        lasting = ACTIONS[self.action].takes_duration
        length = f" for {self.duration:g}s" if self.duration is not None else (" until the end" if lasting else "")
        opts = "".join(f" --{k} {v}" for k, v in self.options.items())
        return f"{when}: {self.action} {self.target}{opts}{length} (event {self.event})"


# -- random choices: kind → which target kinds it fits, and its candidates -----------------
FATTREE_LAYERS = ("host", "edge", "aggregation", "core")  # bottom to top


def _layer(topology: Topology, name: str) -> str:
    node = topology.nodes[name]
    return "host" if node.is_server else node.attrs.get("layer", "")


def _link_text(link: Link) -> str:
    return "-".join(link.nodes())


def _links_up_to(layer: str) -> Callable[[Topology, Collection[str]], list[str]]:
    """Links whose higher end sits in `layer`: core links join aggregation and core, …"""
    def candidates(topology: Topology, ps: Collection[str]) -> list[str]:
        return [_link_text(link) for link in topology.links
                if max((_layer(topology, n) for n in link.nodes()),
                       key=lambda x: FATTREE_LAYERS.index(x) if x in FATTREE_LAYERS else -1) == layer]
    return candidates


@dataclass(frozen=True)
class Pick:
    fits: tuple[str, ...]  # the targets.KINDS it can stand for
    candidates: Callable[[Topology, Collection[str]], list[str]]  # (topology, ps nodes) → texts


CHOICES: dict[str, Pick] = {
    "core-link": Pick(("link",), _links_up_to("core")),
    "aggregation-link": Pick(("link",), _links_up_to("aggregation")),
    "edge-link": Pick(("link",), _links_up_to("edge")),
    "link": Pick(("link",), lambda t, ps: [_link_text(link) for link in t.links]),
    "switch": Pick(("switch",), lambda t, ps: [s.name for s in t.switches]),
    "server": Pick(("server", "servers"), lambda t, ps: [s.name for s in t.servers]),
    "worker": Pick(("server", "servers"), lambda t, ps: [s.name for s in t.servers if s.name not in ps]),
}
assert set(CHOICES) == set(RANDOM_KINDS), "spec.timeline.RANDOM_KINDS and CHOICES must list the same kinds"


# -- planning ------------------------------------------------------------------------------
class _Paper:
    """What `targets` reads of a lab, from the topology alone: a target is checked the same
    way whether planned or injected, with nothing live."""

    def __init__(self, topology: Topology, name: str) -> None:
        self.topology, self.name = topology, name

    def links_between(self, a: str, b: str) -> list[Link]:
        return self.topology.links_between(a, b)


def plan(timeline: Timeline, topology: Topology, ps: Collection[str] = (), name: str = "",
         iterations: int | None = None) -> list[PlannedFault]:
    """Every fault the timeline will inject, sorted (time events by time, then iteration
    events by iteration), checked against `topology`; FaultError naming the event otherwise.
    `ps` are the parameter-server nodes, which `{any: worker}` leaves out. `iterations`: the
    run's count, when known; iterations are numbered from 0 (the runner's `on_iteration(0)`
    fires as the run starts), so an event at iteration `iterations` or later, a repeat's
    last occurrence included, is refused: the run never reaches it. The timeline's size
    was bounded when it was read (spec.timeline.MAX_PLANNED), before anything expands."""
    paper = _Paper(topology, name or f"{topology.kind} topology")
    planned: list[PlannedFault] = []
    pools: dict[str, list[str]] = {}  # a random kind's candidates, listed once per plan
    for index, event in enumerate(timeline.events):
        where = f"timeline events.{index}"
        act = ACTIONS[event.action]
        options = _options(event, where)
        if event.duration is not None and not act.takes_duration:
            raise FaultError(f"{where}.for: {act.name} is done at once: leave `for` out")
        if event.repeat is not None and event.duration is None and act.lasting:
            raise FaultError(f"{where}.repeat: a repeated {act.name} needs `for` (else it lasts until the run ends)")
        if iterations is not None and event.at_iteration is not None:
            _reachable(event, iterations, where)
        draw = random.Random(f"{timeline.seed}/{index}")  # str seeds hash the same in every process
        literal = None if isinstance(event.target, Choice) else _targets(event, act.target, paper, ps, draw, where, pools)
        times = event.repeat.times if event.repeat else 1
        for n in range(times):
            shift = n * event.repeat.every if event.repeat else 0
            for text in literal or _targets(event, act.target, paper, ps, draw, where, pools):
                planned.append(PlannedFault(
                    index, act.name, text,
                    at=None if event.at is None else event.at + shift,
                    at_iteration=None if event.at_iteration is None else event.at_iteration + int(shift),
                    duration=event.duration, options=options))
    return sorted(planned, key=_order)


def _reachable(event: Event, iterations: int, where: str) -> None:
    """Refuse an iteration event (or a repeat's occurrence) the run never reaches: a run of
    N iterations has iterations 0 to N-1."""
    span = ("1 iteration, numbered 0" if iterations == 1
            else f"{iterations:,} iterations, numbered 0 to {iterations - 1:,}")
    if event.at_iteration >= iterations:
        raise FaultError(f"{where}.at_iteration: {event.at_iteration:,} is never reached: the run has {span}: "
                         f"give at most {iterations - 1:,} (or raise iterations)")
    if event.repeat is not None:
        last = event.at_iteration + (event.repeat.times - 1) * int(event.repeat.every)
        if last >= iterations:
            fit = (iterations - 1 - event.at_iteration) // int(event.repeat.every) + 1
            raise FaultError(f"{where}.repeat.times: the last of {event.repeat.times:,} occurrences is at iteration "
                             f"{last:,}, never reached: the run has {span}: give times at most {fit:,} "
                             "(or raise iterations)")


def _order(fault: PlannedFault) -> tuple:
    return (0, fault.at, 0) if fault.at is not None else (1, 0.0, fault.at_iteration)  # stable within


def _options(event: Event, where: str) -> dict[str, str]:
    """The event's options as the command line's text, each checked by the action's parser
    (the kernel check for netem waits for the runner: planning touches nothing)."""
    act = ACTIONS[event.action]
    options = {}
    for key, value in event.options.items():
        if key not in act.params:
            takes = ", ".join(act.params) or "no options"
            raise FaultError(f"{where}.options.{key}: {act.name} does not take it (it takes {takes})")
        text = str(value)
        try:
            act.params[key](text)
        except ValueError as exc:
            raise FaultError(f"{where}.options.{key}: {exc}") from None
        options[key] = text
    if act.name == "link-degrade" and not options:
        raise FaultError(f"{where}.options: link-degrade needs rate (and/or delay, jitter, loss), "
                         "e.g. {rate: 10Mbit}")
    return options


def _targets(event: Event, kind: str, paper: _Paper, ps: Collection[str], draw: random.Random,
             where: str, pools: dict[str, list[str]]) -> list[str]:
    """The concrete target texts of one occurrence: the literal one, or a fresh draw."""
    if isinstance(event.target, Choice):
        texts = _draw(event.target, kind, event.action, paper.topology, ps, draw, where, pools)
    else:
        texts = [event.target]
    checked = []
    for text in texts:
        try:
            checked.append(targets.KINDS[kind](paper, text, event.action).text)
        except FaultError as exc:
            raise FaultError(f"{where}.target: {exc}") from None
    return checked


def _draw(choice: Choice, kind: str, act: str, topology: Topology, ps: Collection[str], draw: random.Random,
          where: str, pools: dict[str, list[str]]) -> list[str]:
    pick = CHOICES[choice.any]
    if kind not in pick.fits:
        fitting = ", ".join(k for k, p in CHOICES.items() if kind in p.fits)
        raise FaultError(f"{where}.target.any: {act} acts on a {kind}, not a {choice.any}: use one of {fitting}")
    if choice.any not in pools:  # sorted: the draw must not depend on build order
        pools[choice.any] = sorted(set(pick.candidates(topology, ps)))
    candidates = pools[choice.any]
    if len(candidates) < choice.count:
        raise FaultError(f"{where}.target.count: this {topology.kind} topology has {len(candidates)} "
                         f"{choice.any} candidate{'s' * (len(candidates) != 1)}, fewer than {choice.count}"
                         + (": core/aggregation/edge links exist in Fat-Trees only; use link" if not candidates
                            and choice.any.endswith("-link") else ""))
    chosen = draw.sample(candidates, choice.count)
    return [",".join(chosen)] if kind == "servers" else chosen  # one partition of `count` servers


# -- running -------------------------------------------------------------------------------
@dataclass
class Record:
    """One planned fault's life, Unix times; for the results."""
    event: int
    action: str
    target: str
    planned: float | None = None  # when it was due (None: the run ended first)
    applied: float | None = None
    undone: float | None = None
    fault_id: str | None = None
    error: str | None = None


class TimelineRunner:
    """Applies planned faults on a live lab at their time (a thread) or iteration
    (`on_iteration`), undoes each at its end and the rest at `finish()`."""

    def __init__(self, lab, planned: list[PlannedFault], injector: Injector | None = None) -> None:
        self.lab = lab
        self.injector = injector or Injector(lab)
        self.planned = list(planned)
        for fault in self.planned:  # refuse before anything runs (a kernel without netem, another lab)
            act = action(fault.action)
            try:
                parse_params(act, fault.options)
                self.injector.target(act, fault.target)
            except FaultError as exc:
                raise FaultError(f"timeline events.{fault.event}: {exc}") from None
        self._records = [Record(f.event, f.action, f.target) for f in self.planned]
        self._queue: list[tuple[float, int, str, int]] = []  # (due, seq, "apply"|"undo", record index)
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._stopping = False
        self._fired_iterations: set[int] = set()  # record indexes already triggered by on_iteration
        self._errors: list[FaultError] = []
        self._thread: threading.Thread | None = None
        self.started: float | None = None

    # -- the run's side ------------------------------------------------------------------
    def start(self) -> "TimelineRunner":
        self.started = time.time()
        with self._wake:
            for index, fault in enumerate(self.planned):
                if fault.at is not None:
                    self._push(self.started + fault.at, "apply", index)
        self._thread = threading.Thread(target=self._loop, name="fault-timeline", daemon=True)
        self._thread.start()
        return self

    def on_iteration(self, iteration: int) -> None:
        """Trigger the iteration events due by `iteration` (also those a skipped iteration
        would have triggered); they are applied by the runner's thread at once."""
        now = time.time()
        with self._wake:
            for index, fault in enumerate(self.planned):
                if (fault.at_iteration is not None and fault.at_iteration <= iteration
                        and index not in self._fired_iterations):
                    self._fired_iterations.add(index)
                    self._push(now, "apply", index)
            self._wake.notify()

    def finish(self) -> list[Record]:
        """Stop, undo every fault this runner applied that is still active, newest first;
        then raise the first failure of the run as FaultError (after the lab is healed)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        for index in sorted(self._active(), key=lambda i: self._records[i].applied or 0.0, reverse=True):
            self._step("undo", index)
        if self._errors:
            first, self._errors = self._errors[0], []  # raised once: a second finish() is quiet
            raise first
        return self.events()

    def events(self) -> list[Record]:
        with self._wake:
            return [Record(**vars(r)) for r in self._records]

    def __enter__(self) -> "TimelineRunner":
        return self.start()

    def __exit__(self, kind, error, traceback) -> bool:
        try:
            self.finish()
        except FaultError as failure:
            if error is None:
                raise
            error.add_note(f"and the fault timeline failed: {failure}")  # the run's own error comes first
        return False

    # -- the thread's side -----------------------------------------------------------------
    def _push(self, due: float, step: str, index: int) -> None:
        heapq.heappush(self._queue, (due, next(self._seq), step, index))
        if step == "apply":
            self._records[index].planned = due

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (not self._queue or self._queue[0][0] > time.time()):
                    self._wake.wait(None if not self._queue else self._queue[0][0] - time.time())
                if self._stopping:
                    return
                _, _, step, index = heapq.heappop(self._queue)
            self._step(step, index)

    def _step(self, step: str, index: int) -> None:
        """Apply or undo one fault; a failure is kept (and the timeline goes on)."""
        fault, record = self.planned[index], self._records[index]
        try:
            if step == "apply":
                def over() -> None:  # the action's later steps (a flap's) are done
                    with self._wake:
                        record.undone = time.time()

                done = self.injector.inject(fault.action, fault.target, fault.options, fault.duration,
                                            planned=record.planned, wait=False, then=over)
                with self._wake:
                    record.fault_id, record.applied = done.fault.id, done.at
                    if not ACTIONS[fault.action].lasting and done.steps is None:
                        record.undone = record.applied
                    elif ACTIONS[fault.action].lasting and fault.duration is not None:
                        self._push(record.applied + fault.duration, "undo", index)
            elif record.undone is None:
                if record.fault_id in {f["id"] for f in self.lab.state.active_faults()}:
                    self.injector.undo(record.fault_id)  # else healed by another (link-up, heal)
                with self._wake:
                    record.undone = time.time()
        except Exception as exc:  # noqa: BLE001 (kept and raised by finish, naming the event)
            message = f"timeline events.{fault.event} ({step} {fault.action} {fault.target}): {exc}"
            with self._wake:
                record.error = str(exc)
                self._errors.append(FaultError(message))

    def _active(self) -> list[int]:
        return [i for i, r in enumerate(self._records) if r.fault_id is not None and r.undone is None]
