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

from orchestrator.emulation import cpu_limit, docker_engine, isolation, kernel
from orchestrator.emulation.features import PROBE_PREFIX
from orchestrator.emulation.interrupts import held_signals
from orchestrator.emulation.journal import LabState, check_name, global_lock, lab_id, lab_lock
from orchestrator.emulation.plan import NAMESPACE_PREFIX, link_group
from orchestrator.errors import LabBusy, LabError, LabExists

# a lab's root-namespace links (plan): management bridges `br` and `b<n>`, server ports `<rank>`
ROOT_LINK = re.compile(r"^tb[0-9a-f]{6}-(br|b?\d+)$")
_BRIDGE = re.compile(r"-(br|b\d+)$")


def lab_of_namespace(namespace: str) -> str | None:
    """The lab a `testbed-<lab>-<node>` namespace belongs to: node names never hold '-', so
    `relq` and `relq-a` are told apart exactly (a prefix match took one for the other)."""
    if not namespace.startswith(NAMESPACE_PREFIX) or "-" not in namespace[len(NAMESPACE_PREFIX):]:
        return None
    return namespace[len(NAMESPACE_PREFIX):].rsplit("-", 1)[0]


def lab_namespaces(name: str) -> list[str]:
    """The namespaces on this host that belong to lab `name`, and no other lab's."""
    prefix = f"{NAMESPACE_PREFIX}{name}-"
    return [ns for ns in kernel.list_namespaces(prefix) if lab_of_namespace(ns) == name]


def refuse_leftovers(name: str) -> None:
    """Refuse to build over remains of a crashed lab of the same name."""
    if lab_namespaces(name) or _lab_containers(name):
        raise LabExists(f"remains of an earlier lab {name!r} exist: run `testbed clean {name}` first")


def clean_lab(name: str) -> dict[str, int]:
    """Remove everything of lab `name` (exactly that lab) that exists; returns counts of what
    was removed. LabBusy if another process is building it. Signals wait until it is done."""
    check_name(name)
    with held_signals(), global_lock(), lab_lock(name):
        removed = _clean(name)
        if probes := sum(kernel.delete_namespace(ns) for ns in _orphaned_probes()):
            removed["namespaces"] = removed.get("namespaces", 0) + probes
        return removed


def clean_all() -> tuple[dict[str, int], list[str]]:
    """Remove every lab testbed knows of, and orphans that carry its names or labels, except
    labs another process is building right now. Returns (counts removed, labs left alone)."""
    totals: dict[str, int] = defaultdict(int)
    busy: list[str] = []
    with held_signals(), global_lock():
        names = {state.name for state in LabState.all()}
        names |= {c["lab"] for c in _lab_containers(None) if c["lab"] and _valid(c["lab"])}
        names |= {lab for ns in kernel.list_namespaces(NAMESPACE_PREFIX) if (lab := lab_of_namespace(ns)) and _valid(lab)}
        for name in sorted(names):
            try:
                with lab_lock(name):
                    for key, count in _clean(name).items():
                        totals[key] += count
            except LabBusy:
                busy.append(name)
        for ns in kernel.list_namespaces(NAMESPACE_PREFIX) + _orphaned_probes():
            if lab_of_namespace(ns) not in busy:
                totals["namespaces"] += kernel.delete_namespace(ns)
        spared = tuple(f"tb{lab_id(name)}-" for name in busy)
        totals["host links"] += _delete_root_links(lambda link: bool(ROOT_LINK.match(link)) and not link.startswith(spared))
        totals["nft tables"] += isolation.delete_root_tables(keep={isolation.root_table(lab_id(n)) for n in busy})
    return {what: count for what, count in totals.items() if count}, busy


def _valid(name: str) -> bool:
    try:
        check_name(name)
    except LabError:
        return False
    return True


