"""A 4-rank mesh on loopback agents: it finishes with exact sums, and its RunResult carries
the cost model's prediction for the same schedule on a lab (star,4 at 100 Mbit)."""

from __future__ import annotations

import pytest

from orchestrator import topology
from orchestrator.collectives.context import Context
from orchestrator.cost import Network
from orchestrator.control import driver, workloads
from orchestrator.control.local import local_agents
from orchestrator.spec.lab import StarSpec

TENSORS = [250_000, 12_345, 7]  # ~1 MiB, three tensors


def test_a_four_rank_mesh_finishes_verified_and_carries_its_prediction():
    star = topology.build(StarSpec(kind="star", servers=4))
    network = Network(100e6, efficiency=1.0)
    with local_agents(4) as endpoints:
        plain = driver.run(endpoints, "mesh", TENSORS, workloads.emulated(TENSORS), iterations=3)
        result = driver.run(endpoints, "mesh", TENSORS, workloads.emulated(TENSORS), iterations=3,
                            ctx=Context(4, star), network=network)
    for run in (plain, result):
        records = run.records()
        assert len(records) == 3 * 4 and all(r["verified"] for r in records)
        assert all(g > 0 for g in run.gst())
    assert plain.predicted is None  # no topology, no prediction
    predicted = result.predicted
    size = sum(TENSORS) * 4
    # every server sends and receives 2·3/4 of the gradient over its one link: 1.5 S/B
    assert predicted.seconds == pytest.approx(1.5 * size / network.payload_rate, rel=1e-3)
    assert predicted.link_bytes["h0→sw"] == pytest.approx(1.5 * size, rel=1e-3)
    assert predicted.workers == 4 and predicted.size_bytes == size
