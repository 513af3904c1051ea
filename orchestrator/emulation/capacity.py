"""Will a lab fit on this host? Decided before anything is built, one line per refusal.

The limits that bite, each found by building labs on this project's machines (2 cores,
24 GB, Linux 6.18):

- Bridge ports: a Linux bridge takes at most 1,023 (BR_MAX_PORTS, fixed in the kernel). The
  management network splits itself (plan); a switch of the lab itself cannot.
- The neighbour (ARP) table: ONE table for every namespace of the host, learnt entries
  capped at net.ipv4.neigh.default.gc_thresh3 (1,024 by default); beyond it new neighbours
  are not resolved and packets to them dropped. fattree,12 (432 servers) needs 2,592 for its
  routes: pinging all pairs from every 6th server, 25,438 of 31,032 pairs failed at the
  default limit. The management network does not count (permanent entries, see plan).
- Open files: the builder holds a netlink socket per namespace, and each forked worker
  those plus its own sockets and namespace handles (fattree,16: 2,387 at the peak, 1.8 per
  namespace); a shell's soft limit of 1,024 stopped fattree,8 (208 namespaces) with
  EMFILE. `require` raises the soft limit to what the build needs (never beyond the hard
  one), which is the orchestrator's own business, and refuses only when the hard limit is
  too low.
- Memory, against MemAvailable: per namespace, shaped link, management port, route and
  container, measured (see the constants).
- Threads, against kernel.pid_max (32,768 here) and kernel.threads-max: a lab starts none,
  but its agents run a thread per connection at each end (experiment/plan.py counts them
  per run: a mesh of 170 would need about 59,000); `tasks_free` is what a run may start.

Looked at and not biting here: user.max_net_namespaces (96,364), fs.mount-max (100,000; a
lab mounts one file per namespace).

`estimate(topology, runtime)` is pure, `host_limits()` reads this host, `refusal(need,
limits)` is the first limit exceeded as a one-line message, and `require(spec, topology)`
is what `Lab.up` calls. `sysctl_conf()` is what setup.sh writes to /etc/sysctl.d so that
the README's labs (up to fattree,16) fit a fresh host: the same figures `up` asks for.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator.emulation.plan import BRIDGE_MAX_PORTS
from orchestrator.errors import HostLimit, TopologyError
from orchestrator.topology import Topology

GC_THRESH3 = "net.ipv4.neigh.default.gc_thresh3"

# Memory per object. This cgroup's accounting gives the kernel's charged part (a namespace
# 94 KiB, a veth pair 68, HTB on both ends 11, a management port 69, a route 170 bytes);
# the figures below are rounded up to match whole labs, measured as the drop of MemAvailable
# (bench/lab_bringup.py and scratch runs, noisy on a shared machine): fattree,12 280-380 MiB
# (estimate 370), fattree,16 747-852 (775), bcube,32,1 with its 2 million routes 1,358
# (1,347), bcube,4,1 on Docker 158-285 with 16 containers (166).
NAMESPACE_KIB = 160  # a network namespace, loopback up, sysctls written
LINK_KIB = 120  # a data link: a veth pair, both ends HTB + class + FIFO, their addresses
MGMT_PORT_KIB = 90  # a management veth pair, its bridge port and two ARP entries
ROUTE_BYTES = 384  # a static route
CONTAINER_MIB = 6  # a Docker server: containerd-shim, runc's init, the container's sleep
# The orchestrator itself while building: Python, pyroute2 and one socket per namespace.
PROCESS_MIB, PROCESS_KIB_PER_NAMESPACE = 60, 40
MEMORY_SHARE = 0.9  # of MemAvailable a lab may take; the rest keeps the host usable

# Open files at the build's peak (a worker's), with room: 1.8 per namespace measured at
# fattree,12 and fattree,16; plus what any Python process holds.
FILES_PER_NAMESPACE, FILES_BASE = 3, 64
# Netlink keeps its descriptors at or above FD_SETSIZE when the limit allows (kernel.py),
# so the soft limit is raised to cover that floor too.
FD_FLOOR = 1024


@dataclass(frozen=True)
class Need:
    """What a lab takes of this host's limits."""

    lab: str
    namespaces: int
    links: int
    servers: int  # one management port each
    containers: int
    widest_switch: tuple[str, int]  # the lab switch with the most bridge ports, and how many
    neighbours: int  # learnt ARP entries its routes need once traffic crosses every link
    neighbours_all_pairs: int  # ... when every neighbour on a segment talks to every other
    open_files: int
    memory_mib: int


@dataclass(frozen=True)
class HostLimits:
    gc_thresh3: int
    open_files_soft: int
    open_files_hard: int  # resource.RLIM_INFINITY (-1) for none
    mem_available_mib: int
    tasks_free: int = 1 << 30  # threads this host can still start (pid_max, threads-max less running)


