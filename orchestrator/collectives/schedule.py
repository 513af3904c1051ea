"""A collective is a schedule: ordered steps of point-to-point transfers and reductions.

Every participant ("rank") holds one flat buffer of `size` elements. Workers start with
their own gradient; parameter servers start with zeros. A schedule is a list of steps;
a step is a set of transfers that may run at once. A transfer sends `length` elements
starting at `offset` from `src` to `dst`, where they are either added into (`reduce`) or
written over (`copy`) the same range of the receiver's buffer.

Semantics, which the agents, the in-process simulator and the cost model all share:
- sends of step s read the sender's buffer as it is after every receive of steps < s;
- a rank never sends and receives overlapping ranges in the same step (`validate` checks),
  so nothing needs a snapshot and no whole-model copy is ever made;
- at the end, every worker's buffer holds the sum of all workers' gradients.

`nic` optionally names the sender's NIC level (BCube level, torus dimension·2+direction)
the transfer is meant to leave by; `to_address` in the agent turns it into the peer's
address on that NIC's subnet, so routing takes the intended NIC.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Literal, Sequence

import numpy as np

Op = Literal["reduce", "copy"]


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    offset: int
    length: int
    op: Op
    nic: int | None = None

    def __post_init__(self) -> None:
        budget = _budget.get()
        if budget is not None:
            budget.spend()

    @property
    def end(self) -> int:
        return self.offset + self.length


class TooManyTransfers(ValueError):
    """A plan beyond the transfer budget (registry.MAX_TRANSFERS): figure and limit said."""

    def __init__(self, algorithm: str, what: str, limit: int, holder: str = "run") -> None:
        super().__init__(f"{algorithm} {what}, more than the {limit:,} one {holder} may hold: use fewer servers, "
                         "larger partitions or another algorithm")


class _Budget:
    """Transfers an algorithm may still make while building (registry.schedules sets it):
    the guard that bounds a plugin's schedule, or a built-in's beyond its estimate."""

    # an algorithm may make and drop some transfers (empty ranges, NIC variants): the guard
    # allows twice the budget, the count of what the schedules hold is checked afterwards
    SLACK = 2

    def __init__(self, limit: int, algorithm: str) -> None:
        self.limit, self.algorithm, self.left = limit, algorithm, limit * self.SLACK

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TooManyTransfers(self.algorithm, f"made more than {self.limit * self.SLACK:,} transfers while "
                                   "building one allreduce", self.limit)


_budget: ContextVar[_Budget | None] = ContextVar("transfer_budget", default=None)


@contextmanager
def transfer_budget(limit: int, algorithm: str) -> Iterator[None]:
    """Within it, making more than 2 × `limit` transfers raises TooManyTransfers."""
    token = _budget.set(_Budget(limit, algorithm))
    try:
        yield
    finally:
        _budget.reset(token)


@dataclass
class Schedule:
    """Steps of transfers over `ranks` participants, of which `workers` contribute data."""

    algorithm: str
    ranks: int
    size: int  # elements in every buffer
    steps: list[list[Transfer]] = field(default_factory=list)
    workers: tuple[int, ...] = ()  # ranks holding a gradient (default: all)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.workers:
            self.workers = tuple(range(self.ranks))

    @property
    def servers(self) -> tuple[int, ...]:
        """Ranks that only aggregate (parameter servers): they start from zeros."""
        return tuple(r for r in range(self.ranks) if r not in self.workers)

    def add_step(self, transfers: Iterable[Transfer]) -> None:
        step = [t for t in transfers if t.length > 0]  # empty chunks of tiny tensors vanish
        if step:
            self.steps.append(step)

    def transfers(self) -> Iterable[tuple[int, Transfer]]:
        for index, step in enumerate(self.steps):
            for transfer in step:
                yield index, transfer

    def rendezvous(self) -> set[tuple[int, int, int]]:
        """(step, src, dst) of the transfers that wait for their receiver to enter the step,
        over a transport with a rendezvous (tcp's READY): those into a rank that heard, in an
        earlier step, from a rank that does not send to it in this one. Such a sender would
        otherwise share the receiver's downlink with a transfer of the step before
        (halving-doubling's partners); a receiver that hears from the same ranks step after
        step (a ring, a mesh, a parameter server) gets their data in order on each
        connection anyway, and is sent to eagerly."""
        heard: dict[int, set[int]] = {}  # rank → who sent to it in earlier steps
        waits = set()
        for index, step in enumerate(self.steps):
            now: dict[int, set[int]] = {}
            for t in step:
                if t.src != t.dst:
                    now.setdefault(t.dst, set()).add(t.src)
            for dst, sources in now.items():
                if heard.get(dst, set()) - sources:
                    waits.update((index, src, dst) for src in sources)
            for dst, sources in now.items():
                heard.setdefault(dst, set()).update(sources)
        return waits

    def bytes_sent(self, itemsize: int = 4) -> list[int]:
        """Bytes each rank sends over the whole schedule."""
        sent = [0] * self.ranks
        for _, t in self.transfers():
            sent[t.src] += t.length * itemsize
        return sent

    def bytes_received(self, itemsize: int = 4) -> list[int]:
        received = [0] * self.ranks
        for _, t in self.transfers():
            received[t.dst] += t.length * itemsize
        return received


class ScheduleError(ValueError):
    """A schedule that breaks the rules above (a bug in an algorithm)."""


class RankMismatch(ValueError):
    """The schedules need other agents than a run has; callers add what to do about it."""

    def __init__(self, algorithm: str, ranks: int, given: int) -> None:
        super().__init__(f"{algorithm} needs {ranks} agents (workers and parameter servers), {given} given")
        self.ranks, self.given = ranks, given


def check_ranks(algorithm: str, schedules, given: set[int], placed: int) -> int:
    """The rank count of [(Partition, Schedule)], checked against the ranks that have an agent
    (`given`) and the servers there are to put ranks on (`placed`). One rule for every run,
    plan and prediction: no more agents than ranks, a server for every rank, and an agent for
    every rank that moves bytes (a dead BML server's rank, idle in a re-formed schedule,
    needs none). Without schedules (nothing to do) the agents given are the ranks."""
    ranks = schedules[0][1].ranks if schedules else len(given)
    busy = {r for _, schedule in schedules for _, t in schedule.transfers() for r in (t.src, t.dst)}
    if len(given) > ranks or not busy <= given or placed < ranks:
        raise RankMismatch(algorithm, ranks, min(len(given), placed))
    return ranks


def validate(schedule: Schedule) -> None:
    """Check ranks, ranges, and that no rank sends and receives overlapping ranges in a step."""
    for index, step in enumerate(schedule.steps):
        sending: dict[int, list[tuple[int, int]]] = {}
        receiving: dict[int, list[tuple[int, int]]] = {}
        for t in step:
            if not (0 <= t.src < schedule.ranks and 0 <= t.dst < schedule.ranks) or t.src == t.dst:
                raise ScheduleError(f"step {index}: bad ranks in {t}")
            if t.offset < 0 or t.length < 0 or t.end > schedule.size:
                raise ScheduleError(f"step {index}: range outside the buffer in {t}")
            sending.setdefault(t.src, []).append((t.offset, t.end))
            receiving.setdefault(t.dst, []).append((t.offset, t.end))
        for rank, sends in sending.items():
            for a, b in sends:
                for c, d in receiving.get(rank, []):
                    if a < d and c < b:
                        raise ScheduleError(
                            f"step {index}: rank {rank} sends [{a},{b}) while receiving [{c},{d})"
                        )
        copies: dict[tuple[int, int, int], int] = {}
        for t in step:
            if t.op == "copy":
                key = (t.dst, t.offset, t.end)
                copies[key] = copies.get(key, 0) + 1
                if copies[key] > 1:
                    raise ScheduleError(f"step {index}: rank {t.dst} receives two copies of one range")


def simulate(schedule: Schedule, gradients: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a schedule in-process: the buffers every rank ends with.

    `gradients` has one array per worker (in the order of `schedule.workers`). Sends of a
    step read the buffers as they were at the start of the step, exactly as the agents do.
    """
    validate(schedule)
    if len(gradients) != len(schedule.workers):
        raise ValueError(f"{len(gradients)} gradients for {len(schedule.workers)} workers")
    dtype = np.result_type(*gradients) if gradients else np.float32
    buffers = [np.zeros(schedule.size, dtype=dtype) for _ in range(schedule.ranks)]
    for rank, gradient in zip(schedule.workers, gradients):
        buffers[rank][:] = gradient
    apply(schedule, buffers)
    return buffers


def apply(schedule: Schedule, buffers, landed: Callable[[int, Transfer], None] | None = None) -> None:
    """Run `schedule`'s steps on `buffers` (one per rank) in place, with the agents' rule: a
    step's sends read the buffers as the step began. `landed(step, transfer)` after each."""
    for index, step in enumerate(schedule.steps):
        payloads = [(t, buffers[t.src][t.offset : t.end].copy()) for t in step]
        for t, data in payloads:
            target = buffers[t.dst][t.offset : t.end]
            if t.op == "reduce":
                target += data
            else:
                target[:] = data
            if landed is not None:
                landed(index, t)


def chunks(offset: int, length: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous (offset, length) pieces of a range, sizes differing by at most 1
    (the first `length % parts` pieces are one longer); pieces may be empty."""
    base, extra = divmod(length, parts)
    pieces, start = [], offset
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        pieces.append((start, size))
        start += size
    return pieces
