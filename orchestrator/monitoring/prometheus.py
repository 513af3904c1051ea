"""A Prometheus per lab: configuration, start, stop, status.

Debian's `prometheus` binary, listening on 127.0.0.1 only (a free port, chosen at start and
kept in the lab's state), data under `<state>/labs/<lab>/monitoring/data`, 1 s scrapes,
targets through file_sd (targets.py). The process is journalled before it is waited for,
so `testbed down` and `testbed clean` stop it whatever happened to this one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.emulation.cleanup import process_start_time, same_process
from orchestrator.emulation.journal import Entry
from orchestrator.errors import MonitorError
from orchestrator.monitoring.targets import JOB, write_atomically, write_targets
from orchestrator.runner.local import free_ports

SCRAPE_INTERVAL = "1s"
READY_TIMEOUT = 30.0
PROCESS = "prometheus"
EXPORTER = "fabric-exporter"
FABRIC_JOB = "fabric"


@dataclass(frozen=True)
class Monitor:
    lab: str
    pid: int
    url: str
    config: Path
    targets: Path
    data: Path

    def query(self, expression: str) -> list[dict]:
        """An instant query through the HTTP API: its result vector."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.load(reply)["data"]["result"]

    def active_targets(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as reply:
            return json.load(reply)["data"]["activeTargets"]


def _paths(lab) -> dict[str, Path]:
    root = lab.state.dir / "monitoring"
    return {"root": root, "config": root / "prometheus.yml", "targets": root / "targets" / f"{JOB}.json",
            "data": root / "data", "state": root / "prometheus.json", "log": root / "prometheus.log",
            "rules": root / "rules.yml"}


RULES = Path(__file__).with_name("rules.yml")


def config_text(lab, targets: Path, exporter_port: int, rules: Path | None = None) -> str:
    """prometheus.yml of a lab: its agents through file_sd, its fabric exporter, the rules."""
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                   "evaluation_interval": SCRAPE_INTERVAL, "external_labels": {"testbed_lab": lab.spec.name}},
        "rule_files": [str(rules)] if rules else [],
        "scrape_configs": [
            {"job_name": JOB, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": SCRAPE_INTERVAL}]},
            {"job_name": FABRIC_JOB,
             "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"lab": lab.spec.name}}]},
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _running(entry: dict | None) -> bool:
    return isinstance(entry, dict) and same_process(entry.get("pid", 0), entry.get("start", ""))


def _recorded(lab) -> dict | None:
    """The lab's Prometheus and exporter as recorded, if Prometheus still runs."""
    try:
        state = json.loads(_paths(lab)["state"].read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state if _running(state) else None


def _spawn(lab, name: str, command: list[str], log: Path) -> tuple[subprocess.Popen, dict]:
    """Start a process of the lab's monitoring in its own group, journalled before anything
    waits for it (so `testbed clean` finds it whatever happens next)."""
    with open(log, "ab") as handle:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle,
                                start_new_session=True)
    entry = {"pid": proc.pid, "start": process_start_time(proc.pid)}
    lab.state.record([Entry("process", name, dict(entry))])
    return proc, entry


def _monitor(lab, state: dict) -> Monitor:
    paths = _paths(lab)
    return Monitor(lab.spec.name, state["pid"], f"http://127.0.0.1:{state['port']}", paths["config"],
                   paths["targets"], paths["data"])


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise MonitorError(f"prometheus exited at start ({proc.returncode}): {' '.join(tail)[:200]} "
                               f"(log {log})")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise MonitorError(f"prometheus did not become ready within {READY_TIMEOUT:.0f} s (log {log})")


def monitor_up(lab) -> Monitor:
    """Start the lab's Prometheus (or return the running one, with its targets rewritten)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise MonitorError("prometheus is not installed: run ./setup.sh (Debian: apt install prometheus)")
    paths = _paths(lab)
    write_targets(lab, paths["targets"])
    if (state := _recorded(lab)) is not None:
        return _monitor(lab, state)
    paths["data"].mkdir(parents=True, exist_ok=True)
    exporter_port, port = free_ports(2)
    exporter, exporter_entry = _spawn(
        lab, EXPORTER, [sys.executable, "-m", "orchestrator.monitoring.exporter", lab.spec.name,
                        "--port", str(exporter_port)], paths["root"] / "exporter.log")
    started = [exporter.pid]
    try:
        write_atomically(paths["rules"], RULES.read_text())
        write_atomically(paths["config"], config_text(lab, paths["targets"], exporter_port, paths["rules"]))
        proc, entry = _spawn(
            lab, PROCESS, [binary, f"--config.file={paths['config']}", f"--storage.tsdb.path={paths['data']}",
                           f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"], paths["log"])
        started.append(proc.pid)
        state = entry | {"port": port, "exporter": exporter_entry | {"port": exporter_port}}
        write_atomically(paths["state"], json.dumps(state) + "\n")
        _wait_ready(f"http://127.0.0.1:{port}", proc, paths["log"])
    except BaseException:
        for pid in started:
            _stop(pid)
        paths["state"].unlink(missing_ok=True)
        raise
    return _monitor(lab, state)


def _stop(pid: int, timeout: float = 10.0) -> None:
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


def monitor_down(lab) -> bool:
    """Stop the lab's Prometheus (its data stays until the lab is removed); was one running?"""
    state = _recorded(lab)
    if state is None:
        return False
    _stop(state["pid"])
    if _running(state.get("exporter")):
        _stop(state["exporter"]["pid"])
    _paths(lab)["state"].unlink(missing_ok=True)
    return True


def monitor_status(lab) -> Monitor | None:
    state = _recorded(lab)
    return _monitor(lab, state) if state else None
