"""Loopback agents standing in for the servers of star,4: the driver paces every connection
at its fair share of the lab's link, the agents apply it, the sums stay exact, and every
rank enters the first iteration at the start time the driver named."""

from __future__ import annotations

import dataclasses
import statistics
import time

from orchestrator import topology
from orchestrator.collectives.context import Context
from orchestrator.agent.pacing import SLACK
from orchestrator.cost import Network
from orchestrator.control import driver, workloads
from orchestrator.control.local import local_agents
from orchestrator.spec.lab import StarSpec

ELEMENTS = 750_000  # 3 MB: each rank sends 0.75 MB to each of 3 peers per mesh step


def as_lab_servers(endpoints):
    """The endpoints under star,4's server names, so the driver treats them as the lab's."""
    return [dataclasses.replace(e, node=f"h{e.rank}") for e in endpoints]


def test_a_paced_mesh_is_held_to_its_fair_share_and_stays_exact():
    star = topology.build(StarSpec(kind="star", servers=4))
    network = Network(20e6)  # 20 Mbit: a mesh connection's third is 0.83 MB/s
    with local_agents(4) as endpoints:
        eps = as_lab_servers(endpoints)
        before = time.time()
        paced = driver.run(eps, "mesh", [ELEMENTS], workloads.emulated([ELEMENTS]), iterations=2,
                           ctx=Context(4, star), network=network)
        free = driver.run(eps, "mesh", [ELEMENTS], workloads.emulated([ELEMENTS]), iterations=2,
                          ctx=Context(4, star), network=network, pace=False)
    for run in (paced, free):
        assert all(r["verified"] for r in run.records()) and len(run.records()) == 8
    # two steps of 0.75 MB per connection at most 1/3 × SLACK of 20 Mbit: at least ~1.8 s;
    # loopback without pacing moves it in a small fraction of that. The mean, not each
    # iteration: loopback's 64 KiB segments pace coarsely (a connection's first goes out at
    # once), and an iteration took 1.53-1.61 s of the 1.78, the next 1.77-1.82
    bound = 2 * ELEMENTS * 4 / 4 / (network.payload_rate / 3 * SLACK)
    assert statistics.fmean(paced.gst()) > 0.85 * bound
    assert max(free.gst()) < 0.5 * bound
    # every rank entered iteration 0 after the start time (the driver's margin ahead)
    starts = [r.records[0].start_time for r in paced.results]
    assert min(starts) >= before + driver.START_MARGIN_SECONDS - 0.05
