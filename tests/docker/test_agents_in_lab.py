"""Agents inside a Docker lab: collectives over the emulated fabric, control over management."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.collectives.context import Context
from orchestrator.deploy import lab_agents
from orchestrator.control import driver, workloads
from tests.netns.probes import tx_bytes

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _nic_bytes(lab) -> dict[str, dict[str, int]]:
    """server → interface → bytes sent."""
    return tx_bytes(lab, [server.name for server in lab.topology.servers])


def _delta(before, after):
    return {s: {i: after[s][i] - before[s].get(i, 0) for i in after[s]} for s in after}


@pytest.fixture(scope="module")
def bcube_agents():
    from orchestrator.emulation import Lab, cleanup
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument(str(TOPOLOGIES / "bcube-4-1.yaml"), name="agents-bcube",
                             **{"servers.runtime": "docker", "links.bandwidth": "200Mbit"})
    lab = Lab.up(spec)
    try:
        yield lab, lab_agents.start(lab)
    finally:
        cleanup.clean_lab(spec.name)


@pytest.mark.parametrize("algorithm", ["ring", "hips", "bml"])
def test_collective_across_bcube_in_docker(bcube_agents, algorithm):
    lab, endpoints = bcube_agents
    tensors = workloads.model_tensors("resnet50", 0.02)  # ~2 MB of gradient
    ctx = Context(16, lab.topology, tuple(s.name for s in lab.topology.servers))
    before = _nic_bytes(lab)
    result = driver.run(endpoints, algorithm, tensors, workloads.emulated(tensors), iterations=2, ctx=ctx)
    sent = _delta(before, _nic_bytes(lab))
    assert all(r["verified"] for r in result.records())
    data = sum(sum(b for i, b in nics.items() if i != "mgmt0") for nics in sent.values())
    mgmt = sum(nics["mgmt0"] for nics in sent.values())
    assert data >= 2 * 16 * 2 * (15 / 16) * sum(tensors) * 4 * 0.9  # the gradients crossed the fabric
    assert mgmt < 0.05 * data, (mgmt, data)  # control only on the management network
    if algorithm in ("hips", "bml"):  # both NICs of every server carry about half each
        for server, nics in sent.items():
            level0, level1 = nics[f"{server}-eth0"], nics[f"{server}-eth1"]
            assert min(level0, level1) > 0.3 * (level0 + level1), (server, level0, level1)


def test_agent_metrics_are_scraped_over_management(bcube_agents):
    import urllib.request

    lab, endpoints = bcube_agents
    tensors = workloads.model_tensors("alexnet", 0.001)
    driver.run(endpoints[:], "ring", tensors, workloads.emulated(tensors), iterations=1,
               ctx=Context(16, lab.topology, tuple(s.name for s in lab.topology.servers)))
    address = lab.mgmt_address("h00")
    text = urllib.request.urlopen(f"http://{address}:{lab_agents.METRICS_PORT}/metrics", timeout=5).read().decode()
    assert 'testbed_gst_seconds_count{algorithm="ring"}' in text
    sent = [line for line in text.splitlines() if line.startswith("testbed_bytes_sent_total{")]
    assert sent and all('peer="' in line and 'nic="' in line for line in sent), sent  # per peer and NIC
