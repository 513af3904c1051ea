"""Max-min fair rates: progressive filling over link directions.

Every entity (a connection) uses links with coefficients (the share of its bytes each link
carries: 1 on a single path, 1/e on each of e ECMP branches). All unfrozen rates rise
together; a link is full when Σ coefficient × rate reaches its capacity, and every entity
crossing it freezes at the level reached. The result is the max-min fair allocation TCP
flows with equal RTTs approach on a shared bottleneck.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

Usage = Sequence[tuple[int, float]]


def max_min_rates(entities: Sequence[Usage], capacity: float | Sequence[float]) -> list[float]:
    """Rate of each entity (bytes/s) when every link direction carries `capacity`, or link
    direction i carries capacity[i]."""
    room = (lambda link: capacity) if isinstance(capacity, (int, float)) else capacity.__getitem__
    rates = [0.0] * len(entities)
    users: dict[int, list[int]] = {}
    weight: dict[int, float] = {}  # link → Σ coefficients of its unfrozen users
    for e, usage in enumerate(entities):
        for link, share in usage:
            users.setdefault(link, []).append(e)
            weight[link] = weight.get(link, 0.0) + share
    frozen_load = dict.fromkeys(weight, 0.0)
    frozen = [False] * len(entities)

    def level(link: int) -> float:  # the common rate at which `link` fills up
        return (room(link) - frozen_load[link]) / weight[link]

    heap = [(level(link), link, weight[link]) for link in weight]
    heapq.heapify(heap)
    while heap:
        value, link, seen = heapq.heappop(heap)
        if weight[link] != seen:  # stale: its unfrozen users changed since it was pushed
            continue
        if weight[link] <= 1e-12:
            continue
        value = max(value, 0.0)
        touched = set()
        for e in users[link]:
            if frozen[e]:
                continue
            frozen[e] = True
            rates[e] = value
            for other, share in entities[e]:
                frozen_load[other] += share * value
                weight[other] -= share
                touched.add(other)
        for other in touched:
            if other != link and weight[other] > 1e-12:
                heapq.heappush(heap, (level(other), other, weight[other]))
    return rates


# Relative margin under which a link direction counts as full: one whose users' bound sums to
# its capacity within it cannot bind below their bounds (float error aside).
_SLACK = 1e-12


class MaxMin:
    """`max_min_rates` over subsets of a fixed set of entities, each problem cut to the link
    directions that can bind before it is filled. An entity alone gets at most its bound:
    its tightest link's capacity / coefficient. A link whose users' bounds weighted by their
    coefficients fit its capacity is full only when they all reach their bounds, which their
    tightest links already cap, so it changes no rate: a Fat-Tree's ECMP connections cross
    ~150 link directions each, of which the two at its ends bind (the rest are ~99 % of the
    work). Dropping constraints that the answer satisfies leaves the max-min answer as is;
    only ties between levels may round differently (below 1e-12 relative)."""

    def __init__(self, entities: Sequence[Usage], capacity: Sequence[float]) -> None:
        self.entities, self.capacity = entities, capacity
        lengths = np.fromiter((len(usage) for usage in entities), dtype=np.int64, count=len(entities))
        self.start = np.concatenate(([0], np.cumsum(lengths)))
        self.lengths = lengths
        self.links = np.fromiter((link for usage in entities for link, _ in usage), dtype=np.int64)
        coefficients = np.fromiter((share for usage in entities for _, share in usage), dtype=float)
        self.room = np.asarray(capacity, dtype=float)
        owner = np.repeat(np.arange(len(entities)), lengths)
        bounds = self.room[self.links] / coefficients
        self.bound = np.full(len(entities), np.inf)
        np.minimum.at(self.bound, owner, bounds)
        self.weighted = coefficients * self.bound[owner]  # coefficient × the entity's bound
        # each entity's tightest link: kept, so no entity is left without the limit it has alone
        self.tightest = [min(usage, key=lambda item: capacity[item[0]] / item[1], default=None) for usage in entities]
        self.coefficients = coefficients

    def rates(self, chosen: Sequence[int]) -> list[float]:
        """Max-min rates of the entities `chosen` (indices into the fixed set), in that order."""
        rows = np.asarray(chosen, dtype=np.int64)
        lengths = self.lengths[rows]
        total = int(lengths.sum())
        if total == 0:
            return [0.0] * len(chosen)
        offsets = np.repeat(self.start[rows] - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        index = offsets + np.arange(total)
        load = np.bincount(self.links[index], weights=self.weighted[index], minlength=len(self.room))
        binding = load > self.room * (1 + _SLACK)
        kept = binding[self.links[index]]
        entity = np.repeat(np.arange(len(rows)), lengths)[kept].tolist()
        links = self.links[index][kept].tolist()
        shares = self.coefficients[index][kept].tolist()
        cut: list[list[tuple[int, float]]] = [[] for _ in chosen]
        for e, link, share in zip(entity, links, shares):
            cut[e].append((link, share))
        for usage, e in zip(cut, chosen):
            tight = self.tightest[e]
            if tight is not None and not binding[tight[0]]:
                usage.append(tight)
        return max_min_rates(cut, self.capacity)
