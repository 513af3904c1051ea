"""`graph` labs (issue 30) built in namespaces.

- The oversubscribed two-tier Clos of topologies/clos-2tier.yaml, one uplink at half rate:
  every pair of servers reachable, each link shaped at its own rate, a mesh predicted with the
  slow uplink as its bottleneck and run within [0.90, 1.10] of that prediction through the
  faithful Python API. Lab: ex-clos.
- BCube(3,1) drawn by hand (topologies/bcube-3-1-drawn.yaml), whose servers relay because the
  file says so: every address of every server reached from every server, and a ring (a third
  of whose transfers a server relays) within [0.90, 1.10] of its prediction. Lab: ex-drawn."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from orchestrator.deploy import lab_agents
from orchestrator.control import workloads
from tests.netns.probes import runs_as_predicted, unreachable_pairs

CLOS = Path(__file__).resolve().parents[2] / "topologies" / "clos-2tier.yaml"
DRAWN = CLOS.with_name("bcube-3-1-drawn.yaml")
TENSORS = [1 << 19]  # 2 MiB


@pytest.fixture(scope="module")
def lab():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    with Lab.up(lab_from_argument(str(CLOS), name="ex-clos", **{"servers.runtime": "netns"})) as live:
        yield live


def test_every_pair_reaches_the_other_and_links_have_their_rates(lab):
    assert unreachable_pairs(lab) == []
    shaped = {frozenset((link["a"], link["b"])): link["rate_bps"] for link in lab.status()["links"]}
    assert shaped.pop(frozenset(("leaf0", "spine1"))) == 50_000_000
    assert set(shaped.values()) == {100_000_000}
    assert len(lab.topology.lookup("leaf0", lab.topology.address_of("h4"))) == 2  # ECMP over both spines


def test_a_mesh_is_predicted_with_the_slow_uplink_as_bottleneck_and_runs_at_it(lab):
    agents = lab_agents.start(lab, via="exec")
    result = agents.run("mesh", TENSORS, workloads.back_to_back(TENSORS), iterations=6)
    assert all(r["verified"] for r in result.records() if r["iteration"] == 0)
    predicted = result.predicted  # over the paths the connections hashed onto
    busiest = {load.link for load in predicted.bottlenecks()}
    # spread evenly over the spines (`testbed predict`), the slow uplink is the bottleneck
    from orchestrator.cost.report import predict_lab

    spread = predict_lab(lab.spec, "mesh", TENSORS[0] * 4).prediction
    assert {load.link for load in spread.bottlenecks()} == {"leaf0→spine1", "spine1→leaf0"}
    seconds = statistics.median(result.back_to_back_times())  # one iteration the machine held up is not the model
    print(f"mesh on the Clos graph: {seconds:.3f} s per allreduce, predicted {predicted.per_run:.3f} s "
          f"(busiest: {sorted(busiest)})")
    assert 0.90 <= seconds / predicted.per_run <= 1.10


@pytest.fixture(scope="module")
def drawn():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    with Lab.up(lab_from_argument(str(DRAWN), name="ex-drawn", **{"servers.runtime": "netns"})) as live:
        yield live


def test_relaying_servers_carry_every_address_and_a_ring_runs_as_predicted(drawn):
    topology = drawn.topology
    servers = [s.name for s in topology.servers]
    pings = {src: drawn.popen(src, ["fping", "-q", "-r", "2", "-t", "300", "-i", "1",  # all at once
                                    *(str(a.ip) for dst in servers if dst != src for a in topology.node(dst).addresses())],
                              stdout=-1, stderr=-1, text=True)
             for src in servers}  # both NICs of every other server, the far level's through a relay
    for src, ping in pings.items():
        out, errors = ping.communicate(timeout=120)
        assert ping.returncode == 0, (src, out, errors)
    runs_as_predicted(drawn, "ring", [1 << 20], "the drawn BCube(3,1)")  # 4 MiB: bandwidth-bound
