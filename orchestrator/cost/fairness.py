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
