"""Agents inside a live lab, for scripts and tests: a thin call into orchestrator.deploy.

    agents = lab_agents.start(lab)              # Ansible through nsenter, supervised, healthy
    result = agents.run("hips", tensors, iterations=5)   # the faithful run: paced, predicted

`start` gives a LabAgents: the agents' endpoints (a list, as driver.run takes them) that know
their lab, so that `run` is the run `testbed run` makes with no further arguments: every
connection paced at its fair share over the paths the connections really hashed onto, the
cost model's prediction beside the measurement, a stall named with the dead link on its
path, and each link-degrade made while it ran (`testbed fault`, or the API's own) priced
over the iterations it held (`result.under_faults`). Opting out is explicit
(`faithful=False`: unpaced, unpredicted).

What the orchestrator knows of the agents (ports, addresses, window, tokens) lives in
orchestrator/deploy/agents.py and is re-exported here.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from orchestrator.agent import transports
from orchestrator.deploy.agents import (
    CONTROL_PORT,
    DATA_PORT,
    METRICS_PORT,
    MIN_WINDOW,
    agent_token,
    endpoints,
    flow_window,
    lab_secret,
    nic_addresses,
)
from orchestrator.collectives.context import Context
from orchestrator.control.driver import Endpoint, RunResult, shutdown
from orchestrator.control.iterations import degrades_of, under_degrades
from orchestrator.cost.compiled import CompiledRun
from orchestrator.cost.routes import Routes
from orchestrator.errors import BadUsage, TestbedError

log = logging.getLogger("testbed.agents")

__all__ = ["CONTROL_PORT", "DATA_PORT", "METRICS_PORT", "MIN_WINDOW", "LabAgents", "agent_token", "endpoints",
           "flow_paths", "flow_window", "lab_secret", "nic_addresses", "start", "start_direct", "stop",
           "super_packets_of", "under_faults"]


class LabAgents(list):
    """The agents of a live lab: their endpoints, in rank order (workers, then parameter
    servers), and `run`, whose default is the faithful run."""

    def __init__(self, lab, endpoints: list[Endpoint]) -> None:
        super().__init__(endpoints)
        self.lab = lab

    def run(self, algorithm: str, tensors: list[int], workload: dict | list[dict] | None = None,
            iterations: int = 3, *, options: dict | None = None, latency: float = 0.0, faithful: bool = True,
            transport: str = transports.DEFAULT, **more) -> RunResult:
        """`iterations` of `algorithm` over these agents (workload: emulated, no compute, unless
        given). Faithful unless told otherwise: paced at fair shares over the hashed paths,
        predicted from the lab's links (`latency`: α per message, e.g. as `testbed calibrate
        --latency-only --lab` measured it; 0 leaves it out), stalls named with the link that is
        down, re-paced from the next iteration when a link-degrade is applied or undone while
        it runs; each link-degrade with a rate in effect while it ran, beside the model's prediction
        of the iterations it held from start to end (after the first, when it ran more), in
        `result.under_faults` (as `testbed run`'s results.json has them). The servers' NICs
        build super-packets sized for the run's smallest transfer, as `testbed run`'s do.
        `faithful=False` runs unpaced and unpredicted. `more`: driver.run's other arguments (partition_bytes,
        credit_bytes, timeout, survive, trace, …)."""
        from orchestrator.cost import Network
        from orchestrator.control import driver, workloads

        if why := transports.lacks(transport, getattr(self.lab.spec, "rdma", "none")):
            raise BadUsage(f"lab {self.lab.name}: transport={why} when building it")
        wire = transports.get(transport).wire  # RoCE's payload share is not TCP's
        workers = [e for e in self if e.role == "worker"]
        ranked = sorted(self, key=lambda e: e.rank)
        ctx = Context(len(workers), as_degraded(self.lab), tuple(e.node for e in ranked), dict(options or {}))
        workload = workloads.emulated(tensors) if workload is None else workload
        faithful_args = dict(network=Network.from_links(self.lab.spec.links, latency=latency, wire=wire),
                             link_state=self.lab.link_up, flow_paths=flow_paths(self.lab, transport)) \
            if faithful else dict(pace=False)
        if faithful:  # `links_now=None` keeps the pacing as the run started (bench/repacing.py's other arm)
            more.setdefault("links_now", lambda: as_degraded(self.lab))
        more.setdefault("prepare", super_packets_of(self.lab))
        started = time.time()
        result = driver.run(list(self), algorithm, tensors, workload, iterations, ctx=ctx, transport=transport,
                            **faithful_args, **more)
        if faithful:
            try:
                result.under_faults = under_faults(self.lab, result, started, time.time(),
                                                   warmup=min(1, iterations - 1))
            except (TestbedError, ValueError, OSError) as exc:  # the run's own figures stand without them
                log.warning("link-degrades during the run not priced: %s", exc)
        return result


def super_packets_of(lab) -> Callable[[CompiledRun], int]:
    """driver.run's `prepare` for a lab: each attempt sizes its servers' super-packets for
    its smallest transfer (a re-formed membership for its own, a job for its servers alone;
    emulation/lab.py says why a few per transfer); it returns the size set."""
    return lambda compiled: lab.fit_super_packets(compiled.smallest_transfer, set(compiled.nodes))


def under_faults(lab, result: RunResult, since: float, until: float, warmup: int = 1) -> list[dict]:
    """The link-degrades with a rate the lab's fault log says were applied or undone between
    `since` and `until` (Unix times: the run), each beside the model's prediction of the
    iterations (from `warmup` on) it held from start to end: the run's own schedules and
    routes with those links at those rates (control/iterations.py). A degrade in effect all
    along is the run's own prediction already (`as_degraded`), and left out. Empty for a run
    without a prediction or one whose membership changed (a surviving run's epochs are
    priced by their own predictions)."""
    compiled = result.compiled
    if compiled is None or compiled.prediction is None or len(result.history) > 1:
        return []
    degrades = [d for d in degrades_of(lab.state.fault_events()) if d.end >= since]

    def changed(d) -> bool:  # applied or undone while the run went on
        return since <= d.applied <= until or d.end <= until

    if not any(map(changed, degrades)):
        return []

    def predict(rates: dict) -> float:
        topology = lab.topology.with_rates(rates)
        pinned = compiled.routes.pinned if compiled.routes is not None else None
        return compiled.predicted(compiled.network, topology, Routes(topology, pinned)).prediction.per_run

    return under_degrades(result.records(), degrades, warmup, predict, shown=changed)


def as_degraded(lab):
    """The lab's topology with the rates its active `link-degrade` faults set (both directions
    of the link each names, `A-B`, from the lab's fault log): what a run that starts now is
    paced at and predicted with. A degrade applied or undone while the run goes on is priced
    after it, over the iterations it held (`under_faults`), and the agents are re-paced from
    their next iteration (control/repacing.py)."""
    rates = {}
    for degrade in sorted(degrades_of(lab.state.active_faults()), key=lambda d: d.applied):
        rates.update(degrade.rates())
    return lab.topology.with_rates(rates) if rates else lab.topology


def start(lab, servers: list[str] | None = None, roles: dict[str, str] | None = None, via: str = "nsenter") -> LabAgents:
    """Deploy an agent on each server (default: all) and wait until all answer; their
    endpoints, as LabAgents. `via`: nsenter (Ansible, default), ssh, or exec (no Ansible,
    unsupervised)."""
    from orchestrator.deploy import deploy

    return LabAgents(lab, deploy(lab, servers, roles, via=via).endpoints)


def start_direct(lab, servers: list[str] | None = None, timeout: float = 60.0) -> LabAgents:
    """Agents started without Ansible (the `exec` deployer, unsupervised) on anything that
    gives what it asks of a lab (spec, topology, state, mgmt_address, runtime_of): a lab split
    over hosts (orchestrator/hosts/split.py), whose runtimes start each agent on its host."""
    from orchestrator.control.endpoints import wait_healthy
    from orchestrator.deploy.direct import DirectDeployer

    names = servers or [server.name for server in lab.topology.servers]
    DirectDeployer().start(lab, names, lambda *_: None)
    eps = endpoints(lab, names)
    wait_healthy(eps, timeout=timeout)
    return LabAgents(lab, eps)


def flow_paths(lab, transport: str = transports.DEFAULT) -> Callable[[], dict]:
    """What driver.run's `flow_paths` reads: the paths the agents' data connections over
    `transport` took."""
    port = transports.data_port(transport, DATA_PORT)
    return lambda: lab.connection_paths(port)


def stop(eps: list[Endpoint]) -> None:
    """Stop a run's agents through Control (a supervised agent is started again: use
    orchestrator.deploy.undeploy to remove agents)."""
    shutdown(eps)
    time.sleep(0.2)
