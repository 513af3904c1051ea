"""What Prometheus scrapes in a lab: file_sd target groups, one per agent.

Every target carries `lab` and `node`, plus the structural facts the topology has for the
server (BCube digits, torus coordinates, Fat-Tree pod...) as labels, so that a query can
group by them. Written atomically: Prometheus re-reads the file whenever it changes and
must never see half of it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from orchestrator.deploy.agents import METRICS_PORT

JOB = "agents"


def _label_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def agent_targets(lab) -> list[dict]:
    """One file_sd group per server of a live lab: its agent's metrics endpoint."""
    groups = []
    for server in lab.topology.servers:
        labels = {"lab": lab.spec.name, "node": server.name}
        for key, value in sorted(server.attrs.items()):
            if isinstance(value, (str, int, float, list, tuple)) and key not in labels:
                labels[key] = _label_value(value)
        groups.append({"targets": [f"{lab.mgmt_address(server.name)}:{METRICS_PORT}"], "labels": labels})
    return groups


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_targets(lab, path: Path) -> list[dict]:
    groups = agent_targets(lab)
    write_atomically(path, json.dumps(groups, indent=1) + "\n")
    return groups
