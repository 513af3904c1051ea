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
import threading
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
    topology with the rates its link-degrades set now; `rates` and `plans` (per rank) are
    what the run's agents were paced at when it started."""

    def __init__(self, links_now: Callable[[], Topology], rates: dict, plans: list[str], compiled: CompiledRun,
                 run_id: str, endpoints: list[Endpoint], stubs: dict, changes: list[dict] | None = None) -> None:
        self.links_now, self.rates, self.plans, self.compiled = links_now, dict(rates), list(plans), compiled
        self.run_id, self.endpoints, self.stubs = run_id, endpoints, stubs
        self.next = time.monotonic() + POLL_SECONDS
        # each re-pacing: when (Unix time), and the link directions at a rate of their own
        # from then ("a→b": bit/s); appended to the caller's list when given
        self.changes: list[dict] = changes if changes is not None else []
        self.sequence = 0  # of the plans sent last: an agent takes none older than it has
        self.unsent: set[int] = set()  # ranks whose last Repace failed: sent again at the next poll
        self.lock = threading.Lock()  # `unsent` is added to by gRPC's callback threads
        self.failures = 0

    def poll(self) -> None:
        """Never raises: a re-pacing that cannot be made leaves the run paced as it was, and
        is tried again at the next poll."""
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + POLL_SECONDS
        try:
            self._poll()
        except Exception as exc:  # noqa: BLE001 - the run goes on at the shares it has
            self.failures += 1
            (log.warning if self.failures == 1 else log.debug)("re-pacing run %s: %s", self.run_id, exc)

    def _poll(self) -> None:
        with self.lock:
            retry, self.unsent = self.unsent, set()
        if retry:
            self._send([e for e in self.endpoints if e.rank in retry])
        topology = self.links_now()
        if topology.rates == self.rates:
            return
        plans = build_rank_plans(self.compiled.schedules, self.compiled.ranks, self.compiled.shares(topology),
                                 self.compiled.network.payload_rate, self.compiled.meets)
        changed = plans != self.plans
        self.rates = dict(topology.rates)
        if not changed:  # links this run does not cross
            return
        self.plans, self.sequence = plans, self.sequence + 1
        self.changes.append({"at": time.time(), "rates": {f"{a}→{b}": rate for (a, b), rate in sorted(self.rates.items())}})
        self._send(self.endpoints)
        log.info("the lab's links changed under run %s: its %d agents pace at the new shares from their next "
                 "iteration", self.run_id, len(self.endpoints))

    def _send(self, endpoints: list[Endpoint]) -> None:
        for endpoint in endpoints:
            request = pb.RepaceRequest(run_id=self.run_id, plan_json=self.plans[endpoint.rank], sequence=self.sequence)
            future = self.stubs[endpoint.control].Repace.future(request, timeout=REPACE_TIMEOUT)
            future.add_done_callback(lambda f, e=endpoint, n=self.sequence: self._answered(f, e, n))

    def _answered(self, future: grpc.Future, endpoint: Endpoint, sequence: int) -> None:
        """On a gRPC thread. An agent that did not take the new shares is sent them again at the
        next poll (one that stopped answering is the stall check's to name; one whose run
        ended has nothing to pace)."""
        try:
            reply = future.result()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:  # the run's channels closed: it is over
                return
            error = exc.code().name
        else:
            if reply.ok or "cannot repace a run that is" in reply.error:
                return
            error = reply.error
        log.debug("re-pacing rank %d (%s): %s", endpoint.rank, endpoint.node, error)
        with self.lock:
            if sequence == self.sequence:
                self.unsent.add(endpoint.rank)