def estimate(topology: Topology, runtime: str, lab: str = "this lab") -> Need:
    """What a lab of `topology` on `runtime` (netns | docker) needs; pure."""
    namespaces = len(topology.nodes)
    servers = len(topology.servers)
    containers = servers if runtime == "docker" else 0
    links = len(topology.links)
    routed, all_pairs = neighbour_entries(topology)
    memory_kib = (
        namespaces * NAMESPACE_KIB + links * LINK_KIB + servers * MGMT_PORT_KIB + route_count(topology) * ROUTE_BYTES // 1024
        + (PROCESS_MIB * 1024 + namespaces * PROCESS_KIB_PER_NAMESPACE)
        + containers * CONTAINER_MIB * 1024
    )
    return Need(
        lab=lab, namespaces=namespaces, links=links, servers=servers, containers=containers,
        widest_switch=widest_switch(topology), neighbours=routed, neighbours_all_pairs=all_pairs,
        open_files=FILES_BASE + FILES_PER_NAMESPACE * namespaces, memory_mib=-(-memory_kib // 1024),
    )


def route_count(topology: Topology) -> int:
    """Static routes the lab installs, from the first server's and first switch's tables
    (the kinds are symmetric enough; computing every table would take a minute for
    bcube,32,1, whose servers hold 1,984 routes each, 2 million in all)."""
    count = 0
    for group in (topology.servers, topology.switches):
        if group:
            count += len(topology.routes_of(group[0].name)) * len(group)
    return count


def widest_switch(topology: Topology) -> tuple[str, int]:
    """(node, ports) of the bridge inside the lab with the most ports; ("", 0) if none."""
    widest = ("", 0)
    for node in topology.nodes.values():
        ports: dict[str, int] = {}
        for iface in node.interfaces.values():
            if iface.master:
                ports[iface.master] = ports.get(iface.master, 0) + 1
        for count in ports.values():
            if count > widest[1]:
                widest = (node.name, count)
    return widest


def neighbour_entries(topology: Topology) -> tuple[int, int]:
    """(routed, all pairs): ARP entries the lab's fabric learns, summed over its L2 segments
    (a link, or the links of one bridge, with the addressed interfaces on it).

    Routed: a forwarding node resolves every other member of its segments (it forwards to,
    or delivers to, any of them); any other node resolves the forwarders on its segments (its
    gateways), or every other member where there is none. All pairs: every member resolves
    every other, which is what servers that share a LAN with a router add when they talk
    directly. fattree,8: 768 routed, 1,152 all pairs; an all-pairs ping peaked at 992 learnt
    entries (the kernel recycles idle ones), passing at the default limit of 1,024.
    """
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(key: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def join(a: tuple[str, str], b: tuple[str, str]) -> None:
        parent[root(a)] = root(b)

    for link in topology.links:
        join((link.a.node, link.a.interface), (link.b.node, link.b.interface))
    for node in topology.nodes.values():
        for iface in node.interfaces.values():
            if iface.master:
                join((node.name, iface.name), (node.name, iface.master))
    segments: dict[tuple[str, str], list[bool]] = {}  # segment → `forwards` of each member
    for node in topology.nodes.values():
        for iface in node.interfaces.values():
            if iface.address is not None:
                segments.setdefault(root((node.name, iface.name)), []).append(node.forwards)
    routed = all_pairs = 0
    for members in segments.values():
        size, forwarders = len(members), sum(members)
        all_pairs += size * (size - 1)
        others = size - forwarders
        routed += forwarders * (size - 1) + others * (forwarders if forwarders else size - 1)
    return routed, all_pairs


def host_limits() -> HostLimits:
    """This host's limits as they stand (the neighbour table's is the root namespace's, the
    one every namespace shares)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HostLimits(
        gc_thresh3=int(_proc(GC_THRESH3, "1024")),
        open_files_soft=soft, open_files_hard=hard,
        mem_available_mib=_mem_available_kib() // 1024,
        tasks_free=_tasks_free(),
    )


def machine_id() -> str:
    """Which machine this is, whatever network namespace asks: the kernel's boot id."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        import socket

        return socket.gethostname()


def _tasks_free() -> int:
    """Threads this host can still start: the lower of kernel.pid_max and kernel.threads-max,
    less the tasks running now (/proc/loadavg's fourth field, running/total)."""
    limit = min(int(_proc("kernel.pid_max", "32768")), int(_proc("kernel.threads-max", "32768")))
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        running = 0
    return max(limit - running, 0)


def _proc(sysctl: str, default: str) -> str:
    try:
        return Path("/proc/sys", *sysctl.split(".")).read_text().strip()
    except OSError:
        return default


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def refusal(need: Need, host: HostLimits) -> HostLimit | TopologyError | None:
    """The first limit `need` exceeds on `host`, as the error to raise; None if it fits.
    Open files count against the hard limit: the soft one is raised (`raise_open_files`)."""
    switch, ports = need.widest_switch
    if ports > BRIDGE_MAX_PORTS:
        return TopologyError(
            f"switch {switch} of {need.lab} would have {ports:,} ports and a Linux bridge holds at most "
            f"{BRIDGE_MAX_PORTS:,} (BR_MAX_PORTS, fixed in the kernel): choose fewer servers per switch"
        )
    if need.neighbours > host.gc_thresh3:
        wanted = gc_thresh3_for(need)
        return HostLimit(
            f"{need.lab} needs {need.neighbours:,} neighbour (ARP) entries for its routes and up to "
            f"{need.neighbours_all_pairs:,} when every server talks to every other, but {GC_THRESH3} is "
            f"{host.gc_thresh3:,} (one table for every namespace; beyond it packets are dropped): run "
            f"`sysctl -w {GC_THRESH3}={wanted}` (in /etc/sysctl.d/ to keep it)"
        )
    if host.open_files_hard != resource.RLIM_INFINITY and need.open_files > host.open_files_hard:
        return HostLimit(
            f"{need.lab} needs about {need.open_files:,} open files while it is built ({FILES_PER_NAMESPACE} per "
            f"namespace), but this process may open at most {host.open_files_hard:,} (RLIMIT_NOFILE hard limit): "
            f"raise it to {_power_of_two(need.open_files)} (`ulimit -Hn` as root, LimitNOFILE= for a service, "
            "/etc/security/limits.conf for logins)"
        )
    if need.memory_mib > host.mem_available_mib * MEMORY_SHARE:
        what = f"{need.namespaces:,} namespaces, {need.links:,} links"
        if need.containers:
            what += f", {need.containers:,} containers"
        return HostLimit(
            f"{need.lab} needs about {need.memory_mib:,} MiB ({what}) and {host.mem_available_mib:,} MiB are "
            f"available (MemAvailable; a lab may take {MEMORY_SHARE:.0%}): stop other labs or containers, or "
            "choose a smaller lab"
        )
    return None


def open_files_target(need: Need, host: HostLimits) -> int | None:
    """The soft open-files limit the build should run with, or None to leave it: enough for
    the build above Netlink's floor, never beyond the hard limit."""
    wanted = FD_FLOOR + need.open_files
    if host.open_files_soft == resource.RLIM_INFINITY or host.open_files_soft >= wanted:
        return None
    if host.open_files_hard == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, host.open_files_hard) if host.open_files_hard > host.open_files_soft else None


def raise_open_files(need: Need, host: HostLimits) -> None:
    target = open_files_target(need, host)
    if target is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, host.open_files_hard))


