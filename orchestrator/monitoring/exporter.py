"""The fabric exporter: every link direction of a live lab, read from the kernel at each scrape.

    python -m orchestrator.monitoring.exporter LAB --port PORT   (started by `testbed monitor up`)

One process per lab, serving 127.0.0.1:PORT. Per link direction (`link="a→b"`, `src`, `dst`,
the transmitting end's counters): bytes and packets sent, the root qdisc's drops,
overlimits and backlog, the ECN marks of a marking queue (links.discipline) and the backlog's
queueing delay, whether both ends are up, and the configured rate (the link's own, if it has one). Counters come
from netlink dumps on raw sockets opened inside each namespace (emulation.kernel): one
RTM_GETLINK and one RTM_GETQDISC dump per namespace per scrape, no `tc` or `ip` parsing.
Series carry no `lab`: Prometheus adds it from the target (prometheus.py). Each direction
also carries the topology's place of its link: `tier` (the layers it joins,
or the BCube level / torus dimension it serves) and `pod` where the topology has pods.

Per server, the CPU seconds and resident memory of the processes in its namespace (a
container's are in its namespace too), and the host's busy and idle CPU seconds: what a
fidelity verdict needs to tell a network effect from an overloaded machine. The lab's faults
(faults/, logged in its state) as a gauge per target while in effect and counts of their
phases: Grafana's fault annotations. A thread keeps
the agents' file_sd targets in step with the lab's deployed agents (targets.py).
"""

from __future__ import annotations

import argparse
import os
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from prometheus_client import generate_latest
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from orchestrator.emulation import kernel
from orchestrator.emulation.plan import namespace_name
from orchestrator.faults.actions import ACTIONS
from orchestrator.monitoring.targets import write_targets
from orchestrator.topology import Topology
from orchestrator.topology.model import Endpoint, Link

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# bottom to top, so a tier reads upwards (BiGraph's halves have no order but a fixed one)
LAYERS = ("host", "switch", "edge", "leaf", "aggregation", "spine", "core", "lower", "upper")
REFRESH_S = 1.0
IFF_LOWER_UP = 0x10000  # carrier, in the link message's header flags


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter | gauge
    help: str
    labels: tuple[str, ...]


LINK_LABELS = ("link", "src", "dst", "tier", "pod")
LINK_FAMILIES = (
    Family("testbed_link_transmit_bytes", "counter", "Bytes sent into a link direction", LINK_LABELS),
    Family("testbed_link_transmit_packets", "counter", "Packets sent into a link direction", LINK_LABELS),
    Family("testbed_link_qdisc_drops", "counter", "Packets the direction's queue dropped", LINK_LABELS),
    Family("testbed_link_qdisc_overlimits", "counter", "Times the direction's shaper held a packet back",
           LINK_LABELS),
    Family("testbed_link_qdisc_backlog_bytes", "gauge", "Bytes queued in the direction", LINK_LABELS),
    Family("testbed_link_qdisc_ecn_marks", "counter", "Packets the direction's queue marked CE (links.discipline "
           "red, codel or fq_codel)", LINK_LABELS),
    Family("testbed_link_queue_delay_seconds", "gauge", "The direction's backlog over its rate: how long a packet "
           "joining the queue now waits", LINK_LABELS),
    Family("testbed_link_up", "gauge", "1 when both ends of the link are up with carrier", LINK_LABELS),
    Family("testbed_link_rate_bytes_per_second", "gauge", "Configured rate of the direction", LINK_LABELS),
)
SERVER_CPU = Family("testbed_server_cpu_seconds", "counter", "CPU seconds of the processes in a server",
                    ("node",))
SERVER_MEMORY = Family("testbed_server_memory_bytes", "gauge", "Resident memory of the processes in a server",
                       ("node",))
HOST_CPU = Family("testbed_host_cpu_seconds", "counter", "CPU seconds of the host running the lab",
                  ("mode",))
HOST_CPUS = Family("testbed_host_cpus", "gauge", "CPUs of the host running the lab", ())
FAULT_ACTIVE = Family("testbed_fault_active", "gauge", "1 while a fault is in effect on its target, 0 after",
                      ("action", "target"))
FAULT_EVENTS = Family("testbed_fault_events", "counter", "Faults applied and undone on the lab, by action",
                      ("action", "phase"))
