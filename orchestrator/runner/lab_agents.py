"""Agents inside a live lab: one per server, Control and metrics on its management address,
Data on every fabric address.

In a Docker lab the agent runs in the container (`docker exec -d`, the image's
testbed-agent); in a netns lab it runs from the host's venv inside the server's network
namespace, journalled so `testbed clean` stops it. (Deployment with Ansible builds on this.)
"""

from __future__ import annotations

import subprocess
import sys
import time

from orchestrator.emulation import docker_engine
from orchestrator.emulation.cleanup import process_start_time
from orchestrator.emulation.journal import Entry
from orchestrator.runner.driver import Endpoint, shutdown, wait_healthy
from orchestrator.topology import Topology
from orchestrator.topology.describe import diameter

CONTROL_PORT, DATA_PORT, METRICS_PORT = 7000, 7001, 9100
# The floor covers ~8 ms of a 1 Gbit path. Measured on star,8 at 1 Gbit, 2 cores shared by 8
# agents: mesh peaks at ~75 MiB beyond its gradient (BDP probing: ~100; 4 MiB: ~86-100), and
# the CPU-bound ring is ~10% slower than with BDP probing or 4 MiB (a descheduled receiver
# stalls its sender sooner). Memory bounded per connection is what holds on any machine.
MIN_WINDOW = 2**20


def flow_window(spec, topology: Topology) -> int:
    """Bytes of HTTP/2 window a data stream needs to fill a link across the lab's longest path:
    twice the bandwidth-delay product, the delay being netem's delay + jitter on every link of
    the diameter, both ways. Queueing delay is left out on purpose (a window sized to a full
    queue only fills the queue)."""
    links, _ = diameter(topology)
    rtt = 2 * links * (spec.links.delay + spec.links.jitter)
    return min(2**30, max(MIN_WINDOW, int(2 * spec.links.bandwidth / 8 * rtt)))  # gRPC takes an int32


def nic_addresses(topology: Topology, server: str) -> dict[int, str]:
    """For each NIC index a sender may name: this server's address directly reachable from
    a sender's NIC of that index (BCube: the same level; torus: the opposite direction of
    the same dimension, since a +1 link lands on the neighbour's −1 NIC)."""
    node = topology.node(server)
    by_level = {i.level: str(i.address.ip) for i in node.data_nics() if i.level is not None}
    if topology.kind == "bcube":
        return by_level
    if topology.kind == "torus":
        addresses = {}
        for iface in node.data_nics():
            index = int(iface.name.rsplit("eth", 1)[1])
            if topology.params["k"] == 2:
                addresses[index] = str(iface.address.ip)
            else:
                addresses[index ^ 1] = str(iface.address.ip)  # eth2d (+) ↔ eth2d+1 (−)
        return addresses
    return {}


def endpoints(lab, servers: list[str] | None = None, roles: dict[str, str] | None = None) -> list[Endpoint]:
    """Endpoints of the agents of `servers` (default: all, in rank order)."""
    topology = lab.topology
    names = servers or [s.name for s in topology.servers]
    out = []
    for rank, name in enumerate(names):
        mgmt = str(lab.mgmt_address(name))
        data = f"{topology.address_of(name)}:{DATA_PORT}"
        by_nic = {nic: f"{address}:{DATA_PORT}" for nic, address in nic_addresses(topology, name).items()}
        role = (roles or {}).get(name, "worker")
        out.append(Endpoint(rank, name, f"{mgmt}:{CONTROL_PORT}", data, by_nic, role))
    return out


def start(lab, servers: list[str] | None = None, roles: dict[str, str] | None = None) -> list[Endpoint]:
    """Start an agent on each server and wait until all answer; their endpoints."""
    eps = endpoints(lab, servers, roles)
    window = flow_window(lab.spec, lab.topology)
    entries = []
    for endpoint in eps:
        node = lab.topology.node(endpoint.node)
        data = ",".join(f"{nic.address.ip}:{DATA_PORT}" for nic in node.data_nics())
        mgmt = endpoint.control.rsplit(":", 1)[0]
        args = ["--node", endpoint.node, "--control", endpoint.control, "--data", data,
                "--metrics", f"{mgmt}:{METRICS_PORT}", "--window", str(window)]
        if lab.plan.in_container(endpoint.node):
            docker_engine.exec_detached(lab.plan.container_name(endpoint.node), ["testbed-agent", *args])
        else:
            proc = lab.popen(
                endpoint.node, [sys.executable, "-m", "orchestrator.agent.server", *args],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            entries.append(Entry("process", f"agent-{endpoint.node}", {"pid": proc.pid, "start": process_start_time(proc.pid)}))
    lab.state.record(entries)
    wait_healthy(eps, timeout=60)
    return eps


def stop(eps: list[Endpoint]) -> None:
    shutdown(eps)
    time.sleep(0.2)
