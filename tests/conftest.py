"""Test tiers: unit (pure) · netns (root) · hosts (root: several hosts faked as namespaces on
an underlay bridge) · docker (root + engine) · vm (a full kernel in qemu).

A tier that cannot run here is skipped with its reason, which `-rs` prints. Tests under
tests/netns, tests/hosts, tests/docker and tests/vm get their tier marker from their directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest

HERE = Path(__file__).parent


def _root_reason() -> str | None:
    if os.geteuid() != 0:
        return "netns tier needs root (run ./setup.sh test as root)"
    if shutil.which("nsenter") is None:
        return "netns tier needs nsenter (util-linux)"
    return None


def _docker_reason() -> str | None:
    reason = _root_reason()
    if reason:
        return reason.replace("netns", "docker")
    from orchestrator.emulation import docker_engine

    try:
        docker_engine.client()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        return f"docker tier needs a running Docker engine ({exc})"
    return None


def _hosts_reason() -> str | None:
    reason = _root_reason()
    return reason.replace("netns", "hosts") if reason else None


def _vm_reason() -> str | None:
    reason = _root_reason()
    if reason:
        return reason.replace("netns", "vm")
    if not os.environ.get("TESTBED_VM_GUEST") and shutil.which("qemu-system-x86_64") is None:
        return "vm tier needs qemu-system-x86_64 (apt-get install qemu-system-x86, or ./setup.sh)"
    return None


TIERS = {"netns": _root_reason, "hosts": _hosts_reason, "docker": _docker_reason, "vm": _vm_reason}


def pytest_collection_modifyitems(config, items):
    reasons: dict[str, str | None] = {}
    for item in items:
        tier = next((t for t in TIERS if f"{os.sep}{t}{os.sep}" in str(item.fspath)), None)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if tier not in reasons:
            reasons[tier] = TIERS[tier]()
        if reasons[tier]:
            item.add_marker(pytest.mark.skip(reason=reasons[tier]))


def host_snapshot() -> dict:
    """What a lab could leave on the host: namespaces, root links, containers, rules, and nft
    tables (a lab's `inet testbed_<id>`; iptables-save does not show inet tables)."""
    from orchestrator.emulation import docker_engine, kernel

    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout if shutil.which("iptables-save") else ""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout if shutil.which("nft") else ""
    containers = []
    if docker_engine.engine_reachable():
        containers = sorted(c["name"] for c in docker_engine.lab_containers())
    return {
        "namespaces": kernel.list_namespaces(),
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        "containers": containers,
        "rules": sorted(l for l in rules.splitlines() if l and not l.startswith(("#", ":"))),
        "nft tables": sorted(tables.splitlines()),
    }


T = TypeVar("T")


def until(probe: Callable[[], T], what: str, timeout: float = 15.0, every: float = 0.05) -> T:
    """Poll `probe` until it returns something true, and return that: waiting for a state
    rather than sleeping for it. Fails the test, saying `what`, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(every)
    return value
