"""A fault timeline, as an experiment file holds it (under `faults:`):

    seed: 7                                   # random choices draw from random.Random(seed)
    events:
      - {action: link-down, target: p0a0-c0, at: 5s, for: 10s}
      - action: link-degrade
        target: {any: core-link, count: 2}    # two distinct random core links
        at: 2                                 # a bare number is seconds
        for: 3s
        options: {rate: 10Mbit}
        repeat: {every: 20s, times: 3}        # at 2 s, 22 s, 42 s (each draws again)
      - {action: server-crash, target: {any: worker}, at_iteration: 50}

Each event has exactly one of `at` (seconds from the run's start) and `at_iteration`. A
lasting fault without `for` lasts until the run ends. The structure is checked here; the
names (nodes, links) are checked against the topology by `faults.timeline.plan`, before
anything runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from orchestrator import units

# The kinds of random choice; `faults.timeline.CHOICES` draws each (and checks it knows them all).
RANDOM_KINDS = ("core-link", "aggregation-link", "edge-link", "link", "switch", "server", "worker")


def _seconds(value: Any) -> float:
    """Seconds from a number (seconds) or a duration with a unit (`5s`, `500ms`, `1e3ms`), at
    most a day (units.MAX_INTERVAL: no run lasts longer, and `for: 1e12` is a typo).

    Unlike tc's habit (a bare number is ms), a timeline reads in seconds; a quoted bare
    number is refused rather than guessed; NaN and infinity are refused by name."""
    seconds = units.seconds(value, "5s or 500ms, or a plain number of seconds")
    if seconds < 0:
        raise ValueError(f"{units.shown(value)} must not be negative")
    if seconds > units.MAX_INTERVAL:
        raise ValueError(f"{units.shown(value)} is longer than a day ({units.MAX_INTERVAL:,.0f} s), the most a "
                         "fault timeline plans: give at most 86400s")
    return seconds


Seconds = Annotated[float, BeforeValidator(_seconds)]


class Choice(BaseModel):
    """A random target: `count` distinct candidates of a kind, drawn with the timeline's seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    any: str = Field(description=f"one of {', '.join(RANDOM_KINDS)}")
    count: int = Field(1, ge=1, le=1000, description="how many distinct candidates")

    @field_validator("any")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in RANDOM_KINDS:
            raise ValueError(f"{units.shown(value)} is not a random choice: use one of {', '.join(RANDOM_KINDS)}")
        return value


def _target_shape(value: Any) -> Any:
    """Text or a mapping, said in one line (a union would list why each member refused)."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, dict):
        return value
    raise ValueError(f"{units.shown(value)}: give a link A-B, a node, servers A,B, or {{any: KIND}} "
                     f"with KIND one of {', '.join(RANDOM_KINDS)}")


class Repeat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Seconds for an event `at` a time; a whole number of iterations for one `at_iteration`.
    every: Union[int, float, str] = Field(description="seconds (e.g. 10s), or iterations for at_iteration")
    times: int = Field(ge=1, le=10_000, description="occurrences in all, the first included")


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    action: str
    target: Annotated[Union[Choice, str], BeforeValidator(_target_shape)] = Field(
        description="a link A-B, a switch, a server, servers A,B, or {any: KIND}")
    at: Seconds | None = Field(None, description="seconds from the run's start, e.g. 5s")
    at_iteration: int | None = Field(None, ge=0, le=10**9, description="the iteration that triggers it")
    duration: Seconds | None = Field(None, alias="for", description="how long it lasts, e.g. 10s")
    repeat: Repeat | None = None
    options: dict[str, Union[str, int, float]] = Field(default_factory=dict,
                                                       description="the action's parameters: rate, delay, …")

    @field_validator("action")
    @classmethod
    def _action(cls, value: str) -> str:
        from orchestrator.faults.actions import ACTIONS  # faults import the emulation, which imports spec

        if value not in ACTIONS:
            raise ValueError(f"{units.shown(value)} is no fault action: use one of {', '.join(ACTIONS)}")
        return value

    @field_validator("duration")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be longer than zero, e.g. 5s (leave it out to last until the run ends)")
        return value

    @model_validator(mode="after")
    def _when(self) -> "Event":
        if (self.at is None) == (self.at_iteration is None):
            raise ValueError("give exactly one of at (seconds, e.g. 5s) and at_iteration (a number)")
        if self.repeat is not None:  # `every` in the event's unit; set once, while validating (frozen after)
            self.__dict__["repeat"] = Repeat(every=self._every(self.repeat.every), times=self.repeat.times)
        return self

    def _every(self, every: Any) -> int | float:
        """`repeat.every` in the event's own unit: iterations or seconds, checked."""
        if self.at_iteration is not None:
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ValueError(f"repeat.every: an at_iteration event repeats every N iterations, a whole "
                                 f"number of at least 1 (got {units.shown(every)})")
            return every
        try:
            seconds = _seconds(every)
        except ValueError as exc:
            raise ValueError(f"repeat.every: {exc}") from None
        if seconds <= 0:
            raise ValueError("repeat.every: must be longer than zero, e.g. 10s")
        if self.duration is not None and seconds <= self.duration:
            raise ValueError(f"repeat.every ({seconds:g} s) must be longer than for ({self.duration:g} s): "
                             "an occurrence would start before the last one ended")
        return seconds


# The most faults a timeline may plan, repeats and random draws expanded: a run injects each
# one and keeps a record of it, and more than this is a typo (500 events × repeat 10,000 once
# took 2 GB and hung while planning). Counted from the file, before anything expands.
MAX_PLANNED = 10_000


def planned_count(event: Event) -> int:
    """How many faults `event` plans: one per occurrence and drawn target (a partition of
    `count` servers is one fault)."""
    from orchestrator.faults.actions import ACTIONS

    times = event.repeat.times if event.repeat else 1
    drawn = event.target.count if isinstance(event.target, Choice) and ACTIONS[event.action].target != "servers" else 1
    return times * drawn


class Timeline(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0, le=2**63 - 1, description="seeds the random choices: same seed, same faults")
    events: list[Event] = Field(default_factory=list, max_length=1000)

    @field_validator("events")
    @classmethod
    def _bounded(cls, events: list[Event]) -> list[Event]:
        counts = [planned_count(event) for event in events]
        total = sum(counts)
        if total > MAX_PLANNED:
            largest = max(range(len(counts)), key=counts.__getitem__)
            event = events[largest]
            times = event.repeat.times if event.repeat else 1
            raise ValueError(
                f"{len(events):,} event{'s' * (len(events) != 1)} × repeat.times × target.count = {total:,} planned "
                f"faults, more than {MAX_PLANNED:,} (the most, events.{largest}: repeat {times:,} × "
                f"{counts[largest] // times:,} target{'s' * (counts[largest] != times)} = {counts[largest]:,}): "
                "repeat fewer times, draw fewer targets or split the run")
        return events
