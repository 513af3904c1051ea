"""Where a table's registrations come from: "built-in", or the plugin file (or entry point)
being loaded. orchestrator/plugins.py sets it around a plugin; the algorithms' and the topology
kinds' tables record it, so a taken name can say who took it and a live lab can find the file
of its kind again."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator


class Origin:
    def __init__(self, name: str) -> None:
        self._where: ContextVar[str] = ContextVar(name, default="built-in")

    def get(self) -> str:
        return self._where.get()

    @contextmanager
    def within(self, where: str) -> Iterator[None]:
        """What is registered within it records `where`."""
        token = self._where.set(where)
        try:
            yield
        finally:
            self._where.reset(token)
