"""The deepest each link direction's queue got while a point ran: what a point's results keep
of the backlog the exporter gives Prometheus every scrape (a run without monitoring has it too).

Read from the kernel by a background thread with the experiment's own collector (the
exporter's code: one qdisc dump per namespace); it reads at most `BUSY_SHARE` of the time, so
a lab whose read takes 100 ms is read every second and a big one less often.
"""

from __future__ import annotations

import threading
import time

BACKLOG = "testbed_link_qdisc_backlog_bytes"
DELAY = "testbed_link_queue_delay_seconds"
BUSY_SHARE = 0.1  # of one core, at most, spent reading
MIN_INTERVAL_S = 0.5


class QueuePeaks:
    """with QueuePeaks(collector) as peaks: ... — then peaks.result(): per direction with a
    backlog, its peak in bytes and in seconds of queueing, and how many reads there were."""

    def __init__(self, collector) -> None:
        self.collector = collector
        self.backlog: dict[str, float] = {}
        self.delay: dict[str, float] = {}
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="queue-peaks", daemon=True)

    def __enter__(self) -> "QueuePeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        interval = MIN_INTERVAL_S
        while not self._stop.wait(interval):
            started = time.monotonic()
            try:
                self.read_once()
            except Exception:  # a lab going down under a fault: the next read may work
                pass
            interval = max(MIN_INTERVAL_S, (time.monotonic() - started) / BUSY_SHARE)

    def read_once(self) -> None:
        for family, samples in self.collector.link_families():
            peaks = {BACKLOG: self.backlog, DELAY: self.delay}.get(family.name)
            if peaks is None:
                continue
            for values, value in samples:
                if value > peaks.get(values[0], 0.0):
                    peaks[values[0]] = value
        self.reads += 1

    def result(self) -> dict:
        order = sorted(self.backlog, key=lambda link: -self.backlog[link])
        return {"reads": self.reads, "peak_backlog_bytes": {link: int(self.backlog[link]) for link in order},
                "peak_queue_delay_s": {link: round(self.delay.get(link, 0.0), 6) for link in order}}
