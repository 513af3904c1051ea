"""The README's Python example is the faithful run (issue 30): `lab_agents.start(lab)` then
`agents.run("hips", tensors, …)` with no further arguments paces every connection at its fair
share over the hashed paths and predicts, on bcube,4,1 at 100 Mbit (12.5 MB of ResNet-50's
layout); `faithful=False` is the explicit way out; a link-degrade made while it runs is
priced over the iterations it held, and the agents are re-paced at the shares it leaves from
their next iteration, and again once it is undone. Lab: ex-api."""

from __future__ import annotations

import re
import statistics
import threading
import time

import pytest

from orchestrator.deploy import lab_agents
from orchestrator.control import workloads

TENSORS = workloads.model_tensors("resnet50", scale=0.122)  # 12.5 MB in 161 tensors


@pytest.fixture(scope="module")
def agents():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    with Lab.up(lab_from_argument("bcube,4,1", name="ex-api",
                                  **{"links.bandwidth": "100Mbit", "servers.runtime": "netns"})) as lab:
        yield lab_agents.start(lab, via="exec")  # the README deploys with Ansible; the run is the same


def test_the_default_run_is_paced_and_predicted_within_the_band(agents):
    assert [e.rank for e in agents] == list(range(16)) and agents.lab.topology.kind == "bcube"
    result = agents.run("hips", TENSORS, workloads.back_to_back(TENSORS), iterations=6)  # the README's call
    assert all(r["verified"] for r in result.records() if r["iteration"] == 0)  # the warm-up, checked exactly
    predicted = result.predicted
    assert predicted is not None and predicted.per_run > 0
    seconds = statistics.median(result.back_to_back_times())  # one iteration the machine held up is not the model
    print(f"hips on bcube,4,1 at 100 Mbit, 12.5 MB: {seconds:.3f} s per allreduce, predicted {predicted.per_run:.3f} s, "
          f"ratio {seconds / predicted.per_run:.3f}")
    # unpaced it takes ~1.5 × the prediction; paced ~1.06 (bench/python_api.py: three pairs)
    assert 0.90 <= seconds / predicted.per_run <= 1.10


def test_opting_out_is_explicit(agents):
    result = agents.run("ring", TENSORS[:20], iterations=1, faithful=False)
    assert result.predicted is None and all(r["verified"] for r in result.records())


def test_a_run_sizes_its_servers_super_packets_as_testbed_run_does(agents):
    """The API's run sizes the servers' NICs' super-packets for its smallest transfer, as
    `testbed run` does per point (a few super-packets per transfer, not one whole transfer
    leaving at once): small tensors get small ones, a large gradient the size built."""
    from orchestrator.emulation import kernel
    from orchestrator.emulation.lab import largest_super_packet, super_packet_bytes

    lab = agents.lab
    largest = largest_super_packet()
    rate = float(lab.spec.links.bandwidth)

    def server_sizes() -> set[int]:
        with kernel.Netlink() as nl:
            return {kernel.links_in(nl, lab.plan.namespaces[s.name])[nic.name]["gso_ipv4_bytes"]
                    for s in lab.topology.servers for nic in s.data_nics()}

    for tensors in ([2048] * 4, [2 << 20] * 4):  # 32 KiB and 32 MiB in all
        result = agents.run("ring", tensors, iterations=1, faithful=False)
        smallest = result.compiled.smallest_transfer
        assert server_sizes() == {super_packet_bytes(smallest, largest, rate)}, (tensors, smallest)
    assert server_sizes() == {super_packet_bytes(2 << 20, largest, rate)}  # 2 MiB transfers: the most at this rate


def _max_pacing_rates(lab, server: str) -> list[int]:
    """The pacing limits (bit/s) on `server`'s TCP connections, as the kernel reports them
    (`ss -ti`: `pacing_rate R/MAX`; a connection without a limit shows no MAX)."""
    shown = lab.exec(server, ["ss", "-tinH", "state", "established"]).stdout
    return [int(limit) for limit in re.findall(r"pacing_rate \d+bps/(\d+)bps", shown)]