SCRAPE = Family("testbed_fabric_scrape_seconds", "gauge", "Time the exporter took to read the fabric", ())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def link_place(topology: Topology, link: Link) -> tuple[str, str]:
    """(tier, pod) of a link: "host-edge", "aggregation-core", "lower-upper" (BiGraph's
    halves)… by its ends' layers, "level1" for the BCube level or torus dimension its NIC
    serves; the pod of the end that has one, or ""."""
    def level(end: Endpoint) -> int | None:
        iface = topology.nodes[end.node].interfaces.get(end.interface)
        return iface.level if iface is not None else None

    def layer(end: Endpoint) -> str:
        node = topology.nodes[end.node]
        return "host" if node.is_server else str(node.attrs.get("layer", node.attrs.get("half", node.role)))

    levels = [lv for lv in (level(link.a), level(link.b)) if lv is not None]
    if levels:
        tier = f"level{levels[0]}"
    else:
        ends = sorted((layer(link.a), layer(link.b)), key=lambda l: LAYERS.index(l) if l in LAYERS else len(LAYERS))
        tier = "-".join(ends)
    pods = [topology.nodes[n].attrs.get("pod") for n in link.nodes()]
    pod = next((str(p) for p in pods if p is not None), "")
    return tier, pod


def process_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds of the process and its reaped children, resident bytes)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/statm") as handle:
        resident = int(handle.read().split()[1])
    return sum(int(f) for f in fields[11:15]) / TICKS, resident * PAGE


def host_cpu() -> dict[str, float]:
    """The host's CPU seconds, all CPUs together: idle (idle + iowait), busy (user to softirq)
    and steal (time a virtual machine's hypervisor gave its CPUs to others: neither idle nor
    busy, so an idle share alone does not show a machine whose host is oversubscribed)."""
    with open("/proc/stat") as handle:
        ticks = [int(v) for v in handle.readline().split()[1:9]] + [0]  # steal: a kernel that has it
    idle, busy = ticks[3] + ticks[4], sum(ticks[:7]) - ticks[3] - ticks[4]
    return {"idle": idle / TICKS, "busy": busy / TICKS, "steal": ticks[7] / TICKS}