def require(spec, topology: Topology) -> Need:
    """Refuse a lab this host cannot hold (one line naming the limit and what to change);
    otherwise raise this process's soft open-files limit as far as the build needs."""
    need = estimate(topology, spec.servers.runtime, f"lab {spec.name}")
    host = host_limits()
    error = refusal(need, host)
    if error is not None:
        raise error
    raise_open_files(need, host)
    return need


def gc_thresh3_for(need: Need) -> int:
    """The neighbour table's cap to set for a lab: room for every server talking to every
    other, rounded up to a power of two."""
    return _power_of_two(max(need.neighbours, need.neighbours_all_pairs))


# -- the host settings setup.sh writes ----------------------------------------------------
# The largest lab the README shows (`testbed topology fattree,16`; topologies/ holds smaller
# ones, and tests/unit/test_host_settings.py checks that each fits what this one needs).
EXAMPLE_LAB = "fattree,16"
SYSCTL_CONF = Path("/etc/sysctl.d/60-testbed.conf")


def host_settings(lab: str = EXAMPLE_LAB) -> dict[str, tuple[int, str]]:
    """sysctl → (value, why) that a netns build of `lab` (a shorthand) needs of this host."""
    from orchestrator.spec import lab_from_argument
    from orchestrator.topology import from_lab

    need = estimate(from_lab(lab_from_argument(lab)), "netns", lab)
    return {GC_THRESH3: (gc_thresh3_for(need), (
        f"one neighbour (ARP) table for every namespace: {lab} ({need.servers:,} servers) learns "
        f"{need.neighbours:,} entries for its routes and up to {need.neighbours_all_pairs:,} when every "
        "server talks to every other; beyond the cap packets are dropped, and `testbed up` refuses the lab"))}


def _current(sysctl: str) -> int | None:
    value = _proc(sysctl, "")
    return int(value) if value.isdigit() else None


def sysctl_conf(lab: str = EXAMPLE_LAB, current: Callable[[str], int | None] = _current) -> str:
    """The text of SYSCTL_CONF: each setting `lab` needs, with why, never lower than the
    host's `current` value (which is kept when higher)."""
    lines = ["# testbed's host settings, written by setup.sh (orchestrator/emulation/capacity.py,",
             f"# sysctl_conf) for the labs of its README, up to {lab}; applied with `sysctl -p` on this file.",
             "# A value is only ever raised: one this host already had higher is kept."]
    for name, (value, why) in host_settings(lab).items():
        have = current(name)
        if have is not None and have > value:
            why, value = f"{why} (needs {value:,}; this host had {have:,}, kept)", have
        lines += [f"# {why}", f"{name} = {value}"]
    return "\n".join(lines) + "\n"


def _power_of_two(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()
