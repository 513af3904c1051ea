"""Signals during a build or a removal: held as a flag, acted on at safe points.

A signal handler that raises (Python's default for SIGINT) can land anywhere: inside a
worker pool's bookkeeping, a `finally` or the rollback itself, and a build then came up
anyway or stopped half-made (Ctrl-C was ignored in 3 of 16 builds; SIGTERM and SIGHUP
killed the process with nothing undone). Inside `held_signals()` SIGINT, SIGTERM and SIGHUP
only record themselves; the builder calls `check()` between its steps and once more before
declaring the lab up, and `Interrupted` (with exit code 128 + signal) unwinds through the
rollback. Forked netlink workers inherit the recording handler and finish their items.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from orchestrator.errors import Interrupted

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signals:
    """The first signal received while held, if any."""

    def __init__(self) -> None:
        self.received: int | None = None

    def record(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum

    def check(self, doing: str = "build") -> None:
        """Raise Interrupted if a signal arrived (call only where unwinding is safe)."""
        if self.received is not None:
            name = signal.Signals(self.received).name
            raise Interrupted(f"{name} during the {doing}: everything it made has been removed", self.received)


@contextmanager
def held_signals() -> Iterator[Signals]:
    """Record SIGINT/SIGTERM/SIGHUP instead of acting on them, for the block's duration.

    Only the main thread can install handlers; elsewhere (a library user's thread) signals
    keep their usual effect and `check()` never fires."""
    signals = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {signum: signal.signal(signum, signals.record) for signum in HELD}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt for the block's duration, as Ctrl-C does,
    so that whatever unwinds on Ctrl-C (a lab's `with`, a run's teardown) unwinds on them
    too: Python's default for both ends the process with nothing undone. Only the main
    thread can install handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
