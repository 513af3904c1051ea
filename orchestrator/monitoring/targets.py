"""What Prometheus scrapes in a lab: file_sd target groups, one per deployed agent.

Every target carries `lab`, `node` and `role` (worker or ps), plus the structural facts the
topology has for the server (BCube digits, torus coordinates, Fat-Tree pod...) as labels, so
that a query can group by them. The groups follow the lab's deployed agents (deploy records
them; the fabric exporter rewrites this file when they change): a killed agent stays a
target, and goes down, until it is undeployed. Written atomically: Prometheus re-reads the
file whenever it changes and must never see half of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.deploy.agents import METRICS_PORT, deployed
from orchestrator.emulation.journal import write_atomically

JOB = "agents"


def _label_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def agent_targets(lab) -> list[dict]:
    """One file_sd group per deployed agent of a live lab: its metrics endpoint."""
    groups, agents = [], deployed(lab)
    for server in lab.topology.servers:
        if server.name not in agents:
            continue
        labels = {"lab": lab.spec.name, "node": server.name, "role": agents[server.name]}
        for key, value in sorted(server.attrs.items()):
            if isinstance(value, (str, int, float, list, tuple)) and key not in labels:
                labels[key] = _label_value(value)
        groups.append({"targets": [f"{lab.mgmt_address(server.name)}:{METRICS_PORT}"], "labels": labels})
    return groups


def write_targets(lab, path: Path) -> list[dict]:
    """The lab's targets into `path`, if they differ from what it holds."""
    groups = agent_targets(lab)
    text = json.dumps(groups, indent=1) + "\n"
    try:
        if path.read_text() == text:
            return groups
    except FileNotFoundError:
        pass
    write_atomically(path, text)
    return groups
