"""A link at a rate of its own (links.overrides) is shaped at that rate at both ends, and a
run over it is predicted with it as the bottleneck; a link with a queue of its own has that
queue at both ends; a link-degrade fault healed gives the link its own rate back, not the
lab's. Lab: ex-rates."""

from __future__ import annotations

import statistics

import pytest

from orchestrator.deploy import lab_agents
from orchestrator.faults import Injector
from orchestrator.control import workloads

TENSORS = [1 << 19]  # 2 MiB


@pytest.fixture(scope="module")
def lab():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument
    from orchestrator.spec.lab import LabSpec

    data = lab_from_argument("star,4", name="ex-rates", **{"links.bandwidth": "100Mbit", "servers.runtime": "netns"})
    data = data.model_dump(mode="json")
    data["links"]["overrides"] = [{"link": "h0-sw", "bandwidth": "40Mbit"}, {"link": "sw-h1", "queue": 50}]
    with Lab.up(LabSpec.model_validate(data)) as live:
        yield live


def rates(lab) -> dict[str, int]:
    return {f"{link['a']}-{link['b']}": link["rate_bps"] for link in lab.status()["links"]}


def test_the_slow_link_is_shaped_and_the_ring_runs_at_its_pace(lab):
    shaped = rates(lab)
    assert shaped.pop("h0-sw", None) == 40_000_000 or shaped.pop("sw-h0", None) == 40_000_000, rates(lab)
    assert set(shaped.values()) == {100_000_000}
    agents = lab_agents.start(lab, via="exec")
    result = agents.run("ring", TENSORS, workloads.back_to_back(TENSORS), iterations=5)
    predicted = result.predicted
    assert {load.link for load in predicted.bottlenecks()} == {"h0→sw", "sw→h0"}
    seconds = statistics.median(result.back_to_back_times())  # one iteration the machine held up is not the model
    # 2·3/4 · 2 MiB at 40 Mbit's payload rate: what the slow link allows, not the lab's 100 Mbit
    assert predicted.per_run > 1.5 * 2 * 3 / 4 * (TENSORS[0] * 4) / (100e6 / 8)
    print(f"ring over a 40 Mbit link in a 100 Mbit star: {seconds:.3f} s, predicted {predicted.per_run:.3f} s")
    assert 0.85 <= seconds / predicted.per_run <= 1.15


def queue_limits(lab, node: str) -> dict[str, int]:
    """interface → the packet limit of the FIFO under its HTB class, as tc reads it."""
    import json
    import subprocess

    shown = subprocess.run(lab.command_prefix(node) + ["tc", "-j", "qdisc", "show"], capture_output=True, text=True,
                           check=True, timeout=30)
    return {q["dev"]: q["options"]["limit"] for q in json.loads(shown.stdout)
            if q.get("kind") in ("pfifo", "netem") and "limit" in q.get("options", {})}


def test_a_link_with_a_queue_of_its_own_has_it_at_both_ends(lab):
    h1, switch = lab.topology.links_between("h1", "sw")[0].a, lab.topology.links_between("h1", "sw")[0].b
    if h1.node != "h1":
        h1, switch = switch, h1
    assert queue_limits(lab, "h1")[h1.interface] == 50
    limits = queue_limits(lab, "sw")
    assert limits[switch.interface] == 50
    assert {limit for port, limit in limits.items() if port != switch.interface} == {lab.spec.links.queue}


def test_a_healed_degrade_gives_the_link_its_own_rate_back(lab):
    injector = Injector(lab)
    fault = injector.inject("link-degrade", "h0-sw", {"rate": "10Mbit"}).fault
    assert 10_000_000 in rates(lab).values()
    injector.undo(fault.id)
    assert sorted(rates(lab).values()) == [40_000_000] + [100_000_000] * 3


def test_a_degrade_made_by_hand_before_a_run_is_what_the_run_is_predicted_with(lab):
    """A link degraded by hand (`testbed fault`, here its injector) before agents.run: the
    run is paced at and predicted with the degraded rate, not the link's own, and lands in
    the band; healed, the next run is predicted as before."""
    agents = lab_agents.start(lab, via="exec")
    injector = Injector(lab)
    fault = injector.inject("link-degrade", "h2-sw", {"rate": "20Mbit"}).fault
    try:
        slowed = agents.run("ring", TENSORS, workloads.back_to_back(TENSORS), iterations=4)
    finally:
        injector.undo(fault.id)
    assert {load.link for load in slowed.predicted.bottlenecks()} == {"h2→sw", "sw→h2"}
    seconds = statistics.median(slowed.back_to_back_times())  # one iteration the machine held up is not the model
    print(f"ring with h2-sw degraded to 20 Mbit by hand: {seconds:.3f} s, predicted {slowed.predicted.per_run:.3f} s")
    assert 0.85 <= seconds / slowed.predicted.per_run <= 1.15
    healed = agents.run("ring", TENSORS, workloads.back_to_back(TENSORS), iterations=2)
    assert {load.link for load in healed.predicted.bottlenecks()} == {"h0→sw", "sw→h0"}  # its own 40 Mbit again
    assert healed.predicted.per_run < 0.7 * slowed.predicted.per_run
