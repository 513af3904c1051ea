"""Hosts faked as network namespaces on one underlay bridge: how the hosts tier and
bench/multihost.py stand in for a rack of machines on this one. Each host namespace has one
underlay NIC (`ul0`) with its address; the bridge lives in a namespace of its own, so nothing
touches the machine's own network. A context manager: everything it made goes when it ends."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from orchestrator.emulation import kernel
from orchestrator.emulation.plan import NAMESPACE_PREFIX, namespace_name
from orchestrator.errors import EmulationError

# The underlay is a free /24 of the benchmarking range (RFC 2544), from its top down (lab
# management networks are chosen from its bottom up): none of this machine's networks.
UNDERLAY_RANGE = ipaddress.IPv4Network("198.18.0.0/15")


def free_underlay() -> ipaddress.IPv4Network:
    taken = [network for network, _ in kernel.root_networks_on()]
    for subnet in reversed(list(UNDERLAY_RANGE.subnets(new_prefix=24))):
        if not any(subnet.overlaps(network) for network in taken):
            return subnet
    raise EmulationError(f"no /24 of {UNDERLAY_RANGE} is free on this machine for fake hosts' underlay")


@dataclass(frozen=True)
class FakeHosts:
    prefix: str
    names: tuple[str, ...]
    subnet: ipaddress.IPv4Network

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1 + self.names.index(host)

    @property
    def orchestrator(self) -> ipaddress.IPv4Address:
        """This machine's own end of the underlay (where the engine's scheduler listens)."""
        return self.subnet.broadcast_address - 1

    @property
    def underlay(self) -> dict[str, ipaddress.IPv4Address]:
        return {host: self.address(host) for host in self.names}

    def start(self, host: str, argv: list[str], log: Path, state: Path | None = None) -> subprocess.Popen:
        """A process on `host` (in its namespace), its output to `log`. `state`: the host's
        own state directory, and its own names for the lab namespaces it makes (the machine's
        named namespaces are every fake host's)."""
        env = dict(os.environ)
        if state is not None:
            env.update(TESTBED_STATE=str(state), TESTBED_NETNS_PREFIX=self.netns_prefix(host))
        with open(log, "ab") as out:
            return subprocess.Popen(kernel.in_netns(self.namespace(host)) + argv, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=env)

    @staticmethod
    def netns_prefix(host: str) -> str:
        """How `host`'s worker (started with a `state`) begins the names of lab namespaces."""
        return f"{NAMESPACE_PREFIX}{host}-"

    def node_namespace(self, host: str, lab: str, node: str) -> str:
        """Where `host`'s worker (started with a `state`) puts a lab node's namespace ("": the
        prefix of all the lab's there)."""
        return namespace_name(lab, node, self.netns_prefix(host))


def underlay_addresses() -> list[str]:
    """The IPv4 addresses where the caller runs: which host a task landed on."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return sorted(a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=2))


@contextlib.contextmanager
def fake_hosts(prefix: str, names: list[str], mtu: int = 9000, orchestrator: bool = False) -> Iterator[FakeHosts]:
    """Namespaces `<prefix>-<host>` joined by a bridge in `<prefix>-ul`, underlay MTU `mtu`.
    `orchestrator`: this machine joins the underlay too, at `hosts.orchestrator`, by a veth
    `<prefix>-o` (where the engine's scheduler listens)."""
    hosts = FakeHosts(prefix, tuple(names), free_underlay())
    bridge_ns = f"{prefix}-ul"
    spaces = [bridge_ns, *(hosts.namespace(h) for h in names)]
    kernel.create_namespaces(spaces)
    try:
        with kernel.Netlink() as nl:
            nl.open(spaces)
            kernel.add_bridge(nl, bridge_ns, "ul")
            kernel.set_up(nl, bridge_ns, "ul")
            for index, host in enumerate(names):
                port = f"p{index}"
                kernel.add_veth(nl, hosts.namespace(host), "ul0", bridge_ns, port, 1000, mtu=mtu)
                kernel.enslave(nl, bridge_ns, port, "ul")
                kernel.set_up(nl, bridge_ns, port)
                kernel.set_up(nl, hosts.namespace(host), "lo")
                kernel.add_address(nl, hosts.namespace(host), "ul0",
                                   ipaddress.IPv4Interface(f"{hosts.address(host)}/{hosts.subnet.prefixlen}"))
            if orchestrator:
                kernel.add_veth(nl, None, f"{prefix}-o", bridge_ns, "po", 1000, mtu=mtu)
                kernel.enslave(nl, bridge_ns, "po", "ul")
                kernel.set_up(nl, bridge_ns, "po")
                kernel.add_address(nl, None, f"{prefix}-o",
                                   ipaddress.IPv4Interface(f"{hosts.orchestrator}/{hosts.subnet.prefixlen}"))
        yield hosts
    finally:
        if orchestrator:  # at once: a namespace's links go only when the kernel gets round to it
            with kernel.Netlink() as nl:
                kernel.delete_link(nl, None, f"{prefix}-o")
        for space in spaces:
            kernel.delete_namespace(space)


@contextlib.contextmanager
def engine_on_fake_hosts(directory: Path, names: list[str], own_state: bool = False,
                         worker_ttl: str | None = None) -> Iterator[tuple]:
    """(engine, fake hosts, {host: its worker process}, scheduler address): a TLS scheduler on
    this machine's end of the underlay and one worker per host in its namespace; with
    `own_state`, each worker has its own state directory and names for lab namespaces (what a
    host that builds labs needs). Every process is killed and every namespace removed after."""
    from orchestrator.hosts.dask_engine import start_scheduler, worker_argv
    from orchestrator.hosts.engine import ENGINES
    from orchestrator.hosts.tls import credentials

    processes = []
    with fake_hosts(f"tbe{uuid.uuid4().hex[:4]}", names, orchestrator=True) as hosts:
        try:
            scheduler, address = start_scheduler(directory, str(hosts.orchestrator),
                                                 **({"worker_ttl": worker_ttl} if worker_ttl else {}))
            processes.append(scheduler)
            workers = {}
            for host in hosts.names:
                state = directory / f"state-{host}" if own_state else None
                if state is not None:
                    state.mkdir()
                tls = credentials(directory / "tls", f"worker-{host}")
                workers[host] = hosts.start(host, worker_argv(address, host, tls), directory / f"worker-{host}.log",
                                            state=state)
                processes.append(workers[host])
            connected = ENGINES["dask"](directory, address)
            try:
                connected.wait_for(list(hosts.names))
                yield connected, hosts, workers, address
            finally:
                connected.close()
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
