"""QueuePeaks (monitoring/peaks.py): the deepest each direction's queue got while a point ran,
from a collector read in the background; a read that fails is skipped, not fatal."""

from __future__ import annotations

import threading

from orchestrator.monitoring import peaks
from orchestrator.monitoring.exporter import LINK_FAMILIES

FAMILY = {family.name: family for family in LINK_FAMILIES}


class Collector:
    """Backlogs that rise and fall: a→b peaks at 9000 bytes; b→a stays empty; one read fails."""

    def __init__(self) -> None:
        self.backlogs = iter([1500, 9000, "boom", 3000] + [0] * 10_000)
        self.read = threading.Event()
        self.reads = 0

    def link_families(self):
        backlog = next(self.backlogs)
        self.reads += 1
        if self.reads >= 5:
            self.read.set()
        if backlog == "boom":
            raise OSError("a namespace went away")
        rate = 1.25e6
        return [(FAMILY[peaks.BACKLOG], [(("a→b",), backlog), (("b→a",), 0)]),
                (FAMILY[peaks.DELAY], [(("a→b",), backlog / rate), (("b→a",), 0.0)]),
                (FAMILY["testbed_link_transmit_bytes"], [(("a→b",), 1e9)])]


def test_peaks_are_the_deepest_backlog_seen_per_direction(monkeypatch):
    monkeypatch.setattr(peaks, "MIN_INTERVAL_S", 0.001)
    collector = Collector()
    with peaks.QueuePeaks(collector) as watch:
        assert collector.read.wait(10)
    result = watch.result()
    assert result["peak_backlog_bytes"] == {"a→b": 9000}
    assert result["peak_queue_delay_s"] == {"a→b": round(9000 / 1.25e6, 6)}
    assert result["reads"] == collector.reads - 1  # the failed read is not counted


def test_reads_take_at_most_a_tenth_of_the_time(monkeypatch):
    """A read that takes 200 ms is followed by a wait of at least 2 s (its floor is 0.5 s)."""
    import time

    waits = []

    class Slow(Collector):
        def link_families(self):
            time.sleep(0.2)
            return super().link_families()

    class Stop(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return len(waits) > 3

    watch = peaks.QueuePeaks(Slow())
    watch._stop = Stop()
    watch._loop()
    assert waits[0] == peaks.MIN_INTERVAL_S and all(w >= 0.2 / peaks.BUSY_SHARE for w in waits[1:])
    assert 0.2 / peaks.BUSY_SHARE > 2 * peaks.MIN_INTERVAL_S  # the stretch, not the floor, is what holds
