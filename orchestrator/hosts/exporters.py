"""The fabric exporters of a lab split over hosts: one per host, started there by its worker,
serving on the host's underlay address what that host's nodes send and what its servers use
(monitoring/exporter.py, restricted by Lab.here). The orchestrator's Prometheus finds them
through its fabric file_sd, each labelled with its `host`; each is journalled on its host,
so `clean` there stops it too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.hosts.engine import HostEngine

EXPORTER = "fabric-exporter"
READY_TIMEOUT = 30.0


@dataclass(frozen=True)
class HostExporters:
    engine: HostEngine

    def start(self, lab, paths: dict[str, Path]) -> tuple[list[dict], list[dict]]:
        """(file_sd groups, records) of an exporter on every host of `lab` (a SplitLab)."""
        records = []
        try:
            for host in lab.placement.hosts:
                address = str(lab.underlay[host.name])
                records.append({"host": host.name, "address": address,
                                **self.engine.run_on(host.name, start_part, lab.name, address)})
        except BaseException:
            self.stop(lab, records)
            raise
        groups = [{"targets": [f"{r['address']}:{r['port']}"], "labels": {"lab": lab.name, "host": r["host"]}}
                  for r in records]
        return groups, records

    def stop(self, lab, records: list[dict]) -> None:
        for record in records:
            if not self.engine.missing([record["host"]]):
                self.engine.run_on(record["host"], stop_part, {"pid": record["pid"], "start": record["start"]})


def start_part(name: str, address: str) -> dict:
    """On a host: its share's exporter on `address`, journalled, once it serves."""
    import sys

    from orchestrator.control.local import free_ports
    from orchestrator.emulation.lab import Lab
    from orchestrator.monitoring import processes

    lab = Lab.attach(name)
    log_dir = lab.state.dir / "monitoring"
    log_dir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    process, entry = processes.spawn(lab, EXPORTER, [sys.executable, "-m", "orchestrator.monitoring.exporter", name,
                                                     "--port", str(port), "--listen", address],
                                     log_dir / "exporter.log")
    processes.wait_ready(EXPORTER, f"http://{address}:{port}/metrics", process, log_dir / "exporter.log",
                         READY_TIMEOUT)
    return entry | {"port": port}


def stop_part(record: dict) -> None:
    from orchestrator.monitoring import processes

    if processes.running(record):
        processes.stop(record["pid"])
