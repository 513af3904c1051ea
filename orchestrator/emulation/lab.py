"""A live lab: `Lab.up(spec)` makes a topology real on this machine, `down()` removes it.

    with Lab.up(spec) as lab:
        print(lab.exec("h00", "ping -c1 10.0.0.2").stdout)
        lab.net["h00"].cmd("ip route")          # Mininet nodes, attached to the live lab

Bring-up order: refuse what the kernel cannot do → state directory (under a lock) →
namespaces and containers → veth links (created inside their namespaces) → bridges,
addresses, shaping, routes → management network → its isolation → soft-RoCE. Every object
is journalled before it is made; any failure undoes what exists, and `testbed clean` undoes
a crash.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from orchestrator.emulation import capacity, cleanup, features, isolation, kernel, nft, queues, softroce
from orchestrator.emulation.interrupts import held_signals, terminate_as_interrupt
from orchestrator.emulation.journal import Entry, LabState, busy_error, global_lock, lab_lock, lab_locked
from orchestrator.emulation.plan import MGMT_IF, OPTIONAL_SYSCTLS, SLOW_START_AFTER_IDLE, LabPlan, choose_mgmt_subnet
from orchestrator.emulation import runtimes
from orchestrator.emulation.runtimes import ExecResult, ServerRuntime, by_runtime, runtime_named
from orchestrator.errors import EmulationError, LabCrashed, LabExists, NodeNotFound, TopologyError
from orchestrator.spec import LabSpec
from orchestrator.spec.kinds import plugin_of, require
from orchestrator.topology import Endpoint, Link, Topology, from_lab, reroute
from orchestrator.topology.model import BRIDGE

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True)
class Part:
    """The share of a lab split over hosts that this machine builds (orchestrator/hosts): the
    nodes placed here, and the ends here of the wires between hosts (hosts.wires.Wire: its
    `vni`, and `ends()`, each link end with its host and the other's), over this host's
    underlay to the others'."""

    host: str
    host_of: Mapping[str, str]
    wires: tuple = ()
    underlay: Mapping[str, ipaddress.IPv4Address] = field(default_factory=dict)

    def holds(self, node: str) -> bool:
        return self.host_of[node] == self.host


def _quiet(stage: str, done: int, total: int) -> None:
    pass


LEGACY_GSO_BYTES = 64 * 1024  # a super-packet's limit on a kernel without BIG TCP
# Super-packets per transfer a run's NICs allow at least. A super-packet leaves whole, so
# a connection paced at a share of its link sends in steps of one (128 KiB at 1/7 of
# 200 Mbit: 36 ms), and connections that share a link end up to one step apart: a mesh
# of 8 at 4 MiB (512 KiB transfers, 4 super-packets each) took 1.11-1.18 × the model at
# 128 KiB and 1.04-1.05 × at 64 KiB (bench/model_accuracy.py); bcube,3,1's mesh and ps
# 1.18-1.21 and 1.05-1.06. Smaller ones cost the kernel per byte (a 200 Mbit ring's
# machine CPU per GB: 0.53-0.56 at 128 KiB, 0.62-0.67 at 64 KiB), so large transfers keep
# large ones.
SUPER_PACKETS_PER_TRANSFER = 8
# A super-packet also crosses a link whole (HTB charges it after sending it): it is the
# link's unit of time, and connections sharing a link take turns in it. 64 KiB are 10.5 ms
# of a 50 Mbit link: bcube,4,1's sharded PS (a mesh of 16, 4 MiB) took 1.14 × the model with
# them and 1.07 × with 32 KiB ones (8 KiB ones: 1.11, the kernel's work per packet); at 4 MiB
# and 50 Mbit (bench/model_accuracy.py --rate 50Mbit, A/B with --super-packet-seconds 0.011)
# star,8's mesh 1.052 and 1.018, bigraph 4×2's ps 1.034 and 1.011. So a super-packet is at
# most this much of its link's line time: 32 KiB at 50 Mbit, 64 KiB at 100, 128 KiB from
# 200 Mbit (the sizes issue 28's CPU-per-byte figures were taken with).
SUPER_PACKET_SECONDS = 0.0055
SMALLEST_SUPER_PACKET = 16 * 1024


def largest_super_packet() -> int:
    """The super-packet size a lab's NICs are built with on this kernel: BIG TCP's, else
    the kernel's own 64 KiB."""
    return kernel.BIG_GSO_BYTES if features.kernel_features()["big_tcp"] else LEGACY_GSO_BYTES


def super_packet_bytes(smallest_transfer: int, largest: int, rate_bps: float | None = None) -> int:
    """The super-packet size for a run whose smallest transfer is `smallest_transfer` bytes:
    the largest power of two that gives it SUPER_PACKETS_PER_TRANSFER, within
    [LEGACY_GSO_BYTES, largest] (below 64 KiB the kernel's work per byte climbs faster than
    the steps shrink matter: such transfers take a few milliseconds); and, on a link of
    `rate_bps`, at most SUPER_PACKET_SECONDS of its line time (down to SMALLEST_SUPER_PACKET)."""
    size = largest
    while size > LEGACY_GSO_BYTES and size * SUPER_PACKETS_PER_TRANSFER > smallest_transfer:
        size //= 2
    size = max(size, min(LEGACY_GSO_BYTES, largest))
    while rate_bps and size > SMALLEST_SUPER_PACKET and size * 8 > rate_bps * SUPER_PACKET_SECONDS:
        size //= 2
    return size


class Lab:
    """A lab that is live on this machine (build one with `Lab.up`, find one with `Lab.attach`)."""

    def __init__(self, spec: LabSpec, plan: LabPlan, state: LabState, part: Part | None = None) -> None:
        self.spec = spec
        self.plan = plan
        self.state = state
        self.part = part  # a host's share of a split lab: built, changed and read on its nodes only
        self._net = None

    def here(self, node: str) -> bool:
        """Whether `node` lives on this machine (every node, unless the lab is split)."""
        return self.part is None or self.part.holds(node)

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def up(cls, spec: LabSpec, progress: Progress = _quiet, part: Part | None = None) -> "Lab":
        features.require(spec)  # refuse before anything is built
        topology = from_lab(spec)
        capacity.require(spec, topology)  # and what this host cannot hold (raises RLIMIT_NOFILE's soft limit)
        runtime_named(spec.servers.runtime).prepare(spec, progress)  # Docker's engine and image
        # Signals are held from here on: a build is rolled back whenever one arrives, and the
        # lab's lock, taken with its state directory, is held until it is up or undone.
        with held_signals() as signals, ExitStack() as holding:
            with global_lock():
                holding.enter_context(lab_lock(spec.name))
                state = LabState(spec.name)
                if state.exists():
                    if state.building():  # and we hold its lock: its builder died
                        raise LabExists(f"an earlier build of lab {spec.name!r} crashed: "
                                        f"run `testbed clean {spec.name}` first")
                    raise LabExists(f"lab {spec.name!r} is already live: `testbed down {spec.name}` first")
                cleanup.refuse_leftovers(spec.name)
                plan = LabPlan(spec.name, topology, spec.servers.runtime, management_subnet(spec, topology))
                state.create(
                    spec.model_dump(mode="json"),
                    {"status": "building", "pid": os.getpid(), "id": plan.id,
                     "runtime": plan.runtime, "mgmt_subnet": str(plan.mgmt_subnet),
                     "topology_plugin": plugin_of(spec.topology.kind),
                     "part": part and {"host": part.host, "host_of": dict(part.host_of)}},
                )
            lab = cls(spec, plan, state, part)
            try:
                _Builder(lab, progress, signals.check).build()
                signals.check()  # a signal during the last step still undoes the lab
                state.update_state(status="up", pid=None)
            except BaseException:
                cleanup.clean_lab(spec.name)
                raise
        return lab

    @classmethod
    def attach(cls, name: str, crashed_ok: bool = False) -> "Lab":
        """The live lab `name`. LabBusy while another process builds it; LabCrashed if its
        builder died (only `down`, which cleans, passes `crashed_ok`)."""
        state = LabState(name).require()
        if state.building() or not state.spec():
            if lab_locked(name):
                raise busy_error(name)
            if not crashed_ok:
                raise LabCrashed(f"lab {name!r} crashed while being built: run `testbed clean {name}`")
        info, written = state.state(), state.spec()
        topology = written.get("topology") if isinstance(written, dict) else None
        plugin = info.get("topology_plugin")
        if isinstance(topology, dict) and isinstance(topology.get("kind"), str):  # a plugin's kind: load it again
            require(topology["kind"], plugin if isinstance(plugin, str) else None)
        spec = LabSpec.model_validate(written)
        topology = from_lab(spec)
        plan = LabPlan(name, topology, info["runtime"], ipaddress.IPv4Network(info["mgmt_subnet"]))
        share = info.get("part")
        part = None
        if isinstance(share, dict) and isinstance(share.get("host_of"), dict):
            part = Part(str(share.get("host")), {str(k): str(v) for k, v in share["host_of"].items()})
        return cls(spec, plan, state, part)

    def down(self) -> None:
        if self._net is not None:
            for node in self._net.values():
                node.terminate()
            self._net = None
        cleanup.clean_lab(self.spec.name)

    def __enter__(self) -> "Lab":
        # SIGTERM and SIGHUP unwind the `with` as Ctrl-C does, so the lab comes down for them
        # too (Python's default ends the process and leaves it up)
        self._signals = terminate_as_interrupt()
        self._signals.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        signals, self._signals = getattr(self, "_signals", None), None
        if signals is not None:
            signals.__exit__(None, None, None)
        with held_signals() as held:  # a signal now does not cut the teardown short: it acts after
            self.down()
        if held.received is not None and exc[0] is None:
            raise KeyboardInterrupt

    # -- inventory ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def topology(self) -> Topology:
        return self.plan.topology

    @property
    def status_word(self) -> str:
        return self.state.state().get("status", "unknown")

    def check_node(self, node: str) -> None:
        if node not in self.topology.nodes:
            raise NodeNotFound(
                f"lab {self.name} has no node {node!r} (servers: "
                f"{', '.join(s.name for s in self.topology.servers[:6])}…)"
            )

    def namespace(self, node: str) -> str:
        self.check_node(node)
        return self.plan.namespaces[node]

    def mgmt_address(self, server: str):
        return self.plan.mgmt[server][1].ip

    def runtime_of(self, node: str) -> ServerRuntime:
        """What `node` runs in (emulation/runtimes.py): a switch always netns."""
        self.check_node(node)
        return runtimes.runtime_of(self.plan, node)

    @property
    def server_runtime(self) -> ServerRuntime:
        return runtimes.server_runtime(self.plan)

    # -- running things -----------------------------------------------------------------------
    def exec(self, node: str, command: str | Sequence[str], timeout: float | None = None) -> ExecResult:
        """Run a command on a node and wait: a container's `docker exec`, or the namespace."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return self.runtime_of(node).exec(self, node, argv, timeout)

    def command_prefix(self, node: str) -> list[str]:
        """argv prefix that runs a host program in `node`'s network, like a Mininet host.

        For a container that is its network and hostname, not its filesystem: host tools
        (iperf3, tcpdump) work the same on every runtime. `exec()` runs inside containers.
        """
        return self.runtime_of(node).command_prefix(self, node)

    def popen(self, node: str, command: str | Sequence[str], **kwargs) -> subprocess.Popen:
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return subprocess.Popen(self.command_prefix(node) + argv, **kwargs)

    def start_module(self, node: str, module: str, env: dict[str, str], **popen) -> subprocess.Popen:
        """`python -m module` on a server with its own Python: the host's in a namespace, the
        image's in a container (a framework's workers, frameworks/). Closing its stdin stops it."""
        return self.runtime_of(node).start_module(self, node, module, env, **popen)

    @property
    def net(self):
        """A Mininet network whose nodes are attached to this live lab (for CLI and scripts)."""
        if self._net is None:
            from orchestrator.emulation.mininet_attach import attach

            self._net = attach(self)
        return self._net

    # -- state --------------------------------------------------------------------------------
    def set_link(self, a: str, b: str, up: bool) -> None:
        """Take the link between nodes a and b down (or back up), both ends, like a cut cable.

        The kernel drops static routes through an interface that goes down; bringing the
        link back reinstalls both ends' routes, so up undoes down exactly.
        """
        links = self.topology.links_between(a, b)
        if not links:
            raise NodeNotFound(f"lab {self.name} has no link between {a} and {b}")
        ns = self.plan.namespaces
        with kernel.Netlink() as nl:
            for link in links:
                for end in (link.a, link.b):
                    kernel.set_link_state(nl, ns[end.node], end.interface, up)
            if up:
                for node in {a, b}:
                    self._reinstall_routes(nl, node)

    def _reinstall_routes(self, nl: kernel.Netlink, node: str, down: Collection[str] | None = None) -> None:
        """Put back a node's routes, each with the next hops whose interface is up (the
        rest return when their own link does). `down`: the node's interfaces known to be
        down, saving a look at the kernel's."""
        ns, metrics = self.plan.namespaces[node], self.route_metrics(node)
        if down is None:
            up = {name for name, info in kernel.links_in(nl, ns).items() if info["up"]}
        else:
            up = set(self.topology.nodes[node].interfaces) - set(down)
        if metrics:  # the kernel remade the subnet routes of interfaces that came up, plainly
            for iface in self.topology.nodes[node].interfaces.values():
                if iface.address is not None and iface.name in up:
                    kernel.set_connected_metrics(nl, ns, iface.name, iface.address, metrics)
        for route in self.topology.routes_of(node):
            hops = [(h.dev, h.via) for h in route.nexthops if h.dev in up]
            if hops:
                kernel.add_route(nl, ns, route.prefix, hops, replace=True, metrics=metrics)

    # -- faults (orchestrator.faults journals them and calls these) -----------------------
    def links_between(self, a: str, b: str) -> list[Link]:
        """The links wiring nodes a and b together (NodeNotFound for an unknown node)."""
        self.check_node(a)
        self.check_node(b)
        return self.topology.links_between(a, b)

    def link_up(self, a: str, b: str) -> bool | None:
        """Whether every link between a and b is up at both ends (None: no such link); what
        driver.run's stall message names a dead path with."""
        links = self.topology.links_between(a, b)
        if not links:
            return None
        with kernel.Netlink() as nl:
            return all(kernel.links_in(nl, self.namespace(end.node)).get(end.interface, {}).get("up", False)
                       for link in links for end in (link.a, link.b) if self.here(end.node))

    def connection_paths(self, port: int) -> dict[tuple[str, ipaddress.IPv4Address], list[str]]:
        """{(server, remote address): node path} of every established TCP connection from a
        server to `port`, as the lab forwards it now: each hop asked, with the connection's
        5-tuple, which next hop its routing (ECMP hashing included) takes. What the cost model
        needs to predict a run over hashed paths instead of an even spread (cost/routes.py)."""
        servers = {self.plan.namespaces[s.name]: s.name for s in self.topology.servers}
        found = kernel.in_namespaces(servers, lambda _: kernel.tcp_connections(port))
        paths = {}
        with kernel.Netlink() as nl:
            for ns, connections in found.items():
                for local, sport, remote, dport in connections:
                    paths[(servers[ns], remote)] = self._flow_path(nl, servers[ns], local, sport, remote, dport)
        return paths

    def _flow_path(self, nl: kernel.Netlink, server: str, src: ipaddress.IPv4Address, sport: int,
                   dst: ipaddress.IPv4Address, dport: int) -> list[str]:
        topology, node, iif, path = self.topology, server, None, [server]
        owner = topology.owner(dst)
        if owner is None:
            raise EmulationError(f"{server} has a connection to {dst}, which no node of lab {self.name} holds")
        while node != owner.node:
            if len(path) > 4 * len(topology.nodes):
                raise EmulationError(f"the path from {server} to {dst} loops: {path[:12]}")
            ns = self.plan.namespaces[node]
            oif, gateway = kernel.route_get(nl, ns, dst, src, iif, sport, dport)
            path += topology.hop(node, nl.name(ns, oif), gateway or dst)
            entry = topology.owner(gateway or dst)
            node = entry.node
            iif = nl.index(self.plan.namespaces[node], entry.interface)
        return path

    def set_links(self, changes: Sequence[tuple[Link, bool]], down_elsewhere: Collection[Link] = ()) -> int:
        """Take links down or up (both ends, like a cut cable) and make the network react:
        every node whose routes stop working gets routes around the dead links (a router
        drops a dead next hop from its ECMP groups, a BCube or torus server detours), and
        they go back to the lab's own when the links return. `down_elsewhere`: links other
        faults hold down, which stay down. Returns how many routes changed beyond the ends'."""
        elsewhere = set(down_elsewhere)
        dead_before = elsewhere | {link for link, up in changes if up}
        dead_after = elsewhere | {link for link, up in changes if not up}
        before = reroute.overrides(self.topology, dead_before)  # pure, decided before acting
        after = reroute.overrides(self.topology, dead_after)
        down: dict[str, set[str]] = {}
        for end in reroute.dead_ends(dead_after):
            down.setdefault(end.node, set()).add(end.interface)
        # split over hosts, each host does this for its nodes: a link between hosts is cut at
        # both ends, each by its own host
        ns = self.plan.namespaces
        ends = {end.node for link, _ in changes for end in (link.a, link.b) if self.here(end.node)}
        with kernel.Netlink() as nl:
            for link, up in changes:
                for end in (link.a, link.b):
                    if self.here(end.node):
                        kernel.set_link_state(nl, ns[end.node], end.interface, up)
            for node in sorted(ends):
                self._reinstall_routes(nl, node, down.get(node, set()))
            changed = self._apply_overrides(nl, before, after, ends, down)
        if self.spec.rdma == "softroce":
            self._repair_softroce({end.node for link, up in changes if up for end in (link.a, link.b)})
        return changed

    def _repair_softroce(self, nodes: Collection[str]) -> None:
        """The rxe devices of servers among `nodes` whose management queue pair died while
        their links were down are made again (see emulation/softroce.py)."""
        for server in self.topology.servers:
            if server.name in nodes and self.here(server.name):
                softroce.repair(self.plan.namespaces[server.name], softroce.devices(self.plan.id, server))

    def _apply_overrides(self, nl: kernel.Netlink, before: reroute.Overrides, after: reroute.Overrides,
                         refreshed: set[str], down: dict[str, set[str]]) -> int:
        """Move the kernel from one set of reroute overrides to another: an override no longer
        wanted gives way to the lab's own route of that prefix (or none); `refreshed` nodes had
        their own routes reinstalled, so they get every override again."""
        changed = 0
        for node in sorted(node for node in set(before) | set(after) if self.here(node)):
            old, new = before.get(node, {}), after.get(node, {})
            space, metrics = self.plan.namespaces[node], self.route_metrics(node)
            own = {route.prefix: route for route in self.topology.routes_of(node)} if old.keys() - new.keys() else {}
            for prefix in old.keys() - new.keys():
                route = own.get(prefix)
                hops = [(h.dev, h.via) for h in route.nexthops if h.dev not in down.get(node, ())] if route else []
                if hops:
                    kernel.add_route(nl, space, prefix, hops, replace=True, metrics=metrics)
                else:
                    kernel.delete_route(nl, space, prefix)
                changed += 1
            for prefix, hops in new.items():
                if node in refreshed or old.get(prefix) != hops:
                    kernel.add_route(nl, space, prefix, [(h.dev, h.via) for h in hops], replace=True,
                                     metrics=metrics)
                    changed += 1
        return changed

    def set_link_shape(self, link: Link, rate_bps: int | None = None, delay_s: float = 0.0, jitter_s: float = 0.0,
                       loss_percent: float = 0.0, queue_too: bool = False) -> None:
        """Change a link's rate (both directions) and, with `queue_too`, its queue (the link's own
        length): netem delay/jitter/loss, or the plain FIFO when they are all zero."""
        ns = self.plan.namespaces
        with kernel.Netlink() as nl:
            for end, other in ((link.a, link.b), (link.b, link.a)):
                if not self.here(end.node):  # its own host shapes it
                    continue
                if rate_bps is not None:
                    kernel.set_rate(nl, ns[end.node], end.interface, rate_bps, self.spec.links.mtu)
                if queue_too:
                    queue = self.topology.queue_of(end.node, other.node, self.spec.links.queue)
                    kernel.set_leaf(nl, ns[end.node], end.interface, queue, delay_s, jitter_s, loss_percent,
                                    self.leaf(end.node, other.node))

    def fit_super_packets(self, smallest_transfer: int, servers: Collection[str] | None = None) -> int:
        """Size the super-packets the servers' NICs build for a run whose smallest transfer
        is `smallest_transfer` bytes (`super_packet_bytes`); the connections the run opens
        take it. `servers`: the run's (a job's own, when jobs run at once); default all.
        A NIC whose device takes less (a VXLAN wire between hosts: 64 KiB) takes its most.
        The size set."""
        largest = largest_super_packet()
        nominal = float(self.spec.links.bandwidth)
        size = super_packet_bytes(smallest_transfer, largest, nominal)
        ns = self.plan.namespaces
        with kernel.Netlink() as nl:
            for server in self.topology.servers:
                if self.here(server.name) and (servers is None or server.name in servers):
                    devices = kernel.links_in(nl, ns[server.name])
                    for nic in server.data_nics():
                        wire = self.topology.peer(Endpoint(server.name, nic.name))  # links.overrides' rate
                        rate = nominal if wire is None else \
                            min(nominal, self.topology.rate_of(server.name, wire.node, nominal))
                        wanted = super_packet_bytes(smallest_transfer, largest, rate)
                        most = devices.get(nic.name, {}).get("tso_max_bytes") or wanted
                        kernel.set_gso(nl, ns[server.name], nic.name, min(wanted, most), largest > LEGACY_GSO_BYTES)
        return size

    def server_processes(self, server: str) -> list[dict]:
        """What runs on a server: {pid, start} of every process in a netns server's namespace
        (start tells a pid apart from its later reuse). A container's are Docker's: []."""
        return self.runtime_of(server).server_processes(self, server)

    def signal_server(self, server: str, processes: list[dict], action: str) -> int:
        """stop | cont | kill what runs on a server: its container (docker pause / unpause /
        kill), or the recorded processes of its namespace that are still the same processes.
        Returns how many were signalled."""
        return self.runtime_of(server).signal(self, server, processes, action)

    def throttle_server(self, server: str, processes: list[dict], cpus: float | None, key: str) -> None:
        """Limit what runs on a server (`processes`, as server_processes listed them) to `cpus`
        of one core, None lifting the limit `key` set: a cgroup CPU quota on its recorded
        processes, or `docker update --cpus`."""
        self.runtime_of(server).throttle(self, server, processes, cpus, key)

    def revive_server(self, server: str) -> bool:
        """Start a crashed server again, on its own network: a container's runtime moves the
        server's interfaces into the container's new namespace, and they get their addresses,
        shaping and management side back here. Its data links stay down: bringing them up
        (and the routes with them) is `set_links`'. False when there was nothing to start: a
        netns server (its namespace outlives its processes) or a running container."""
        if not self.runtime_of(server).revive(self, server):
            return False
        space = self.plan.namespaces[server]
        builder = _Builder(self, _quiet)
        try:
            kernel.set_up(builder.nl, space, "lo")
            builder.mgmt_inside(builder.nl, server)
            builder.configure_interfaces(builder.nl, server, links_up=False)
        finally:
            builder.nl.close()
        if self.spec.rdma == "softroce":
            builder.softroce([server])
        return True

    def settle(self, nodes: Collection[str]) -> None:
        """Wait until the interfaces that are set up on `nodes` carry packets (see _Builder.settle)."""
        builder = _Builder(self, _quiet)
        try:
            builder.settle(nodes)
        finally:
            builder.nl.close()

    def run_nft(self, scripts: dict[str, str]) -> None:
        """nft scripts in nodes' own namespaces (one transaction each; never the host's)."""
        by_ns = {self.namespace(node): script for node, script in scripts.items() if self.here(node)}
        kernel.in_namespaces(by_ns, lambda space: nft.run(by_ns[space], space))

    def sysctls(self, node: str) -> dict[str, str]:
        """The node's sysctls: its plan's, and on a server what its TCP does after idle."""
        values = self.plan.sysctls(node)
        if self.topology.nodes[node].is_server:
            values[SLOW_START_AFTER_IDLE] = str(int(self.spec.servers.tcp_slow_start_after_idle))
        return values

    def leaf(self, node: str, peer: str | None) -> kernel.Leaf | None:
        """The marking queue (links.discipline) of `node`'s link end towards `peer`, or None
        for the FIFO; its hard limit is that link's queue, its rate the link's."""
        links = self.spec.links
        if links.discipline.kind == "fifo":
            return None
        queue = links.queue if peer is None else self.topology.queue_of(node, peer, links.queue)
        rate = links.bandwidth if peer is None else int(self.topology.rate_of(node, peer, links.bandwidth))
        return functools.partial(queues.leaf_message, discipline=links.discipline, packets=queue, mtu=links.mtu,
                                 rate_bps=rate)

    def route_metrics(self, node: str) -> kernel.RouteMetrics | None:
        """What a node's data routes tell TCP (congestion control, initial windows): servers'
        only (switches and routers forward, they do not end connections)."""
        if not self.topology.nodes[node].is_server:
            return None
        servers = self.spec.servers
        # DCTCP reacts to ECN marks only, and the kernel negotiates ECN for it on its own; the
        # route says so for every connection over it, as a data center's hosts are set up
        ecn = servers.tcp_congestion == "dctcp" if servers.ecn is None else servers.ecn
        return kernel.RouteMetrics(servers.tcp_congestion, servers.initcwnd, ecn=ecn)

    def status(self) -> dict:
        from orchestrator.emulation.status import lab_status

        return lab_status(self)


