"""A Prometheus per lab: configuration, start, stop, status.

Debian's `prometheus` binary, listening on 127.0.0.1 only (a free port, chosen at start and
kept in the lab's state), data under `<state>/labs/<lab>/monitoring/data`, 1 s scrapes,
targets through file_sd (targets.py), with its fabric exporter (exporter.py) and, where
grafana-server is installed, a Grafana on the dashboards (grafana.py). The processes are
journalled before they are waited for (processes.py), so `testbed down` and `testbed clean`
stop them whatever happened to this one.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.errors import MonitorError
from orchestrator.monitoring import processes
from orchestrator.monitoring.grafana import Grafana, grafana_status, start_grafana, stop_grafana
from orchestrator.emulation.journal import write_atomically
from orchestrator.monitoring.targets import JOB, write_targets
from orchestrator.control.local import free_ports

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
    grafana: str | None = None  # its Grafana's URL, where grafana-server is installed

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
            "fabric": root / "targets" / f"{FABRIC_JOB}.json", "data": root / "data",
            "state": root / "prometheus.json", "log": root / "prometheus.log", "rules": root / "rules.yml"}


class LocalExporter:
    """The fabric exporter of a lab on this machine: one process here, on 127.0.0.1, which
    also keeps the agents' targets in step with the lab's deployed agents. A lab split over
    hosts brings its own (`lab.fabric_exporters`: one per host)."""

    def start(self, lab, paths: dict[str, Path]) -> tuple[list[dict], list[dict]]:
        """(file_sd groups of the exporters, their records {pid, start, port, ...})."""
        (port,) = free_ports(1)
        _, entry = processes.spawn(
            lab, EXPORTER, [sys.executable, "-m", "orchestrator.monitoring.exporter", lab.spec.name,
                            "--port", str(port), "--targets", str(paths["targets"])], paths["root"] / "exporter.log")
        return [{"targets": [f"127.0.0.1:{port}"], "labels": {"lab": lab.spec.name}}], [entry | {"port": port}]

    def stop(self, lab, records: list[dict]) -> None:
        for record in records:
            if processes.running(record):
                processes.stop(record["pid"])


RULES = Path(__file__).with_name("rules.yml")


def config_text(lab, targets: Path, fabric: Path, rules: Path | None = None) -> str:
    """prometheus.yml of a lab: its agents and its fabric exporters through file_sd, the rules."""
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                   "evaluation_interval": SCRAPE_INTERVAL, "external_labels": {"testbed_lab": lab.spec.name}},
        "rule_files": [str(rules)] if rules else [],
        "scrape_configs": [
            {"job_name": JOB, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": SCRAPE_INTERVAL}]},
            {"job_name": FABRIC_JOB, "file_sd_configs": [{"files": [str(fabric)], "refresh_interval": SCRAPE_INTERVAL}]},
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _recorded(lab) -> dict | None:
    """The lab's Prometheus and exporter as recorded, if Prometheus still runs."""
    return processes.recorded(_paths(lab)["state"])


def _monitor(lab, state: dict, grafana: Grafana | None = None) -> Monitor:
    paths = _paths(lab)
    return Monitor(lab.spec.name, state["pid"], f"http://127.0.0.1:{state['port']}", paths["config"],
                   paths["targets"], paths["data"], grafana.url if grafana else None)


def _exporters(lab):
    return getattr(lab, "fabric_exporters", None) or LocalExporter()


def monitor_up(lab) -> Monitor:
    """Start the lab's Prometheus (or return the running one, with its targets rewritten)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise MonitorError("prometheus is not installed: run ./setup.sh (Debian: apt install prometheus)")
    paths = _paths(lab)
    write_targets(lab, paths["targets"])
    if (state := _recorded(lab)) is not None:
        return _monitor(lab, state, start_grafana(lab, f"http://127.0.0.1:{state['port']}"))
    paths["data"].mkdir(parents=True, exist_ok=True)
    exporters = _exporters(lab)
    groups, records = exporters.start(lab, paths)
    started = []
    try:
        (port,) = free_ports(1)
        write_atomically(paths["fabric"], json.dumps(groups, indent=1) + "\n")
        write_atomically(paths["rules"], RULES.read_text())
        write_atomically(paths["config"], config_text(lab, paths["targets"], paths["fabric"], paths["rules"]))
        proc, entry = processes.spawn(
            lab, PROCESS, [binary, f"--config.file={paths['config']}", f"--storage.tsdb.path={paths['data']}",
                           f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
                           "--web.enable-admin-api"],  # an experiment's TSDB snapshot (127.0.0.1 only)
            paths["log"])
        started.append(proc.pid)
        state = entry | {"port": port, "exporters": records}
        write_atomically(paths["state"], json.dumps(state) + "\n")
        processes.wait_ready("prometheus", f"http://127.0.0.1:{port}/-/ready", proc, paths["log"], READY_TIMEOUT)
        grafana = start_grafana(lab, f"http://127.0.0.1:{port}")
    except BaseException:
        for pid in started:
            processes.stop(pid)
        exporters.stop(lab, records)
        paths["state"].unlink(missing_ok=True)
        raise
    return _monitor(lab, state, grafana)


def monitor_down(lab) -> bool:
    """Stop the lab's Prometheus and Grafana (their data stays until the lab is removed); was
    a Prometheus running?"""
    stop_grafana(lab)
    state = _recorded(lab)
    if state is None:
        return False
    processes.stop(state["pid"])
    _exporters(lab).stop(lab, state.get("exporters", []))
    _paths(lab)["state"].unlink(missing_ok=True)
    return True


def monitor_status(lab) -> Monitor | None:
    state = _recorded(lab)
    return _monitor(lab, state, grafana_status(lab)) if state else None
