"""The history checker (Jepsen's idea, for gradient synchronisation): after a run, from what
every agent recorded per iteration, check that

- every agent that finished an iteration holds the same aggregate and, with a real model,
  the same parameters after it (`divergent` otherwise);
- each aggregate is exactly the sum of the contributions its iteration claims: nothing
  `lost` (a claimed worker's gradient missing), nothing `duplicated` (counted twice), no
  `extra` (an unclaimed worker's gradient counted); `unexplained` when the difference is
  no small combination of those.

It works on checksums linear in the buffer's integer values (agent/workload.checksum):
gradients are exact integers (emulated ones, or the digits model's fixed point), so the
aggregate's checksum is exactly Σ multiplicity·contribution checksum, and a difference names
the workers. Pure: no I/O; `observations` reads a driver.RunResult.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import Callable, Iterable

MAX_ANOMALIES = 2  # per iteration, combinations of lost/duplicated/extra searched


@dataclass(frozen=True)
class Observation:
    """One agent's record of one iteration."""

    iteration: int
    node: str
    identity: int | None  # the worker whose gradient it contributed; None: a parameter server
    members: tuple[int, ...]  # the identities its aggregate claims
    contribution: int | None  # checksum of its own gradient (workers)
    aggregate: int | None  # checksum of the reduced buffer
    param_digest: str = ""


@dataclass
class Report:
    iterations: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)  # (iteration, identity)
    duplicated: list[tuple[int, int]] = field(default_factory=list)
    extra: list[tuple[int, int]] = field(default_factory=list)
    unexplained: list[int] = field(default_factory=list)  # iterations
    divergent: list[tuple[int, str]] = field(default_factory=list)  # (iteration, what differs)
    unverified: list[tuple[int, int]] = field(default_factory=list)  # contributions nobody reported
    membership: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # where it changed

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.extra or self.unexplained or self.divergent)

    def __str__(self) -> str:
        changes = "; ".join(f"from {i}: {list(m)}" for i, m in self.membership)
        text = (f"{self.iterations} iterations checked: {len(self.lost)} lost, {len(self.duplicated)} duplicated, "
                f"{len(self.extra)} extra, {len(self.unexplained)} unexplained, {len(self.divergent)} divergent")
        if self.unverified:
            text += f", {len(self.unverified)} contributions unverified"
        return text + (f"; members {changes}" if changes else "")


Fallback = Callable[[int, int], int | None]  # (identity, iteration) → its contribution's checksum


def check(observations: Iterable[Observation], fallback: Fallback | None = None) -> Report:
    """Check a history (see the module docstring). `fallback` gives the contribution of a
    worker that did not report one (it died first), when it can be recomputed."""
    report = Report()
    by_iteration: dict[int, list[Observation]] = defaultdict(list)
    for obs in observations:
        by_iteration[obs.iteration].append(obs)
    previous: tuple[int, ...] | None = None
    for iteration in sorted(by_iteration):
        seen = by_iteration[iteration]
        members = _members(iteration, seen, report)
        if members != previous:
            report.membership.append((iteration, members))
            previous = members
        report.iterations += 1
        _agree(iteration, seen, report)
        aggregates = {o.aggregate for o in seen if o.aggregate is not None}
        if len(aggregates) != 1:
            continue  # no aggregate (or divergent ones, reported)
        contributions = _contributions(iteration, seen, members, fallback, report)
        if contributions is not None:
            _decompose(iteration, aggregates.pop(), members, contributions, report)
    return report


def _members(iteration: int, seen: list[Observation], report: Report) -> tuple[int, ...]:
    claims = {tuple(sorted(o.members)) for o in seen if o.aggregate is not None}
    if len(claims) > 1:
        report.divergent.append((iteration, f"members claimed differ: {sorted(claims)}"))
    return min(claims) if claims else ()


def _agree(iteration: int, seen: list[Observation], report: Report) -> None:
    workers = [o for o in seen if o.identity is not None]
    aggregates = {o.aggregate for o in workers if o.aggregate is not None}
    if len(aggregates) > 1:
        report.divergent.append((iteration, f"aggregates differ across {', '.join(sorted(o.node for o in workers))}"))
    digests = {o.param_digest for o in workers if o.param_digest}
    if len(digests) > 1:
        report.divergent.append((iteration, f"parameters differ across {', '.join(sorted(o.node for o in workers))}"))


def _contributions(iteration: int, seen: list[Observation], members: tuple[int, ...], fallback: Fallback | None,
                   report: Report) -> dict[int, int] | None:
    """identity → contribution checksum of every worker known at `iteration` (claimed or not);
    None when a claimed one is unknown (then nothing of the iteration can be verified)."""
    known: dict[int, int] = {}
    for obs in seen:
        if obs.identity is not None and obs.contribution is not None:
            if known.setdefault(obs.identity, obs.contribution) != obs.contribution:
                report.divergent.append((iteration, f"worker {obs.identity} reported two different gradients"))
    missing = [m for m in members if m not in known]
    for identity in missing:
        value = fallback(identity, iteration) if fallback is not None else None
        if value is None:
            report.unverified.append((iteration, identity))
        else:
            known[identity] = value
    return None if any(m not in known for m in members) else known


def _decompose(iteration: int, aggregate: int, members: tuple[int, ...], contributions: dict[int, int],
               report: Report) -> None:
    """Which claimed contributions are missing from the aggregate or in it twice, and which
    unclaimed ones are in it: the smallest combination explaining the difference."""
    difference = aggregate - sum(contributions[m] for m in members)
    if difference == 0:
        return
    # (kind, identity, multiplicity change)
    candidates = [("lost", m, -1) for m in members] + [("duplicated", m, 1) for m in members] + \
                 [("extra", i, 1) for i in contributions if i not in members]
    for count in range(1, MAX_ANOMALIES + 1):
        for combo in combinations(candidates, count):
            if len({identity for _, identity, _ in combo}) < count:
                continue
            if sum(sign * contributions[identity] for _, identity, sign in combo) == difference:
                for kind, identity, _ in combo:
                    getattr(report, kind).append((iteration, identity))
                return
    report.unexplained.append(iteration)


def observations(result) -> list[Observation]:
    """The observations of a driver.RunResult: its agents' records, with each node's
    worker identity (`result.identities`; a node without one is a parameter server)."""
    identities = getattr(result, "identities", None) or {}
    found = []
    for agent in result.results:
        identity = identities.get(agent.node, agent.rank if not identities else None)
        for rec in agent.records:
            if not rec.aggregate:
                continue  # an unchecked iteration (a back-to-back timed loop)
            found.append(Observation(rec.iteration, agent.node, identity, tuple(rec.members),
                                     int(rec.contribution) if rec.contribution else None,
                                     int(rec.aggregate), rec.param_digest))
    return found


def emulated_fallback(size: int) -> Fallback:
    """Contributions of emulated gradients, recomputed (they depend on identity and iteration only)."""
    from orchestrator.agent.workload import emulated_checksum

    return lambda identity, iteration: emulated_checksum(identity, iteration, size)


def check_run(result, emulated: bool = True) -> Report:
    """Check a driver.RunResult; `emulated`: its gradients were emulated (recomputable)."""
    return check(observations(result), emulated_fallback(result.size_bytes // 4) if emulated else None)
