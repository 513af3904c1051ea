"""Agents as local processes on loopback: for tests, benchmarks and quick experiments.
Each gets a random Control token of its own (see agent/auth.py), which its Endpoint carries."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from orchestrator.agent.auth import TOKEN_ENV
from orchestrator.runner.driver import Endpoint, shutdown, wait_healthy


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextmanager
def local_agents(
    workers: int, servers: int = 0, host: str = "127.0.0.1", window_bytes: int = 0
) -> Iterator[list[Endpoint]]:
    """`workers` + `servers` agent processes on loopback; stopped on exit. `window_bytes`:
    their fixed HTTP/2 window (0: grown by BDP probing)."""
    total = workers + servers
    ports = free_ports(2 * total)
    endpoints, procs = [], []
    for rank in range(total):
        control, data = f"{host}:{ports[2 * rank]}", f"{host}:{ports[2 * rank + 1]}"
        node, token = f"local{rank}", secrets.token_urlsafe(32)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "orchestrator.agent.server", "--node", node, "--control", control, "--data", data,
                 "--window", str(window_bytes)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ | {TOKEN_ENV: token},
            )
        )
        endpoints.append(Endpoint(rank, node, control, data, role="worker" if rank < workers else "ps", token=token))
    try:
        wait_healthy(endpoints)
        yield endpoints
    finally:
        shutdown(endpoints)
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
