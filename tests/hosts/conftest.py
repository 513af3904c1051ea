"""The hosts tier: several hosts faked as namespaces on an underlay bridge
(orchestrator/hosts/fake.py). Like the netns tier, it ends with a check that nothing is left."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path
from typing import Iterator

from orchestrator.hosts.dask_engine import start_scheduler, worker_argv
from orchestrator.hosts.engine import ENGINES
from orchestrator.hosts.fake import fake_hosts
from orchestrator.hosts.tls import credentials
from tests.netns.conftest import leaves_no_trace  # noqa: F401 - the session-wide check


@contextlib.contextmanager
def engine_on_fake_hosts(directory: Path, names: list[str], own_state: bool = False) -> Iterator[tuple]:
    """(engine, fake hosts, {host: its worker process}, scheduler address): a TLS scheduler on
    this machine's end of the underlay and one worker per host in its namespace; with
    `own_state`, each worker has its own state directory and names for lab namespaces (what a
    host that builds labs needs). Every process is killed and every namespace removed after."""
    processes = []
    with fake_hosts(f"tbe{uuid.uuid4().hex[:4]}", names, orchestrator=True) as hosts:
        try:
            scheduler, address = start_scheduler(directory, str(hosts.orchestrator))
            processes.append(scheduler)
            workers = {}
            for host in hosts.names:
                state = directory / f"state-{host}" if own_state else None
                if state is not None:
                    state.mkdir()
                tls = credentials(directory / "tls", f"worker-{host}")
                workers[host] = hosts.start(host, worker_argv(address, host, tls), directory / f"worker-{host}.log",
                                            state=state)
                processes.append(workers[host])
            connected = ENGINES["dask"](directory, address)
            try:
                connected.wait_for(list(hosts.names))
                yield connected, hosts, workers, address
            finally:
                connected.close()
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
