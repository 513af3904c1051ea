"""Supervisors of a netns lab's agents: daemontools' svscan, one per server, in its namespace.

A Docker server starts its own svscan over /etc/service (images/server/testbed-boot), so its
agent comes back whenever the container starts. A netns server is a network namespace on the
host with no boot of its own, and shares the host's files: its svscan watches a directory of
its own under the lab's state directory, is started here in the server's namespace (in a
session of its own: killing its process group takes supervise and the agent with it) and is
journalled as a `process`, so `testbed down` and `testbed clean` stop it. Whatever runs in a
lab's namespaces is killed by `clean` anyway, journalled or not.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from orchestrator.emulation.cleanup import process_start_time, same_process
from orchestrator.emulation.journal import Entry


def server_dir(lab, server: str) -> Path:
    """Where a netns server's agent and supervisor live (the host's files are its files)."""
    return lab.state.dir / "deploy" / "servers" / server


def scan_dir(lab, server: str) -> Path:
    return server_dir(lab, server) / "service"


def _pidfile(lab, server: str) -> Path:
    return server_dir(lab, server) / "svscan.pid"


def running(lab, server: str) -> int | None:
    """The pid of the server's svscan, if the one recorded still runs."""
    try:
        pid, start = _pidfile(lab, server).read_text().split()
        if same_process(int(pid), start):
            return int(pid)
    except (FileNotFoundError, ValueError):
        pass
    return None


def ensure(lab, servers: list[str]) -> list[str]:
    """Start an svscan for each server that has none running; the servers started."""
    started, entries = [], []
    for server in servers:
        if running(lab, server):
            continue
        scan = scan_dir(lab, server)
        scan.mkdir(parents=True, exist_ok=True)
        with open(server_dir(lab, server) / "svscan.log", "ab") as log:
            proc = lab.popen(server, ["svscan", str(scan)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        start = process_start_time(proc.pid)
        entries.append(Entry("process", f"svscan-{server}", {"pid": proc.pid, "start": start}))
        _pidfile(lab, server).write_text(f"{proc.pid} {start}\n")
        started.append(server)
    lab.state.record(entries)
    return started


def stop(lab, servers: list[str]) -> int:
    """Stop the servers' svscans (and whatever they still supervise); how many ran."""
    stopped = 0
    for server in servers:
        pid = running(lab, server)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGTERM)
                stopped += 1
            except ProcessLookupError:
                pass
        _pidfile(lab, server).unlink(missing_ok=True)
    return stopped
