"""The agent's Prometheus metrics, served on its management address only.

Names follow Prometheus conventions: `testbed_` prefix, base units (seconds, bytes), totals
for counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

GST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)


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
        self.sent = Counter("testbed_bytes_sent_total", "Gradient bytes sent", ["peer"], **labels)
        self.received = Counter("testbed_bytes_received_total", "Gradient bytes received", ["peer"], **labels)
        self.iterations = Counter("testbed_iterations_total", "Iterations completed", ["algorithm"], **labels)
        self.errors = Counter("testbed_errors_total", "Runs that failed", **labels)
        self.loss = Gauge("testbed_loss", "Training loss of the last iteration (real workload)", **labels)
        self.rank = Gauge("testbed_rank", "This agent's rank in the current run", **labels)
        self.node = node

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def count_bytes(self, peer: str, sent: int, received: int) -> None:
        if sent:
            self.sent.labels(peer).inc(sent)
        if received:
            self.received.labels(peer).inc(received)
