"""The long-running processes of a lab's monitoring (Prometheus, the fabric exporter,
Grafana): started in their own process group, journalled before anything waits for them (so
`testbed down` and `testbed clean` find them whatever happens next), recorded in a state
file, waited for until their HTTP endpoint answers, stopped gently then firmly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from orchestrator.emulation.cleanup import process_start_time, same_process
from orchestrator.emulation.journal import Entry
from orchestrator.errors import MonitorError


def running(entry: dict | None) -> bool:
    """Whether the process an entry ({pid, start}) names still runs (and is that process)."""
    return isinstance(entry, dict) and same_process(entry.get("pid", 0), entry.get("start", ""))


def recorded(path: Path) -> dict | None:
    """The state file's record, if its process still runs."""
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state if running(state) else None


def spawn(lab, name: str, command: list[str], log: Path) -> tuple[subprocess.Popen, dict]:
    """Start `command` in its own group, output to `log`, journalled as process `name`."""
    with open(log, "ab") as handle:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle,
                                start_new_session=True)
    entry = {"pid": proc.pid, "start": process_start_time(proc.pid)}
    lab.state.record([Entry("process", name, dict(entry))])
    return proc, entry


def wait_ready(name: str, url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until GET `url` answers 200; MonitorError naming the log if the process exits first
    or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise MonitorError(f"{name} exited at start ({proc.returncode}): {' '.join(tail)[:200]} (log {log})")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise MonitorError(f"{name} did not become ready within {timeout:.0f} s (log {log})")


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group (Prometheus flushes its head block), SIGKILL after `timeout`."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child: reap it
                return
        except ChildProcessError:  # started by another testbed process
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
