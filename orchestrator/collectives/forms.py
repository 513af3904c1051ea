"""REFERENCE.md §2's closed forms, to set beside a prediction: the built-in algorithms' own,
registered with them (algorithms/__init__.py), and the types a plugin's form uses.

A form gives the bandwidth term as a multiple of S/B (S gradient bytes, B a link's payload
rate) and the number of α terms (messages in sequence). Each says what it assumes; where
the lab's schedule or routing breaks that assumption the form returns None rather than a
number the model should not match (e.g. halving-doubling on a non-power of two).

Forms derived here rather than taken from REFERENCE say so: flat mesh on a torus with an
even k, where the lab routes the ties of dimension-order routing one way (+1) and
REFERENCE's n/4 splits them.

Tree and double-tree have no form that describes the agents, which pipeline every chunk
through the tree instead of moving whole steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orchestrator.collectives.schedule import Schedule
from orchestrator.topology import Topology


@dataclass(frozen=True)
class Form:
    factor: float  # time × B / S
    steps: int  # α terms
    source: str  # the formula and what it assumes

    def seconds(self, size_bytes: float, payload_rate: float, latency: float = 0.0) -> float:
        return self.factor * size_bytes / payload_rate + self.steps * latency


@dataclass(frozen=True)
class Case:
    schedule: Schedule  # of the whole range (the first partition's shape)
    topology: Topology

    @property
    def workers(self) -> int:
        return len(self.schedule.workers)

    @property
    def all_servers(self) -> bool:
        return self.schedule.ranks == len(self.topology.servers)


def flat(n: int) -> float:
    return 2 * (n - 1) / n


def ring(case: Case) -> Form:
    n = case.workers
    return Form(flat(n), 2 * (n - 1), "2(N−1)/N·S/B, 2(N−1)α: one ring direction, a link per hop "
                                       "(REFERENCE's torus figure (N−1)/N is a bidirectional ring)")


def torus_mesh(k: int) -> tuple[float, str]:
    if k % 2:
        return (k * k - 1) / (4 * k), "(k²−1)/(4k)·S/B: flat mesh, dimension-order routes (HiPS table)"
    return k / 4 + 0.5, ("(k/4 + 1/2)·S/B: flat mesh, dimension-order routes with ties sent +1 as the lab "
                         "routes them (derived; REFERENCE's k/4 splits ties both ways)")


def mesh(case: Case) -> Form | None:
    n, topology = case.workers, case.topology
    if topology.kind == "bcube":
        if not case.all_servers:
            return None
        base = topology.facts["n"]
        return Form(flat(base), 2, "2(n−1)/n·S/B: flat mesh over all n^h servers, relays counted (HiPS table)")
    if topology.kind == "torus":
        if not case.all_servers or topology.facts["k"] == 2:
            return None
        factor, source = torus_mesh(topology.facts["k"])
        return Form(factor, 2, source)
    return Form(flat(n), 2, "2(N−1)/N·S/B, 2α: mesh on a non-blocking fabric")


def ps(case: Case) -> Form | None:
    n, meta = case.workers, case.schedule.meta
    shards, colocated = meta.get("shards", n), meta.get("colocated", False)
    if colocated:
        return mesh(case) if shards == n else None
    return Form(max(1.0, n / shards), 2, "max(S, N·S/M)/B: lower bound, push and pull overlapped, "
                                         "non-blocking fabric")


def halving_doubling(case: Case) -> Form | None:
    n = case.workers
    if n & (n - 1):
        return None
    steps = 2 * (n.bit_length() - 1)
    return Form(flat(n), steps, "2(p−1)/p·S/B, 2·log2 p·α: a link per pair and step (non-blocking fabric)")


def hips(case: Case) -> Form | None:
    topology = case.topology
    if topology.kind == "bcube":
        n, h = topology.facts["n"], topology.facts["levels"]
        return Form(2 * (n**h - 1) / (h * n**h), 2 * h, "2(n^h−1)/(h·n^h)·S/B: HiPS on BCube (HiPS table)")
    k, h = topology.facts["k"], topology.facts["d"]
    factor = (k**h - 1) / (h * k**h) * (2 if k == 2 else 1)  # k = 2: one NIC per dimension carries both halves
    return Form(factor, 2 * h * (k - 1), "(k^h−1)/(h·k^h)·S/B: HiPS on a torus, both ring directions (HiPS table)")


def bml(case: Case) -> Form | None:
    if case.schedule.meta.get("failed"):
        return None
    n, h = case.workers, case.topology.facts["levels"]
    return Form(2 * (n - 1) / (n * h), 2 * h, "2(N−1)/N·S/(h·B): BML on BCube with h levels")


def hdrm(case: Case) -> Form | None:
    if not case.schedule.meta.get("contention_free"):
        return None
    n = case.workers
    return Form(flat(n), 2 * (n.bit_length() - 1), "2(N−1)/N·S/B: HDRM, one flow per switch link and step")


def two_level(case: Case) -> Form:
    n = case.workers
    return Form(flat(n), len(case.schedule.steps), "2(N−1)/N·S/B: the levels' bytes add up to ring's "
                                                    "(non-blocking fabric)")



ClosedForm = Callable[[Case], "Form | None"]
