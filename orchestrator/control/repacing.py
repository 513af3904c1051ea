"""Pacing that follows the links while a run goes on.

The agents pace every connection at its fair share of the links (agent/pacing.py), computed
when the run starts. A link-degrade applied or undone while it goes on (an experiment's
timeline, `testbed fault` by hand) changes what a connection over that link gets: paced as
before, a connection over a slowed link sends beyond it (its queue builds, or over rdma, which
has no congestion control, its frames drop), and one over a link given its rate back stays
slowed, so the iterations after the undo ran slower than the model prices them. So the driver
polls the links as they are now, and when their rates change sends every agent the run's
plan with the shares over them; an agent paces at them from its next iteration.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import grpc

from orchestrator.agent.plan import build_rank_plans
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.control.endpoints import Endpoint
from orchestrator.cost.compiled import CompiledRun
from orchestrator.topology import Topology

log = logging.getLogger("testbed.driver")

POLL_SECONDS = 0.5  # how often the links are read (a cached file stat when nothing changed)
REPACE_TIMEOUT = 10.0


class Repacer:
    """Polled by the driver while a paced run goes on (`poll`); `links_now()` gives the lab's
    topology with the rates its link-degrades set now, `rates` those the run was paced at."""

    def __init__(self, links_now: Callable[[], Topology], rates: dict, compiled: CompiledRun, run_id: str,
                 endpoints: list[Endpoint], stubs: dict, changes: list[dict] | None = None) -> None:
        self.links_now, self.rates, self.compiled = links_now, dict(rates), compiled
        self.run_id, self.endpoints, self.stubs = run_id, endpoints, stubs
        self.next = time.monotonic() + POLL_SECONDS
        # each re-pacing: when (Unix time), and the link directions at a rate of their own
        # from then ("a→b": bit/s); appended to the caller's list when given
        self.changes: list[dict] = changes if changes is not None else []

    def poll(self) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + POLL_SECONDS
        try:
            topology = self.links_now()
        except Exception as exc:  # noqa: BLE001 - a state file read mid-write: the next poll reads it
            log.debug("reading the lab's links: %s", exc)
            return
        if topology.rates == self.rates:
            return
        self.rates = dict(topology.rates)
        network = self.compiled.network
        plans = build_rank_plans(self.compiled.schedules, self.compiled.ranks, self.compiled.shares(topology),
                                 network.payload_rate)
        self.changes.append({"at": time.time(), "rates": {f"{a}→{b}": rate for (a, b), rate in sorted(self.rates.items())}})
        for endpoint in self.endpoints:
            request = pb.RepaceRequest(run_id=self.run_id, plan_json=plans[endpoint.rank])
            future = self.stubs[endpoint.control].Repace.future(request, timeout=REPACE_TIMEOUT)
            future.add_done_callback(lambda f, e=endpoint: _answered(f, e))
        log.info("the lab's links changed under run %s: its %d agents pace at the new shares from their next "
                 "iteration", self.run_id, len(self.endpoints))


def _answered(future: grpc.Future, endpoint: Endpoint) -> None:
    """An agent that cannot take the new shares keeps the old ones: the run goes on (one that
    stopped answering is the stall check's to name)."""
    try:
        reply = future.result()
    except grpc.RpcError as exc:
        log.warning("re-pacing rank %d (%s): %s", endpoint.rank, endpoint.node, exc.code().name)
        return
    if not reply.ok:
        log.warning("re-pacing rank %d (%s): %s", endpoint.rank, endpoint.node, reply.error)
