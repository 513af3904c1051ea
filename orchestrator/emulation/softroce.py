"""Soft-RoCE (rxe) devices on servers' data NICs: made at bring-up, made again when one dies.

rxe's management queue pair (GSI, QP1) carries rdma_cm's connection messages. When one of
them finds no route (a disconnect request sent while the server's link is cut: a crashed
server's killed agent tears its connections down as its links go) rxe puts that queue pair in
its error state for good, and the device can neither open nor answer a connection again. A
NIC's does not; so when a server's links come back, a device whose management queue pair died
is made again, as a restarted machine's NIC would be.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Collection, Mapping

from orchestrator.errors import EmulationError


def device_name(lab_id: str, nic: str) -> str:
    return f"rxe_{lab_id}_{nic}".replace("-", "_")


def devices(lab_id: str, server) -> dict[str, str]:
    """A server's rxe devices, one per data NIC: device → its netdev."""
    return {device_name(lab_id, nic.name): nic.name for nic in server.data_nics()}


def _rdma(namespace: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, "rdma", *argv], capture_output=True, text=True,
                          timeout=30)


def add(namespace: str, device: str, netdev: str) -> None:
    result = _rdma(namespace, "link", "add", device, "type", "rxe", "netdev", netdev)
    if result.returncode != 0:
        raise EmulationError(f"soft-RoCE on {netdev}: {result.stderr.strip() or 'rdma link add failed'}")


def dead(queue_pairs: list[dict], devices: Collection[str]) -> set[str]:
    """Of `devices`, those whose management queue pair is in its error state (`queue_pairs`:
    what `rdma -j res show qp` lists)."""
    return {qp["ifname"] for qp in queue_pairs
            if qp.get("type") == "GSI" and qp.get("state") == "ERR" and qp.get("ifname") in devices}


def repair(namespace: str, devices: Mapping[str, str]) -> list[str]:
    """Make again each of the namespace's `devices` (device → its netdev) whose management
    queue pair died; returns those made again."""
    listed = _rdma(namespace, "-j", "res", "show", "qp")
    try:
        queue_pairs = json.loads(listed.stdout or "[]") if listed.returncode == 0 else []
    except json.JSONDecodeError:
        queue_pairs = []
    broken = sorted(dead(queue_pairs, devices))
    for device in broken:
        _rdma(namespace, "link", "delete", device)
        add(namespace, device, devices[device])
    return broken