def idle_share(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The idle share of the CPU between two `host_cpu()` readings (None: no time between)."""
    idle, busy = (after[mode] - before[mode] for mode in ("idle", "busy"))
    return idle / (idle + busy) if idle + busy > 0 else None


def steal_share(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The share of the CPU's time a hypervisor held between two `host_cpu()` readings (None:
    no time between, or a reading without steal)."""
    if "steal" not in before or "steal" not in after:
        return None
    idle, busy, steal = (after[mode] - before[mode] for mode in ("idle", "busy", "steal"))
    return steal / (idle + busy + steal) if idle + busy + steal > 0 else None


class FabricCollector(Collector):
    """Reads the lab's links at every collect(); one scrape at a time."""

    def __init__(self, lab) -> None:
        self.lab = lab
        self.lock = threading.Lock()
        self.nl: kernel.Netlink | None = None
        # per link, its two directions: (transmitting end, label values)
        # of a lab split over hosts, each host's exporter gives the directions its nodes send
        # on, and the servers it runs (Prometheus tells the hosts apart by a `host` label)
        self.directions = []
        for link in lab.topology.links:
            place = link_place(lab.topology, link)
            self.directions.append((link, [
                (tx, (f"{tx.node}→{rx.node}", tx.node, rx.node, *place))
                for tx, rx in ((link.a, link.b), (link.b, link.a)) if lab.here(tx.node)]))
        self.label_text: dict[tuple, str] = {}
        self.servers = {lab.plan.namespaces[s.name]: s.name for s in lab.topology.servers if lab.here(s.name)}
        self.known: dict[tuple[str, int], tuple[str, int]] = {}  # (ns, ifindex) → (name, STATS64 offset)
        # a restarted container's interfaces move to a new namespace under the old name
        self.containers = [lab.plan.namespaces[s.name] for s in lab.topology.servers
                           if lab.runtime_of(s.name).containerised]
        self.identity: dict[str, int] = {}  # container namespace → the inode its name held when read

    def _read(self) -> tuple[dict, dict]:
        """(node → interface → facts, (node, interface) → root qdisc stats) of live nodes."""
        live = set(kernel.list_namespaces(namespace_name(self.lab.name, "")))
        if self.nl is None:
            self.nl = kernel.Netlink()
        self._follow_restarts(live)
        interfaces, queues = {}, {}
        for node, ns in self.lab.plan.namespaces.items():
            if ns not in live:
                continue
            by_index = kernel.root_qdiscs(self.nl, ns)
            interfaces[node] = {}
            for message in self.nl.dump(ns, kernel.GET_LINKS, f"links of {ns}"):
                name, facts = self._link(ns, message)
                interfaces[node][name] = facts
                if (index := kernel.link_index(message)) in by_index:
                    queues[(node, name)] = by_index[index]
        return interfaces, queues

    def _follow_restarts(self, live: set[str]) -> None:
        """Reopen the socket of a container namespace whose name now holds another one."""
        for ns in self.containers:
            if ns not in live:
                continue
            try:
                inode = os.stat(kernel.netns_path(ns)).st_ino
            except FileNotFoundError:
                continue
            if self.identity.setdefault(ns, inode) != inode:
                self.identity[ns] = inode
                self.nl.forget(ns)
                self.known = {key: place for key, place in self.known.items() if key[0] != ns}

    def _link(self, ns: str, message: bytes) -> tuple[str, dict]:
        """(name, {up, carrier, tx_bytes, tx_packets}) of one link message. A full parse walks
        ~30 attributes in Python (most of a scrape's time on 208 namespaces): the name is
        kept by index, the flags are in the header, and the counters' place is remembered."""
        key = (ns, kernel.link_index(message))
        (flags,) = struct.unpack_from("=I", message, 24)
        known = self.known.get(key)
        stats = kernel.attribute_at(message, known[1], kernel.IFLA_STATS64) if known else None
        if stats is None:
            name, _ = kernel.parse_link(message)
            offset = kernel.attribute_offset(message, 32, kernel.IFLA_STATS64)
            if offset is None:
                return name, {"up": bool(flags & kernel.IFF_UP), "carrier": False, "tx_bytes": 0, "tx_packets": 0}
            self.known[key] = known = (name, offset)
            stats = kernel.attribute_at(message, offset, kernel.IFLA_STATS64)
        _, tx_packets, _, tx_bytes = struct.unpack_from("=4Q", stats)
        return known[0], {"up": bool(flags & kernel.IFF_UP), "carrier": bool(flags & IFF_LOWER_UP),
                          "tx_bytes": tx_bytes, "tx_packets": tx_packets}

    def close(self) -> None:
        """Close the netlink sockets (one per namespace) of a collector used for a while."""
        with self.lock:
            if self.nl is not None:
                self.nl.close()
                self.nl = None

    def link_families(self) -> list[tuple[Family, list[tuple[tuple[str, ...], float]]]]:
        """The link directions' families alone, read now (what a run's before/after needs)."""
        with self.lock:
            return self._links(*self._read())

    def snapshot(self) -> list[tuple[Family, list[tuple[tuple[str, ...], float]]]]:
        """Every family with its samples (label values, value), read now."""
        started = time.perf_counter()
        families = self.link_families() + self._servers() + self._faults()
        families.append((SCRAPE, [((), time.perf_counter() - started)]))
        return families

    def collect(self) -> Iterator:
        for family, samples in self.snapshot():
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.help, labels=family.labels)
            for values, value in samples:
                metric.add_metric(values, value)
            yield metric

    def exposition(self) -> bytes:
        """The snapshot in Prometheus's text format, as prometheus_client writes it, with each
        series' label string made once: the library checks and escapes every label of every
        sample at every scrape, 130 ms for fattree,8's 5,600 series (goal: 100 ms and 5 % of
        a core). tests/netns/test_monitoring.py checks both agree, and promtool."""
        lines = []
        for family, samples in self.snapshot():
            name = family.name + ("_total" if family.kind == "counter" else "")
            lines.append(f"# HELP {name} {family.help}\n# TYPE {name} {family.kind}\n")
            for values, value in samples:
                key = (family.labels, values)
                if (labels := self.label_text.get(key)) is None:
                    pairs = ",".join(f'{label}="{_escape(v)}"' for label, v in sorted(zip(family.labels, values)))
                    labels = self.label_text[key] = "{" + pairs + "}" if pairs else ""
                lines.append(f"{name}{labels} {floatToGoString(value)}\n")
        return "".join(lines).encode()

    def _servers(self) -> list:
        cpu, memory = [], []
        for ns, pids in kernel.pids_by_namespace(self.servers).items():
            seconds, resident = 0.0, 0
            for pid in pids:
                try:
                    used, rss = process_usage(pid)
                except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
                    continue  # ended between the walk and the read
                seconds, resident = seconds + used, resident + rss
            cpu.append(((self.servers[ns],), seconds))
            memory.append(((self.servers[ns],), resident))
        host = [((mode,), seconds) for mode, seconds in host_cpu().items()]
        return [(SERVER_CPU, cpu), (SERVER_MEMORY, memory), (HOST_CPU, host), (HOST_CPUS, [((), os.cpu_count() or 1)])]

    def _faults(self) -> list:
        """From the lab's fault log (LabState.fault_events, cached on its size and mtime)."""
        active: dict[tuple[str, str], float] = {}
        # every action's counters from 0: a series born at 1 shows no increase to rate() or
        # to Grafana's annotations, so the first fault would go unmarked
        events: dict[tuple[str, str], int] = {(name, phase): 0 for name in ACTIONS for phase in ("applied", "undone")}
        for fault in self.lab.state.fault_events():
            on = fault["applied"] is not None and fault["undone"] is None
            key = (fault["action"], fault["target"])
            active[key] = max(active.get(key, 0.0), float(on))
            for phase in ("applied", "undone"):
                if fault[phase] is not None:
                    events[(fault["action"], phase)] = events.get((fault["action"], phase), 0) + 1
        return [(FAULT_ACTIVE, list(active.items())), (FAULT_EVENTS, list(events.items()))]

    def _links(self, interfaces: dict, queues: dict) -> list:
        sent, packets, drops, over, backlog, marks, delay, up, rate = ([] for _ in range(9))
        topology, default_bps = self.lab.topology, self.lab.spec.links.bandwidth
        for link, directions in self.directions:
            ends = {(e.node, e.interface): interfaces.get(e.node, {}).get(e.interface)
                    for e in (link.a, link.b) if self.lab.here(e.node)}  # a wire's far end is another host's
            state = float(all(e is not None and e["up"] and e["carrier"] for e in ends.values()))
            for tx, values in directions:
                facts = ends[(tx.node, tx.interface)]
                configured = topology.rate_of(values[1], values[2], default_bps) / 8  # a link's own rate, if any
                up.append((values, state))
                rate.append((values, configured))
                if facts is None:
                    continue
                sent.append((values, facts["tx_bytes"]))
                packets.append((values, facts["tx_packets"]))
                queue = queues.get((tx.node, tx.interface))
                if queue:
                    drops.append((values, queue["drops"]))
                    over.append((values, queue["overlimits"]))
                    backlog.append((values, queue["backlog"]))
                    marks.append((values, queue["marks"]))
                    delay.append((values, queue["backlog"] / configured))
        return list(zip(LINK_FAMILIES, (sent, packets, drops, over, backlog, marks, delay, up, rate)))


