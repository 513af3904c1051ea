"""Every algorithm over each agent transport in a netns lab: exact sums, every connection
paced at its fair share, and the chunks on the transport's own port.

bcube,3,1 carries all but HDRM (9 servers: 6 workers + 2 parameter servers for PS, all 9
for HiPS and BML); HDRM runs on bigraph,4,2, its own topology."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from orchestrator.agent import transports
from tests.transport_params import transport_params
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.cost import Network
from orchestrator.deploy import deploy
from orchestrator.deploy.agents import DATA_PORT
from orchestrator.emulation import Lab, cleanup
from orchestrator.deploy import lab_agents
from orchestrator.control import driver, workloads
from orchestrator.spec import lab_from_argument

TENSORS = workloads.model_tensors("alexnet", 0.002)  # 16 tensors, ~120 k elements
WORKERS = {"hips": 9, "bml": 9}


def _lab(argument: str, name: str):
    lab = Lab.up(lab_from_argument(argument, name=name, **{"servers.runtime": "netns", "links.bandwidth": "1Gbit"}))
    try:
        endpoints = deploy(lab).endpoints
        yield lab, endpoints
    finally:
        cleanup.clean_lab(lab.name)


@pytest.fixture(scope="module")
def bcube():
    yield from _lab("bcube,3,1", "tr-bcube")


@pytest.fixture(scope="module")
def bigraph():
    yield from _lab("bigraph,4,2", "tr-bigraph")


def _options(algorithm: str) -> dict:
    if algorithm == "hierarchical":
        return {"group": 3}
    if algorithm == "ps":
        return {"shards": 2}
    return {}


def _run(lab, endpoints, algorithm: str, transport: str):
    workers = 8 if algorithm == "hdrm" else WORKERS.get(algorithm, 6)
    nodes = tuple(e.node for e in endpoints)
    ctx = Context(workers, lab.topology, nodes[:workers], options=_options(algorithm))
    ranks = registry.builder(algorithm)(ctx, 10).ranks
    eps = [replace(e, rank=i, role="worker" if i < workers else "ps") for i, e in enumerate(endpoints[:ranks])]
    ctx = Context(workers, lab.topology, tuple(e.node for e in eps), options=_options(algorithm))
    result = driver.run(eps, algorithm, TENSORS, workloads.emulated(TENSORS), iterations=2, ctx=ctx,
                        network=Network.from_links(lab.spec.links), transport=transport,
                        flow_paths=lab_agents.flow_paths(lab, transport))
    records = [r for r in result.records() if r["rank"] < workers]
    assert len(records) == 2 * workers
    assert all(r["verified"] for r in records), records
    assert result.predicted is not None
    return result


def _established(lab, server: str) -> list[int]:
    """Remote ports of `server`'s established TCP connections."""
    out = subprocess.run(["ip", "netns", "exec", lab.namespace(server), "ss", "-tnH", "state", "established"],
                         capture_output=True, text=True, check=True).stdout
    return [int(line.split()[-1].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("transport", transport_params())
@pytest.mark.parametrize("algorithm", sorted(a for a in registry.ALGORITHMS if a != "hdrm"))
def test_every_algorithm_is_exact_over_each_transport_on_bcube(bcube, algorithm, transport):
    lab, endpoints = bcube
    _run(lab, endpoints, algorithm, transport)
    # the run's connections stay open until the next configure: they go to the transport's port
    assert transports.data_port(transport, DATA_PORT) in _established(lab, endpoints[0].node)


@pytest.mark.parametrize("transport", transport_params())
def test_hdrm_is_exact_over_each_transport_on_bigraph(bigraph, transport):
    lab, endpoints = bigraph
    _run(lab, endpoints, "hdrm", transport)