def management_subnet(spec: LabSpec, topology: Topology):
    """The lab's management subnet: the one asked for, if it overlaps no network of this
    host (a host route to it would be shadowed, or shadow ours); else the first free one."""
    host = kernel.root_networks_on()
    labs = []
    for other in LabState.all():
        subnet = other.state().get("mgmt_subnet")
        if subnet and other.name != spec.name:
            labs.append((ipaddress.IPv4Network(subnet), other.name))
    wanted = spec.management.subnet
    if wanted == "auto":
        return choose_mgmt_subnet(len(topology.servers), [n for n, _ in host] + [n for n, _ in labs])
    for network, device in host:
        if wanted.overlaps(network):
            raise TopologyError(
                f"management.subnet {wanted} overlaps {network} on {device or 'a route'} of this host: "
                "choose a subnet outside every host network (ip -4 route), or 'auto'"
            )
    for network, name in labs:
        if wanted.overlaps(network):
            raise TopologyError(
                f"management.subnet {wanted} overlaps {network}, the management network of lab {name}: "
                "choose another subnet, or 'auto'"
            )
    return wanted


class _Builder:
    """The steps of bring-up, each journalled before it acts."""

    def __init__(self, lab: Lab, progress: Progress, checkpoint: Callable[[], None] = lambda: None) -> None:
        self.lab = lab
        self.part = lab.part  # a host's share of a split lab: only its nodes, wires for links that leave it
        self.mine = lab.here
        self.plan = lab.plan
        self.spec = lab.spec
        self.topology = lab.topology
        self.here = [n for n in lab.topology.nodes if self.mine(n)]  # the nodes this machine builds
        self.servers_here = [s.name for s in lab.topology.servers if self.mine(s.name)]
        self.progress = progress
        self.checkpoint = checkpoint  # raises if the build must stop (a signal): safe points only
        self.nl = kernel.Netlink()
        self._ends: dict[str, list[str]] | None = None  # node → its interfaces that end links
        self._made = 0  # nodes whose namespace exists (progress of `nodes`)

    def build(self) -> None:
        steps = [self.nodes, self.open_netlink, self.sysctls, self.links, self.configure_nodes, self.management,
                 self.isolate]
        if self.spec.rdma == "softroce":
            steps.append(lambda: self.softroce(self.servers_here))
        steps.append(self.settle)
        try:
            for step in steps:
                self.checkpoint()
                step()
        finally:
            self.nl.close()

    def open_netlink(self) -> None:
        self.nl.open([None, *(self.plan.namespaces[node] for node in self.here)])

    def record(self, entries: list[Entry]) -> None:
        self.lab.state.record(entries)

    def nodes(self) -> None:
        """Every node's namespace (a container's for Docker servers), made by its runtime."""
        for runtime, nodes in by_runtime(self.plan, self.here):
            runtime.create(self, nodes)

    def made(self, stage: str, count: int) -> None:
        """`count` more nodes exist (runtimes report through this; called from starter threads)."""
        self._made += count
        self.progress(stage, self._made, len(self.topology.nodes))

    def sysctls(self) -> None:
        by_namespace = {self.plan.namespaces[n]: self.lab.sysctls(n) for n in self.here}
        kernel.in_namespaces(by_namespace, lambda ns: kernel.write_sysctls(by_namespace[ns], OPTIONAL_SYSCTLS))
        for ns in by_namespace:
            kernel.set_up(self.nl, ns, "lo")
        self.progress("sysctls", 1, 1)

    def links(self) -> None:
        """Every veth pair, created straight inside its two namespaces, both ends up."""
        ns, queue, mtu = self.plan.namespaces, self.spec.links.queue, self.spec.links.mtu
        gso = kernel.BIG_GSO_BYTES if features.kernel_features()["big_tcp"] else None

        def make(nl: kernel.Netlink, link) -> None:
            kernel.add_veth(nl, ns[link.a.node], link.a.interface, ns[link.b.node], link.b.interface, queue,
                            mtu=mtu, gso_bytes=gso)
            kernel.set_up(nl, ns[link.b.node], link.b.interface)

        local = [link for link in self.topology.links if self.mine(link.a.node) and self.mine(link.b.node)]
        kernel.in_workers(local, make, lambda done, total: self.progress("links", done, total),
                          checkpoint=self.checkpoint)
        if self.part is not None:
            self.wire_ends()

    def wire_ends(self) -> None:
        """This host's end of each wire to another host: a VXLAN device made here, on the
        underlay, and created inside its node's namespace under the link end's name."""
        part, ns = self.part, self.plan.namespaces
        ends = [(wire, end, here, there) for wire in part.wires for end, here, there in wire.ends()
                if here == part.host]
        self.record([Entry("wire", end.interface, {"netns": ns[end.node], "vni": wire.vni}) for wire, end, _, _ in ends])
        for wire, end, here, there in ends:
            kernel.add_vxlan(self.nl, None, end.interface, wire.vni, part.underlay[here], part.underlay[there],
                             ns[end.node], self.spec.links.queue, self.spec.links.mtu)
            kernel.set_up(self.nl, ns[end.node], end.interface)

    def configure_nodes(self) -> None:
        """Per node, in its own namespace: bridge and ports, addresses, shaping of its link
        ends, routes. A node's whole configuration stays with one worker."""
        kernel.in_workers(
            self.here, self.configure_node,
            lambda done, total: self.progress("configuring nodes", done, total), checkpoint=self.checkpoint,
        )

    def link_ends(self, name: str) -> list[str]:
        if self._ends is None:
            self._ends = {}
            for link in self.topology.links:
                for end in (link.a, link.b):
                    self._ends.setdefault(end.node, []).append(end.interface)
        return self._ends.get(name, [])

    def configure_node(self, nl: kernel.Netlink, name: str) -> None:
        self.configure_interfaces(nl, name)
        metrics = self.lab.route_metrics(name)
        for route in self.topology.routes_of(name):
            kernel.add_route(nl, self.plan.namespaces[name], route.prefix, [(h.dev, h.via) for h in route.nexthops],
                             metrics=metrics)

    def configure_interfaces(self, nl: kernel.Netlink, name: str, links_up: bool = True) -> None:
        """A node's bridge and ports, addresses and the shaping of its link ends. With its
        links down, the subnet routes get their route metrics when they come up."""
        node, space, links = self.topology.nodes[name], self.plan.namespaces[name], self.spec.links
        metrics = self.lab.route_metrics(name) if links_up else None
        if BRIDGE in node.interfaces:
            kernel.add_bridge(nl, space, BRIDGE)
        for iface in node.interfaces.values():
            if iface.master:
                kernel.enslave(nl, space, iface.name, iface.master)
            if iface.address is not None:
                kernel.add_address(nl, space, iface.name, iface.address, metrics)
        for ifname in self.link_ends(name):
            peer = self.topology.peer(Endpoint(name, ifname))
            if peer is None:
                kernel.shape(nl, space, ifname, links.bandwidth, links.queue, links.delay, links.jitter, links.loss,
                             self.lab.leaf(name, None), links.mtu)
                continue
            t, there = self.topology, peer.node
            kernel.shape(nl, space, ifname, int(t.rate_of(name, there, links.bandwidth)),
                         t.queue_of(name, there, links.queue), t.delay_of(name, there, links.delay), links.jitter,
                         links.loss, self.lab.leaf(name, there), links.mtu)

    def management(self) -> None:
        """The root namespace's side as the plan lays it out (bridges with isolated ports, the
        gateway on each, routes to the servers of all but the first), every root link in the
        lab's netdev group; then each server's mgmt0. Both sides get permanent ARP entries."""
        plan, nl, group = self.plan, self.nl, self.plan.link_group
        gateway, gateway_mac = plan.mgmt_gateway, plan.mgmt_gateway_mac
        self.record([Entry("host_link", name, {}) for name in plan.root_links()])
        for bridge in plan.mgmt_bridges():
            kernel.add_bridge(nl, None, bridge, group=group, mac=gateway_mac)
        nl.refresh(None)
        kernel.add_address(nl, None, plan.mgmt_bridge, gateway)
        for bridge in plan.mgmt_bridges()[1:]:  # the gateway again, without the subnet's route
            kernel.add_address(nl, None, bridge, ipaddress.IPv4Interface(gateway.ip))
        for block, bridge in plan.mgmt_routes:
            kernel.add_route(nl, None, block, [(bridge, None)], source=gateway.ip)

        def attach(nl: kernel.Netlink, server: str) -> None:
            host_if, address = plan.mgmt[server]
            ns, mac, bridge = plan.namespaces[server], plan.mgmt_macs[server], plan.mgmt_master[server]
            kernel.add_veth(nl, None, host_if, ns, MGMT_IF, 1000, group=group, master=bridge, peer_mac=mac)
            kernel.isolate_port(nl, None, host_if)
            kernel.add_neighbour(nl, None, bridge, address.ip, mac)
            self.mgmt_inside(nl, server)

        # seven requests a server, ~1 ms of pyroute2 each: spread over the cores
        kernel.in_workers(self.servers_here, attach,
                          lambda done, total: self.progress("management", done, total), checkpoint=self.checkpoint)

    def mgmt_inside(self, nl: kernel.Netlink, server: str) -> None:
        """The server's side of its management port: up, addressed, the gateway's MAC known."""
        plan, ns = self.plan, self.plan.namespaces[server]
        kernel.set_up(nl, ns, MGMT_IF)
        kernel.add_address(nl, ns, MGMT_IF, plan.mgmt[server][1])
        kernel.add_neighbour(nl, ns, MGMT_IF, plan.mgmt_gateway.ip, plan.mgmt_gateway_mac)

    def settle(self, nodes: Collection[str] | None = None, timeout: float = 10.0) -> None:
        """Wait until every lab interface (of `nodes`: every one that is set up) is
        operationally up.

        The kernel activates a new veth's queue from its link-watch work, up to a second
        after carrier appears; packets sent before that vanish. A lab is ready only after.
        """
        wanted: dict[str, set[str]] = {}
        for node in self.topology.nodes.values():
            if (nodes is not None and node.name not in nodes) or not self.mine(node.name):
                continue
            names = set(node.interfaces)
            if node.is_server:
                names.add(MGMT_IF)
            wanted[self.plan.namespaces[node.name]] = names
        # a VXLAN wire (a link between hosts) has no carrier to report: its operational state
        # stays UNKNOWN once up
        host_of = self.part.host_of if self.part else {}
        wires = {(self.plan.namespaces[end.node], end.interface) for link in self.topology.links
                 if host_of and host_of[link.a.node] != host_of[link.b.node] for end in (link.a, link.b)}

        def ready(ns: str, name: str, state: dict) -> bool:
            return state.get("state") == "UP" or ((ns, name) in wires and state.get("up")) \
                or (nodes is not None and not state.get("up"))

        deadline = time.monotonic() + timeout
        while wanted:
            for ns in list(wanted):  # a namespace found ready is not looked at again
                states = kernel.links_in(self.nl, ns)
                if all(ready(ns, name, states.get(name, {})) for name in wanted[ns]):
                    del wanted[ns]
            if not wanted:
                break
            if time.monotonic() > deadline:
                raise EmulationError(f"interfaces still down after {timeout:.0f} s in {', '.join(sorted(wanted)[:3])}")
            time.sleep(0.05)
        self.progress("ready", 1, 1)

    def softroce(self, only: Collection[str] | None = None) -> None:
        """An rxe device on every data NIC of every server, or of the servers named in
        `only` (`rdma link add` in its namespace)."""
        plan = self.plan
        entries, commands = [], []
        for server in self.topology.servers:
            if only is not None and server.name not in only:
                continue
            for device, netdev in softroce.devices(plan.id, server).items():
                entries.append(Entry("rxe", device, {"netns": plan.namespaces[server.name]}))
                commands.append((plan.namespaces[server.name], device, netdev))
        self.record(entries)
        for ns, device, netdev in commands:
            softroce.add(ns, device, netdev)
        self.progress("soft-RoCE", len(commands), len(commands))

    def isolate(self) -> None:
        """Servers reach neither each other nor the host over management (see isolation)."""
        self.record([isolation.journal_entry(self.plan)])
        if self.part is None:
            isolation.apply(self.plan)
        else:  # the orchestrator is elsewhere: this host forwards its calls onto the management bridge
            kernel.write_sysctls({"net.ipv4.ip_forward": "1"})
            part = self.part
            here = part.underlay.get(part.host)
            wires = isolation.WirePeers(
                tuple(sorted(w.vni for w in part.wires if part.host in w.hosts)),
                tuple(sorted({a for h, a in part.underlay.items() if h != part.host and a != here})))
            isolation.apply(self.plan, self.servers_here, wires)
        self.progress("isolation", 1, 1)