def keep_targets(lab, path: Path) -> None:
    """Rewrite the agents' file_sd targets whenever the lab's deployed agents change."""
    while True:
        time.sleep(REFRESH_S)
        try:
            write_targets(lab, path)
        except OSError:
            pass  # the lab is being removed; its next state says what to do


def main() -> None:
    from orchestrator.emulation import Lab

    parser = argparse.ArgumentParser(description="Prometheus exporter of a live lab's links")
    parser.add_argument("lab")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--listen", default="127.0.0.1", help="address to serve on (a host of a split lab: its "
                        "underlay address, where the orchestrator's Prometheus scrapes)")
    parser.add_argument("--targets", type=Path, help="the agents' file_sd file to keep up to date")
    args = parser.parse_args()
    lab = Lab.attach(args.lab)
    serve(FabricCollector(lab), args.port, args.listen)
    if args.targets is not None:
        keep_targets(lab, args.targets)  # until the process is stopped
    else:
        threading.Event().wait()  # serve until stopped


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(collector: FabricCollector, port: int, address: str = "127.0.0.1") -> ThreadingHTTPServer:
    """GET /metrics on address:port: the fabric, then this process's own metrics (the
    library's process and platform collectors)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = collector.exposition() + generate_latest(REGISTRY)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # one line a second otherwise
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    main()
