"""The agent's Prometheus metrics, served on its management address only.

Names follow Prometheus conventions: `testbed_` prefix, base units (seconds, bytes), totals
for counters.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector, start_http_server,
)

# 1 ms to ~4 min in steps of 2^(1/4) (19 %): a lab's GSTs differ by less than the old 1-2.5-5
# buckets could tell (1.3 s and 1.75 s fell in one), and histogram_quantile is then within ~10 %
GST_BUCKETS = tuple(round(0.001 * 2 ** (i / 4), 6) for i in range(73))


class Metrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"registry": self.registry}
        self.gst = Histogram(
            "testbed_gst_seconds", "Gradient synchronisation time of one iteration",
            ["algorithm"], buckets=GST_BUCKETS, **labels,
        )
        self.compute = Histogram(
            "testbed_compute_seconds", "Compute time of one iteration", buckets=GST_BUCKETS, **labels
        )
        # by the NIC the plan sends from ("routed": the one the routes pick), for multi-NIC servers
        self.sent = Counter("testbed_bytes_sent_total", "Gradient bytes sent", ["peer", "nic"], **labels)
        self.received = Counter("testbed_bytes_received_total", "Gradient bytes received", ["peer"], **labels)
        self.iterations = Counter("testbed_iterations_total", "Iterations completed", ["algorithm"], **labels)
        self.errors = Counter("testbed_errors_total", "Runs that failed", **labels)
        self.loss = Gauge("testbed_loss", "Training loss of the last iteration (real workload)", **labels)
        self.rank = Gauge("testbed_rank", "This agent's rank in the current run", **labels)
        # what the recording rules turn GST into algbw and busbw with (NCCL-tests' definitions)
        self.gradient = Gauge("testbed_gradient_bytes", "Bytes of the gradient the current run reduces", **labels)
        self.workers = Gauge("testbed_workers", "Workers (ranks holding a gradient) in the current run", **labels)
        self.node = node
        # each peer's (and NIC's) counter, looked up once: counted per chunk, from reading and
        # writing threads, where labels() cost as much as the rest of the bookkeeping
        self._sent_to: dict[tuple[str, int], object] = {}
        self._received_from: dict[str, object] = {}
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, resident memory, fds
        PlatformCollector(registry=self.registry)

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def count_bytes(self, peer: str, sent: int, received: int, nic: int = -1) -> None:
        if sent:
            child = self._sent_to.get((peer, nic))
            if child is None:
                child = self._sent_to[peer, nic] = self.sent.labels(peer, str(nic) if nic >= 0 else "routed")
            child.inc(sent)
        if received:
            child = self._received_from.get(peer)
            if child is None:
                child = self._received_from[peer] = self.received.labels(peer)
            child.inc(received)
