"""Undoing labs: from the journal first, then by name and label for anything it missed.

Every step is idempotent: a second `clean` finds nothing and does nothing. Order matters
only for speed and tidiness: processes, soft-RoCE devices, root-namespace links, then
containers, then namespaces (their veths vanish with them), then the state directory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import defaultdict

from orchestrator.emulation import docker_engine, kernel
from orchestrator.emulation.features import PROBE_PREFIX
from orchestrator.emulation.journal import LabState, global_lock, lab_id
from orchestrator.emulation.plan import NAMESPACE_PREFIX, link_group, namespace_name
from orchestrator.errors import LabExists

ROOT_LINK = re.compile(r"^tb[0-9a-f]{6}-(br|\d+)$")


def refuse_leftovers(name: str) -> None:
    """Refuse to build over remains of a crashed lab of the same name."""
    prefix = namespace_name(name, "")
    if kernel.list_namespaces(prefix) or _lab_containers(name):
        raise LabExists(f"remains of an earlier lab {name!r} exist: run `testbed clean {name}` first")


def clean_lab(name: str) -> dict[str, int]:
    """Remove everything of lab `name` that exists; returns counts of what was removed."""
    with global_lock():
        removed = _clean(name)
        if probes := sum(kernel.delete_namespace(ns) for ns in _orphaned_probes()):
            removed["namespaces"] = removed.get("namespaces", 0) + probes
        return removed


def clean_all() -> dict[str, int]:
    """Remove every lab testbed knows of, and orphans that carry its names or labels."""
    totals: dict[str, int] = defaultdict(int)
    with global_lock():
        names = {state.name for state in LabState.all()}
        names |= {c["lab"] for c in _lab_containers(None) if c["lab"]}
        for name in sorted(names):
            for key, count in _clean(name).items():
                totals[key] += count
        for ns in kernel.list_namespaces(NAMESPACE_PREFIX) + _orphaned_probes():
            totals["namespaces"] += kernel.delete_namespace(ns)
        totals["host links"] += _delete_root_links(lambda link: bool(ROOT_LINK.match(link)))
    return {what: count for what, count in totals.items() if count}


def _clean(name: str) -> dict[str, int]:
    state = LabState(name)
    entries = state.journal()
    by_kind: dict[str, list] = defaultdict(list)
    for entry in entries:
        by_kind[entry.kind].append(entry)
    removed: dict[str, int] = defaultdict(int)

    for entry in by_kind["process"]:
        removed["processes"] += _kill(entry.extra.get("pid"), entry.extra.get("start"))
    for entry in by_kind["rxe"]:
        result = subprocess.run(["rdma", "link", "delete", entry.name], capture_output=True)
        removed["rxe devices"] += result.returncode == 0

    lab_prefix = f"tb{lab_id(name)}-"
    journal_links = {e.name for e in by_kind["host_link"]}
    removed["host links"] += _delete_root_links(
        lambda link: link in journal_links or (link.startswith(lab_prefix) and bool(ROOT_LINK.match(link))),
        group=link_group(name),
    )

    containers = {e.name for e in by_kind["container"]} | {c["name"] for c in _lab_containers(name)}
    if containers:
        removed["containers"] += docker_engine.remove_containers(sorted(containers))

    namespaces = {e.name for e in by_kind["netns"]} | set(kernel.list_namespaces(namespace_name(name, "")))
    # whatever still runs inside the lab's namespaces (agents started between a fork and
    # its journal line, tools left by `testbed exec`) goes with them
    for pid in kernel.pids_in(sorted(namespaces)):
        removed["processes"] += _kill(pid, None)
    for ns in sorted(namespaces):
        removed["namespaces"] += kernel.delete_namespace(ns)

    if state.exists():
        state.remove()
        removed["state"] += 1
    return {k: v for k, v in removed.items() if v}


def _orphaned_probes() -> list[str]:
    """Namespaces of feature probes whose process is gone (killed between create and delete)."""
    orphans = []
    for ns in kernel.list_namespaces(PROBE_PREFIX):
        pid = ns.removeprefix(PROBE_PREFIX)
        if not (pid.isdigit() and os.path.exists(f"/proc/{pid}")):
            orphans.append(ns)
    return orphans


def _delete_root_links(match, group: int | None = None) -> int:
    """Delete root-namespace links whose name matches: the lab's netdev group in one batched
    call, then any straggler by name. Returns how many existed."""
    with kernel.Netlink() as nl:
        present = [msg.get_attr("IFLA_IFNAME") for msg in nl[None].get_links()]
        present = [name for name in present if match(name)]
        if group is not None and present:
            kernel.delete_group(nl, None, group)
        # bridges last: deleting a port first keeps the bridge's own teardown trivial
        for link in sorted(present, key=lambda n: n.endswith("-br")):
            kernel.delete_link(nl, None, link)
        return len(present)


def _lab_containers(name: str | None) -> list[dict]:
    if not docker_engine.engine_reachable():
        return []
    return docker_engine.lab_containers(name)


def _kill(pid: int | None, start: str | None) -> int:
    """Kill a recorded process group, only if the pid still belongs to the same process."""
    if not pid:
        return 0
    try:
        current_start = process_start_time(pid)
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0
    if start is not None and current_start != str(start):
        return 0  # the pid was reused by an unrelated process
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return 0
    return 1


def process_start_time(pid: int) -> str:
    """The kernel's start time of a process, to tell it apart from a later reuse of its pid."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[19]
