"""A Grafana per lab, where `grafana-server` is installed (the Vagrant VM has it; Debian does
not package it): the dashboards of dashboards.py, provisioned against the lab's Prometheus.

127.0.0.1 on a free port, anonymous viewers allowed (it listens on loopback only), no usage
reports. Its configuration, provisioning, database and logs live under
`<state>/labs/<lab>/monitoring/grafana`; the process is journalled like the lab's Prometheus,
so `testbed down` and `testbed clean` stop it too. Grafana's own files (its home: static
assets, defaults.ini) stay where its package put them.
"""

from __future__ import annotations

import configparser
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import MonitorError
from orchestrator.monitoring import processes
from orchestrator.monitoring.dashboards import export
from orchestrator.emulation.journal import write_atomically
from orchestrator.control.local import free_ports

PROCESS = "grafana"
READY_TIMEOUT = 60.0  # its first start migrates a new database


@dataclass(frozen=True)
class Grafana:
    lab: str
    pid: int
    url: str
    provisioning: Path
    log: Path


def _paths(lab) -> dict[str, Path]:
    root = lab.state.dir / "monitoring" / "grafana"
    return {"root": root, "config": root / "grafana.ini", "provisioning": root / "provisioning",
            "data": root / "data", "logs": root / "logs", "plugins": root / "plugins",
            "state": root / "grafana.json", "log": root / "grafana.log"}


def grafana_home(binary: str) -> Path:
    """Grafana's home (conf/defaults.ini, public/): /usr/share/grafana for the Debian package
    (/usr/sbin/grafana-server), the unpacked tree for a tarball (<home>/bin/grafana-server)."""
    prefix = Path(binary).resolve().parent.parent
    for home in (prefix / "share" / "grafana", prefix):
        if (home / "conf" / "defaults.ini").is_file():
            return home
    raise MonitorError(f"grafana-server at {binary} has no conf/defaults.ini beside it: reinstall Grafana's package")


def config_text(paths: dict[str, Path], port: int) -> str:
    config = configparser.ConfigParser(interpolation=None)
    config["server"] = {"http_addr": "127.0.0.1", "http_port": str(port)}
    config["paths"] = {key: str(paths[key]) for key in ("data", "logs", "plugins", "provisioning")}
    config["analytics"] = {"reporting_enabled": "false", "check_for_updates": "false",
                           "check_for_plugin_updates": "false"}
    config["auth.anonymous"] = {"enabled": "true", "org_role": "Viewer"}
    config["log"] = {"mode": "console"}
    text = io.StringIO()
    config.write(text)
    return text.getvalue()


def _grafana(lab, state: dict) -> Grafana:
    paths = _paths(lab)
    return Grafana(lab.spec.name, state["pid"], f"http://127.0.0.1:{state['port']}", paths["provisioning"],
                   paths["log"])


def _recorded(lab) -> dict | None:
    return processes.recorded(_paths(lab)["state"])


def start_grafana(lab, prometheus_url: str) -> Grafana | None:
    """Start the lab's Grafana on the dashboards, querying `prometheus_url` (the lab's
    Prometheus); None where grafana-server is not installed. A running one is kept, with its
    provisioning rewritten (Grafana re-reads dashboards every 30 s)."""
    binary = shutil.which("grafana-server")
    if binary is None:
        return None
    paths = _paths(lab)
    export(paths["provisioning"], prometheus_url)
    if (state := _recorded(lab)) is not None:
        return _grafana(lab, state)
    home = grafana_home(binary)
    for key in ("data", "logs", "plugins"):
        paths[key].mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    write_atomically(paths["config"], config_text(paths, port))
    proc, entry = processes.spawn(lab, PROCESS, [binary, f"--homepath={home}", f"--config={paths['config']}"], paths["log"])
    try:
        state = entry | {"port": port}
        write_atomically(paths["state"], json.dumps(state) + "\n")
        processes.wait_ready("grafana-server", f"http://127.0.0.1:{port}/api/health", proc, paths["log"],
                             READY_TIMEOUT)
    except BaseException:
        processes.stop(proc.pid)
        paths["state"].unlink(missing_ok=True)
        raise
    return _grafana(lab, state)


def stop_grafana(lab) -> bool:
    """Stop the lab's Grafana (its database stays until the lab is removed); was one running?"""
    state = _recorded(lab)
    if state is None:
        return False
    processes.stop(state["pid"])
    _paths(lab)["state"].unlink(missing_ok=True)
    return True


def grafana_status(lab) -> Grafana | None:
    state = _recorded(lab)
    return _grafana(lab, state) if state else None