def _clean(name: str) -> dict[str, int]:
    state = LabState(name)
    entries = state.journal()
    by_kind: dict[str, list] = defaultdict(list)
    for entry in entries:
        by_kind[entry.kind].append(entry)
    removed: dict[str, int] = defaultdict(int)

    _thaw_paused(name, by_kind["fault"])  # a stopped process or paused container dies cleanly once thawed
    if groups := cpu_limit.remove_lab_groups(lab_id(name)):  # server-slow's CPU quotas
        removed["cpu groups"] += groups
    for entry in by_kind["process"]:
        removed["processes"] += kill_recorded(entry.extra.get("pid"), entry.extra.get("start"))
    for entry in by_kind["rxe"]:
        result = subprocess.run(["rdma", "link", "delete", entry.name], capture_output=True)
        removed["rxe devices"] += result.returncode == 0

    lab_prefix = f"tb{lab_id(name)}-"
    # journal names are checked against the lab's own naming too: a journal is a file on disk,
    # and nothing outside the lab may be removed on its word
    journal_links = {e.name for e in by_kind["host_link"] if e.name.startswith(f"tb{lab_id(name)}-")}
    removed["host links"] += _delete_root_links(
        lambda link: link in journal_links or (link.startswith(lab_prefix) and bool(ROOT_LINK.match(link))),
        group=link_group(name),
    )
    # the lab's firewall table (journalled as nft_table), by the lab's own name only, like
    # its links: that is the journal's name, and it finds the table of a lost journal too
    removed["nft tables"] += isolation.delete_root_table(isolation.root_table(lab_id(name)))

    containers = {e.name for e in by_kind["container"] if lab_of_namespace(e.name) == name}
    containers |= {c["name"] for c in _lab_containers(name)}
    if containers:
        removed["containers"] += docker_engine.remove_containers(sorted(containers))

    namespaces = {e.name for e in by_kind["netns"] if lab_of_namespace(e.name) == name} | set(lab_namespaces(name))
    # a wire's VXLAN end holds its VNI on the host until it is unregistered, which a dying
    # namespace does some time later: deleted here first, a rebuild may take the VNI at once
    wires = [e for e in by_kind["wire"] if e.extra.get("netns") in namespaces]
    if wires:
        with kernel.Netlink() as nl:
            for entry in wires:
                removed["wires"] += kernel.delete_link(nl, entry.extra["netns"], entry.name)
    # whatever still runs inside the lab's namespaces (agents started between a fork and
    # its journal line, tools left by `testbed exec`) goes with them
    for pid in kernel.pids_in(sorted(namespaces)):
        removed["processes"] += kill_recorded(pid, None)
    for ns in sorted(namespaces):
        removed["namespaces"] += kernel.delete_namespace(ns)

    if state.exists():
        state.remove()
        removed["state"] += 1
    return {k: v for k, v in removed.items() if v}


def _thaw_paused(name: str, faults: list) -> None:
    """Resume what server-pause faults froze: the journalled processes (SIGCONT, only if
    still the same process) and the lab's containers on those servers (docker unpause).
    Links, routes and a partition's tables need nothing: they go with the namespaces."""
    paused = [entry for entry in faults if entry.extra.get("action") == "server-pause"]
    for entry in paused:
        for proc in entry.extra.get("saved", {}).get("processes", []):
            if isinstance(proc, dict) and same_process(proc.get("pid", 0), proc.get("start")):
                try:
                    os.kill(proc["pid"], signal.SIGCONT)
                except ProcessLookupError:
                    pass
    nodes = {entry.extra.get("target") for entry in paused}
    if nodes:
        for container in _lab_containers(name):
            if container.get("node") in nodes:
                docker_engine.container_action(container["name"], "cont")


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
        present = [name for name in kernel.links_in(nl, None) if match(name)]
        if group is not None and present:
            kernel.delete_group(nl, None, group)
        # bridges last: deleting a port first keeps the bridge's own teardown trivial
        for link in sorted(present, key=lambda n: bool(_BRIDGE.search(n))):
            kernel.delete_link(nl, None, link)
        return len(present)


def _lab_containers(name: str | None) -> list[dict]:
    """The lab's containers that this machine's names own (hosts faked on one machine share
    its Docker engine, and each names its containers apart, as its namespaces)."""
    if not docker_engine.engine_reachable():
        return []
    return [c for c in docker_engine.lab_containers(name) if c["name"].startswith(NAMESPACE_PREFIX)]


def kill_recorded(pid: int | None, start: str | None) -> int:
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


def same_process(pid: int, start: str) -> bool:
    """Does `pid` still run the process that started at `start` (not a later reuse of it)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        return process_start_time(pid) == str(start)
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def process_start_time(pid: int) -> str:
    """The kernel's start time of a process, to tell it apart from a later reuse of its pid."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[19]
