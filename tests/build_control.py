"""Driving `testbed up` as a process to a chosen point of its build, for signal and race tests.

A build is caught at a point by watching its journal (each step journals its objects before
making them), then frozen with SIGSTOP: a signal sent to a frozen build is delivered exactly
there when it is thawed, however fast or slow the machine is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

POINTS: dict[str, Callable[[Path], bool]] = {
    # the state directory exists, nothing is built yet
    "state": lambda lab_dir: (lab_dir / "state.json").exists(),
    # namespaces are being created (the first step)
    "netns": lambda lab_dir: "netns" in journal_kinds(lab_dir),
    # containers are being started (docker labs)
    "container": lambda lab_dir: "container" in journal_kinds(lab_dir),
    # the management network is being built (after links, shaping and routes)
    "host_link": lambda lab_dir: "host_link" in journal_kinds(lab_dir),
}


def journal_kinds(lab_dir: Path) -> set[str]:
    try:
        lines = (lab_dir / "journal.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return set()
    kinds = set()
    for line in lines:
        try:
            kinds.add(json.loads(line)["kind"])
        except (json.JSONDecodeError, KeyError):
            pass
    return kinds


def run_testbed(*args: str, state_root: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = os.environ.copy()
    if state_root is not None:
        env["TESTBED_STATE"] = str(state_root)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=kwargs.pop("timeout", 300), **kwargs)


class Build:
    """`testbed up LAB --name NAME` running in its own process group."""

    def __init__(self, lab: str, name: str, state_root: Path, runtime: str = "netns") -> None:
        self.name, self.state_root = name, state_root
        env = {**os.environ, "TESTBED_STATE": str(state_root)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "up", lab, "--runtime", runtime, "--name", name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )

    @property
    def lab_dir(self) -> Path:
        return self.state_root / "labs" / self.name

    def freeze_at(self, point: str, timeout: float = 120.0) -> None:
        """Stop the build as soon as it reaches `point` (see POINTS)."""
        reached = POINTS[point]
        deadline = time.monotonic() + timeout
        while not reached(self.lab_dir):
            if self.proc.poll() is not None:
                raise AssertionError(f"build ended before {point}: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"build did not reach {point} in {timeout} s")
            time.sleep(0.002)
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def signal(self, signum: int) -> None:
        """Send like a terminal (SIGINT, SIGHUP: the whole process group) or a supervisor
        (SIGTERM: the process), while frozen, then thaw."""
        if signum in (signal.SIGINT, signal.SIGHUP):
            os.killpg(self.proc.pid, signum)
        else:
            os.kill(self.proc.pid, signum)
        self.thaw()

    def finish(self, timeout: float = 300.0) -> tuple[int, str]:
        _, stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