def _settled(read, done, seconds: float = 2.0):
    """`read()` once `done(read())` holds, or as read after `seconds` (a rank that has just
    entered an iteration sets its connection's pacing as its first send of it begins)."""
    deadline = time.monotonic() + seconds
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def test_a_degrade_made_by_hand_while_it_runs_is_priced_over_the_iterations_it_held_and_repaces(agents):
    """`testbed fault … link-degrade` (here its Injector) during `agents.run`: the result says
    which iterations the slower link held, beside the model's prediction for them, with no
    further arguments (issue 30, item 4). Meanwhile the agents pace at the shares the slower
    link leaves: h00's connection over it at half the link, from the iteration after the
    degrade, and unpaced again (the link to itself) after the undo."""
    from orchestrator.agent.pacing import SLACK
    from orchestrator.control.endpoints import run_ids, until_iteration
    from orchestrator.cost import Network
    from orchestrator.faults.injector import Injector

    injector = Injector(agents.lab)
    previous = run_ids(list(agents))
    failures: list[BaseException] = []
    limits: dict[str, list[int]] = {}  # h00's connections' pacing limits: before, while degraded, after

    def degrade() -> None:
        deadline = time.monotonic() + 120
        try:
            until_iteration(list(agents), 2, previous, deadline - time.monotonic())
            limits["before"] = _max_pacing_rates(agents.lab, "h00")
            applied = injector.inject("link-degrade", "h00-l0s0", {"rate": "50Mbit"})
            try:
                until_iteration(list(agents), 4, previous, deadline - time.monotonic())  # re-paced from iteration 3 or 4
                limits["degraded"] = _settled(lambda: _max_pacing_rates(agents.lab, "h00"), lambda x: x != [])
                until_iteration(list(agents), 5, previous, deadline - time.monotonic())
            finally:
                injector.undo(applied.fault.id)
            until_iteration(list(agents), 7, previous, deadline - time.monotonic())
            limits["after"] = _settled(lambda: _max_pacing_rates(agents.lab, "h00"), lambda x: x == [])
        except BaseException as exc:  # seen by the test below
            failures.append(exc)

    thread = threading.Thread(target=degrade)
    thread.start()
    try:
        result = agents.run("ring", TENSORS, workloads.back_to_back(TENSORS), iterations=8)
    finally:
        thread.join()
    assert not failures, failures
    half = 0.5 * SLACK * Network.from_links(agents.lab.spec.links).payload_rate * 8  # bit/s
    print(f"h00's pacing limits (Mbit/s): before {limits['before']}, while h00-l0s0 ran at 50 Mbit "
          f"{[round(x / 1e6, 2) for x in limits['degraded']]} (half the link: {half / 1e6:.2f}), after {limits['after']}")
    assert limits["before"] == [] and limits["after"] == [], limits  # the ring's connections have their links to themselves
    assert [round(x / half, 2) for x in limits["degraded"]] == [1.0], limits
    assert agents.lab.state.active_faults() == []
    [held] = result.under_faults
    print(f"ring on bcube,4,1, h00-l0s0 at 50 Mbit by hand over iterations {held['iterations']}: "
          f"{held['measured_s']:.3f} s per allreduce, predicted {held['predicted_s']:.3f} s, ratio {held['ratio']:.3f}; "
          f"undegraded prediction {result.predicted.per_run:.3f} s")
    assert held["target"] == "h00-l0s0" and held["rate"] == "50Mbit" and held["alongside"] == []
    assert held["iterations"] and set(held["iterations"]) <= {2, 3, 4}
    # the halved link sets the ring's pace: the model says so, and the run agrees
    assert held["predicted_s"] > 1.6 * result.predicted.per_run
    # near the model, not a fidelity bound (bench/ measures that): 1.00 alone on a quiet machine,
    # 1.15-1.20 seen in full suites on these two cores; priced at the undegraded rate it is ~2
    assert 0.85 <= held["ratio"] <= 1.3
