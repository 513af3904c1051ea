"""Servers whose agents cannot answer, found before deploying on them.

A paused server (`testbed fault LAB server-pause`) is a snapshot: the fault stops the
processes that ran on the server when it was applied. A netns server whose agents were not
running then, or were undeployed since, gets a fresh svscan and agent from `deploy`, which
nothing froze: the health check passed and `deploy --servers h1` said "1 agent healthy" on a
server the lab says is paused. A crashed netns server likewise: its namespace outlives its
processes. And agents that are themselves stopped (a pause, or a SIGSTOP by hand) accept
connections in the kernel but never answer: the playbook's health wait ran out its 30 s
and blamed the health check, not the pause.

So `deploy` first asks, for every server it is given, in one line naming the server:
  - the lab's fault journal: an active server-pause or server-crash on it;
  - the server itself: a paused container (docker pause), or stopped (SIGSTOP) processes of
    its agents in its namespace: the svscan deploy started there, what it supervises, and
    any testbed agent (the exec deployer's).
All of this reads files and one Docker listing: it costs milliseconds, not a timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from orchestrator.deploy import supervision
from orchestrator.errors import DeployError

# An active fault of these actions on a server: its agents cannot answer. (what it is, the fix)
UNANSWERING = {
    "server-pause": ("paused", "resume it with `testbed fault {lab} heal {id}`"),
    "server-crash": ("crashed", "start it with `testbed fault {lab} server-restart {server}`"),
}
AGENT_COMMANDS = ("testbed-agent", "orchestrator.agent.server")  # the agent's command line, either way it starts
SHOWN = 3  # servers named in the message; the rest are counted


def process_state(pid: int) -> tuple[str, int, str] | None:
    """(state letter, process group, command name) of a process from /proc, or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    name, rest = stat.split("(", 1)[1].rsplit(")", 1)  # the name may hold spaces and ')'
    fields = rest.split()
    return fields[0], int(fields[2]), name


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def stopped_agents(pids: Iterable[int], svscan: int | None) -> list[int]:
    """Those of `pids` that are stopped (state T: SIGSTOP; t: traced) and belong to the
    server's agents: the process group of its svscan (svscan, supervise, the agent), or an
    agent's own command line."""
    found = []
    for pid in pids:
        seen = process_state(pid)
        if seen is None or seen[0] not in "Tt":
            continue
        if (svscan is not None and seen[1] == svscan) or any(c in command_line(pid) for c in AGENT_COMMANDS):
            found.append(pid)
    return sorted(found)


def _from_faults(lab, servers: set[str]) -> dict[str, str]:
    why = {}
    for fault in lab.state.active_faults():
        if fault["action"] in UNANSWERING and fault["target"] in servers and fault["target"] not in why:
            what, fix = UNANSWERING[fault["action"]]
            why[fault["target"]] = (f"it is {what} (fault {fault['id']}, {fault['action']}): "
                                    + fix.format(lab=lab.name, id=fault["id"], server=fault["target"]))
    return why


def _from_processes(lab, servers: list[str]) -> dict[str, str]:
    from orchestrator.emulation import kernel
    from orchestrator.emulation.runtimes import by_runtime

    why = {}
    for runtime, group in by_runtime(lab.plan, servers):  # a paused container
        why.update(runtime.paused(lab, group))
    # a server with the host's processes: its agents' own, stopped one by one
    spaces = {lab.plan.namespaces[s]: s for s in servers if not lab.runtime_of(s).containerised}
    for space, pids in kernel.pids_by_namespace(spaces).items():
        server = spaces[space]
        stopped = stopped_agents(pids, supervision.running(lab, server))
        if stopped:
            shown = ", ".join(f"{pid} {(process_state(pid) or ('', 0, '?'))[2]}" for pid in stopped[:3])
            more = f" and {len(stopped) - 3} more" if len(stopped) > 3 else ""
            why[server] = (f"its agent's processes are stopped (SIGSTOP: pid {shown}{more}), as a paused server's are: "
                           f"`kill -CONT {' '.join(str(p) for p in stopped)}`")
    return why


def refuse_unanswering(lab, servers: list[str], faults: bool = True) -> None:
    """DeployError, one line, if any of `servers` cannot answer a health check: paused or
    crashed by a fault (unless `faults` is False), a paused container, or stopped agent
    processes. Changes nothing."""
    why = _from_faults(lab, set(servers)) if faults else {}
    why.update(_from_processes(lab, [s for s in servers if s not in why]))
    ordered = [s for s in servers if s in why]
    if not ordered:
        return
    first, others = ordered[0], ordered[1:]
    also = ""
    if others:
        more = f" and {len(others) - SHOWN} more" if len(others) > SHOWN else ""
        also = f" (nor do {', '.join(others[:SHOWN])}{more})"
    raise DeployError(f"lab {lab.name}: {first} does not answer{also}: {why[first]}, then deploy again")
