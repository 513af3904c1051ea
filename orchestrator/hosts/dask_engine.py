"""dask.distributed as the host engine: one scheduler beside the orchestrator, one worker
per host (as root, resource `host_<name>=1`, one thread, no nanny: a worker that dies stays
dead and is named), every task pinned to its host by that resource, mutual TLS throughout
(hosts/tls.py). The scheduler drops a worker whose connection breaks at once, and one that
stops answering after `WORKER_TTL` of missed heartbeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import TestbedError
from orchestrator.hosts.engine import HostLost, register_engine
from orchestrator.hosts.tls import Credentials, credentials

WORKER_TTL = "10s"  # heartbeats missed this long: the host is lost
RESOURCE = "host_{}"


class EngineError(TestbedError):
    """The engine could not be started or reached."""


def start_scheduler(state_dir: Path, listen: str, timeout: float = 60.0,
                    worker_ttl: str = WORKER_TTL) -> tuple[subprocess.Popen, str]:
    """A TLS scheduler on `listen` (an address of this machine the hosts reach), its address
    once it serves; a host silent for `worker_ttl` is lost. Its scheduler file and log go to
    `state_dir`."""
    tls = credentials(state_dir / "tls", "scheduler")
    file = state_dir / "scheduler.json"
    file.unlink(missing_ok=True)
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": worker_ttl}
    with open(state_dir / "scheduler.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls", "--host", listen,
             "--port", "0", "--scheduler-file", str(file), "--no-dashboard", "--no-show", *tls.worker_args()],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineError(f"the host engine's scheduler ended at once (exit {process.returncode}): see "
                              f"{state_dir / 'scheduler.log'}")
        try:
            return process, json.loads(file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    process.kill()
    raise EngineError(f"the host engine's scheduler did not serve within {timeout:.0f} s: see "
                      f"{state_dir / 'scheduler.log'}")


def worker_argv(address: str, host: str, tls: Credentials, python: str = sys.executable) -> list[str]:
    """The command that runs `host`'s worker (as root, on that host, with its `python`)."""
    return [python, "-m", "distributed.cli.dask_worker", address, "--name", host,
            "--resources", f"{RESOURCE.format(host)}=1", "--nthreads", "1", "--no-nanny", "--no-dashboard",
            *tls.worker_args()]


class DaskEngine:
    name = "dask"

    def __init__(self, address: str, tls: Credentials, timeout: float = 30.0) -> None:
        from distributed import Client

        try:
            self.client = Client(address, security=tls.security(), timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise EngineError(f"cannot reach the host engine's scheduler at {address}: {exc}") from None

    @classmethod
    def connect(cls, state_dir: Path, address: str, **options: Any) -> "DaskEngine":
        return cls(address, credentials(Path(state_dir) / "tls", "client"), **options)

    def hosts(self) -> list[str]:
        # Asked of the scheduler itself: Client.scheduler_info returns a cache that the
        # client's own periodic refresh (every 2 s, with no workers in it) may overwrite
        # between the fetch and the return, so a connected host read as lost (CI, stop 40).
        identity = self.client.sync(self.client.scheduler.identity, n_workers=-1)
        workers = identity["workers"].values()
        prefix = RESOURCE.format("")
        return sorted(name[len(prefix):] for worker in workers for name in worker.get("resources", {})
                      if name.startswith(prefix))

    def missing(self, expected: list[str]) -> list[str]:
        connected = set(self.hosts())
        return [host for host in expected if host not in connected]

    def wait_for(self, expected: list[str], timeout: float = 60.0) -> None:
        """Until every host in `expected` has joined; EngineError naming those that did not."""
        deadline = time.monotonic() + timeout
        while self.missing(expected):
            if time.monotonic() > deadline:
                raise EngineError(f"hosts {', '.join(self.missing(expected))} did not join the engine within "
                                  f"{timeout:.0f} s: check that their workers run and reach the scheduler")
            time.sleep(0.2)

    def run_on(self, host: str, work: Callable[..., Any], *args: Any, timeout: float = 600.0) -> Any:
        if self.missing([host]):
            raise HostLost(f"host {host} is not connected to the engine: start its worker there (worker_argv)")
        future = self.client.submit(work, *args, resources={RESOURCE.format(host): 1}, pure=False)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    return future.result(timeout=1.0)
                except TimeoutError:
                    if self.missing([host]):
                        raise HostLost(f"host {host} was lost while running {getattr(work, '__name__', work)}") \
                            from None
                    if time.monotonic() > deadline:
                        raise HostLost(f"host {host} did not finish {getattr(work, '__name__', work)} within "
                                       f"{timeout:.0f} s") from None
        finally:
            if not future.done():
                future.cancel()

    def close(self) -> None:
        self.client.close()


register_engine("dask", DaskEngine.connect)
