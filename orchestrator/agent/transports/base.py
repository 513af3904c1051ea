"""What the engine asks of a transport's sending side (agent/engine.py calls these)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from orchestrator.agent.proto import testbed_pb2 as pb


class Stream(Protocol):
    """The chunks of one partition's transfers to one peer address, step after step."""

    async def write(self, head: pb.Chunk, data: np.ndarray) -> None:
        """Send one chunk; return once `data` may change (it has been copied out)."""

    async def finish(self) -> None:
        """No more chunks on this stream."""

    async def acknowledged(self) -> str:
        """Wait for the receiver's verdict on everything written: "" if it applied every
        chunk, else its reason for refusing. Raises if the stream ended without one."""

    async def reason(self, error: Exception) -> str:
        """One line on why a write failed with `error` (the receiver's word if it gave one)."""

    def cancel(self) -> None:
        """Abandon the stream (the allreduce failed or was stopped)."""


class Sender(Protocol):
    """One rank's outgoing side for one run."""

    async def connect(self, targets: set[str], timeout: float) -> None:
        """Open connections to the peers' `host:port` targets, before the first iteration."""

    async def ready(self, target: str, timeout: float) -> None:
        """Wait (up to `timeout`) for a connection to `target` that is not yet there."""

    def connected(self, target: str) -> bool: ...

    def stream(self, target: str) -> Stream: ...

    async def close(self) -> None: ...
