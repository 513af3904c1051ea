"""Each transfer's fair share of the link: what the agents pace their connections at.

Within one step of one partition the model's connections (a sender and a peer address:
one gRPC connection) share every link direction max-min fairly (fairness.py). A step's
transfers run at once in a schedule that keeps its ranks in step, so that allocation is
the rate each connection gets in the simulation while the step lasts; the agents pace at
it (agent/pacing.py), and the network then carries what the model assumed instead of
TCP's uneven split across two bottlenecks. Every transfer carries its connection's share:
the simulation gives a connection its rate while any of its transfers can send (they split
it among themselves), so the agent paces the connection at that rate while it writes any
of them, not at the sum of per-transfer parts that shrinks as the shorter ones end.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost.fairness import max_min_rates
from orchestrator.cost.network import Network
from orchestrator.cost.routes import Routes

ShareKey = tuple[int, int, Transfer]  # (partition index, step, transfer)


def fair_shares(routes: Routes, schedules: Sequence[tuple[Partition, Schedule]],
                nodes: Sequence[str], network: Network | None = None) -> dict[ShareKey, float]:
    """{(partition index, step, transfer): its connection's share of a link, in (0, 1]} for
    every transfer between two different servers; rank r sits on `nodes[r]`. A share is of
    the network's nominal link rate (what the agents multiply it by): a connection over a
    link of its own, slower rate (links.overrides) gets that link's part of it."""
    nominal = network.payload_rate if network is not None else 1.0
    room: float | list[float] = [c / nominal for c in routes.capacities(network)] if network is not None else 1.0
    shares: dict[ShareKey, float] = {}
    for index, (_, schedule) in enumerate(schedules):
        for step_no, step in enumerate(schedule.steps):
            connections: dict[tuple[str, object], list[Transfer]] = {}
            usage = {}
            for transfer in step:
                src, dst = nodes[transfer.src], nodes[transfer.dst]
                if src == dst or not transfer.length:
                    continue
                key = (src, routes.address(dst, transfer.nic))
                connections.setdefault(key, []).append(transfer)
                usage[key] = routes.usage(src, dst, transfer.nic)[0]
            keys = list(connections)
            for key, rate in zip(keys, max_min_rates([usage[k] for k in keys], room)):
                for transfer in connections[key]:
                    shares[(index, step_no, transfer)] = min(1.0, rate)
    return shares
