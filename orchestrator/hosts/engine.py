"""The engine that runs emulation's work on each host of a lab that spans several: a narrow
interface, so that another backend (Kubernetes) can follow dask.distributed's, registered in
one table like every other part.

    engine = engines.open("dask", state_dir, hosts)
    engine.run_on("rack1", build_part, spec, placement)   # a task pinned to that host
    engine.missing()                                      # hosts the engine has lost
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from orchestrator.errors import TestbedError


class HostLost(TestbedError):
    """A host stopped answering: its name, and what was running there."""


class HostEngine(Protocol):
    name: str

    def hosts(self) -> list[str]:
        """The hosts connected now."""

    def run_on(self, host: str, work: Callable[..., Any], *args: Any, timeout: float = 600.0) -> Any:
        """`work(*args)` on `host`, its result back; HostLost when the host goes meanwhile."""

    def missing(self, expected: list[str]) -> list[str]:
        """Which of `expected` the engine does not have (lost, or never joined)."""

    def close(self) -> None:
        """Let go of the hosts (what runs there stays: `testbed hosts down` stops it)."""


ENGINES: dict[str, Callable[..., HostEngine]] = {}


def register_engine(name: str, connect: Callable[..., HostEngine]) -> None:
    """Add a backend: `connect(**options) -> HostEngine`."""
    if name in ENGINES:
        raise TestbedError(f"host engine {name} is registered already: pick another name")
    ENGINES[name] = connect
