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
from orchestrator.control.endpoints import Endpoint, shutdown, wait_healthy


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def agent_ports(count: int, host: str = "127.0.0.1") -> list[tuple[int, int]]:
    """(control, data) ports for `count` agents on `host`, each data port's next one free
    too (the tcp transport listens there: agent/transports/tcp.py)."""
    held, pairs = [], []
    try:
        while len(pairs) < count:
            control, data, tcp = socket.socket(), socket.socket(), socket.socket()
            held += [control, data, tcp]
            control.bind((host, 0))
            data.bind((host, 0))
            try:
                tcp.bind((host, data.getsockname()[1] + 1))
            except OSError:
                continue  # taken (or past 65535): another data port
            pairs.append((control.getsockname()[1], data.getsockname()[1]))
        return pairs
    finally:
        for s in held:
            s.close()


@contextmanager
def local_agents(
    workers: int, servers: int = 0, host: str = "127.0.0.1", window_bytes: int = 0
) -> Iterator[list[Endpoint]]:
    """`workers` + `servers` agent processes on loopback; stopped on exit. `window_bytes`:
    their fixed HTTP/2 window (0: grown by BDP probing)."""
    total = workers + servers
    ports = agent_ports(total, host)
    endpoints, procs = [], []
    for rank in range(total):
        control, data = (f"{host}:{port}" for port in ports[rank])
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
