"""kernel.in_workers: forked workers that a checkpoint can stop (a signal during a long step)."""

from __future__ import annotations

import os
import time

import pytest

from orchestrator.emulation import kernel
from orchestrator.errors import EmulationError


class Stop(Exception):
    pass


def children() -> set[str]:
    return {pid for task in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{task}/children").read().split()}


def test_a_checkpoint_that_raises_stops_the_workers_at_once():
    before = children()
    started = time.monotonic()

    def checkpoint() -> None:
        if time.monotonic() - started > 0.5:
            raise Stop()

    with pytest.raises(Stop):
        kernel.in_workers(list(range(8)), lambda nl, item: time.sleep(30), workers=2, checkpoint=checkpoint)
    assert time.monotonic() - started < 5
    assert children() == before  # both workers killed and reaped


def test_every_item_done_and_progress_counted_and_a_workers_error_raised():
    seen = []
    kernel.in_workers(list(range(10)), lambda nl, item: None, lambda done, total: seen.append((done, total)),
                      workers=2, checkpoint=lambda: None)
    assert seen[-1] == (10, 10)

    def fail(nl, item):
        if item == 3:
            raise ValueError("item 3 is bad")

    with pytest.raises(EmulationError, match="item 3 is bad"):
        kernel.in_workers(list(range(6)), fail, workers=2)
