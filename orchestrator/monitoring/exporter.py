"""The fabric exporter: every link direction of a live lab, read from the kernel at each scrape.

    python -m orchestrator.monitoring.exporter LAB --port PORT   (started by `testbed monitor up`)

One process per lab, serving 127.0.0.1:PORT. Per link direction (`link="a→b"`, `src`, `dst`,
the transmitting end's counters): bytes and packets sent, the root qdisc's drops,
overlimits and backlog, whether both ends are up, and the configured rate. Counters come
from netlink dumps on raw sockets opened inside each namespace (emulation.kernel): one
RTM_GETLINK and one RTM_GETQDISC dump per namespace per scrape, no `tc` or `ip` parsing.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.emulation import kernel
from orchestrator.emulation.plan import namespace_name

class FabricCollector(Collector):
    """Reads the lab's links at every collect(); one scrape at a time."""

    def __init__(self, lab) -> None:
        self.lab = lab
        self.lock = threading.Lock()
        self.nl: kernel.Netlink | None = None

    def _read(self) -> tuple[dict, dict]:
        """(node → interface → facts, (node, interface) → root qdisc stats) of live nodes."""
        live = set(kernel.list_namespaces(namespace_name(self.lab.name, "")))
        if self.nl is None:
            self.nl = kernel.Netlink()
        interfaces, queues = {}, {}
        for node, ns in self.lab.plan.namespaces.items():
            if ns not in live:
                continue
            by_index = kernel.root_qdiscs(self.nl, ns)
            interfaces[node] = {}
            for message in self.nl.dump(ns, kernel.GET_LINKS, f"links of {ns}"):
                name, facts = kernel.parse_link(message)
                interfaces[node][name] = facts
                if (index := kernel.link_index(message)) in by_index:
                    queues[(node, name)] = by_index[index]
        return interfaces, queues

    def collect(self) -> Iterator:
        started = time.perf_counter()
        with self.lock:
            interfaces, queues = self._read()
        labels = ["lab", "link", "src", "dst"]
        sent = CounterMetricFamily("testbed_link_transmit_bytes", "Bytes sent into a link direction", labels=labels)
        packets = CounterMetricFamily("testbed_link_transmit_packets", "Packets sent into a link direction",
                                      labels=labels)
        drops = CounterMetricFamily("testbed_link_qdisc_drops", "Packets the direction's queue dropped", labels=labels)
        over = CounterMetricFamily("testbed_link_qdisc_overlimits", "Times the direction's shaper held a packet back",
                                   labels=labels)
        backlog = GaugeMetricFamily("testbed_link_qdisc_backlog_bytes", "Bytes queued in the direction", labels=labels)
        up = GaugeMetricFamily("testbed_link_up", "1 when both ends of the link are up with carrier", labels=labels)
        rate = GaugeMetricFamily("testbed_link_rate_bytes_per_second", "Configured rate of the direction",
                                 labels=labels)
        lab = self.lab.name
        configured = float(self.lab.spec.links.bandwidth) / 8
        for link in self.lab.topology.links:
            ends = [interfaces.get(e.node, {}).get(e.interface) for e in (link.a, link.b)]
            state = float(all(e is not None and e["up"] and e["carrier"] for e in ends))
            for tx, rx, facts in ((link.a, link.b, ends[0]), (link.b, link.a, ends[1])):
                values = [lab, f"{tx.node}→{rx.node}", tx.node, rx.node]
                up.add_metric(values, state)
                rate.add_metric(values, configured)
                if facts is None:
                    continue
                sent.add_metric(values, facts["tx_bytes"])
                packets.add_metric(values, facts["tx_packets"])
                queue = queues.get((tx.node, tx.interface))
                if queue:
                    drops.add_metric(values, queue["drops"])
                    over.add_metric(values, queue["overlimits"])
                    backlog.add_metric(values, queue["backlog"])
        took = GaugeMetricFamily("testbed_fabric_scrape_seconds", "Time the exporter took to read the fabric",
                                 labels=["lab"])
        took.add_metric([lab], time.perf_counter() - started)
        yield from (sent, packets, drops, over, backlog, up, rate, took)


def main() -> None:
    from orchestrator.emulation import Lab

    parser = argparse.ArgumentParser(description="Prometheus exporter of a live lab's links")
    parser.add_argument("lab")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    REGISTRY.register(FabricCollector(Lab.attach(args.lab)))
    start_http_server(args.port, addr="127.0.0.1")
    threading.Event().wait()


if __name__ == "__main__":
    main()
