"""The machines a run's agents go to, and what each has for them (memory, threads).

One machine, this host, unless the run is split over hosts (`testbed run --hosts`): then each
server's agent runs on the host its server is placed on, as `hosts.split.up` places them,
and hosts that are one machine (network namespaces of it, as fake hosts are; the same
kernel boot id) count together: their agents share that machine's memory and threads.
What each machine has comes from the host itself (`hosts.parts.limits_part`), pure here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from orchestrator.spec.lab import LabSpec
from orchestrator.topology import Topology


@dataclass(frozen=True)
class Machine:
    name: str  # as a refusal names it: "this machine", "host a" or "hosts a, b (one machine)"
    memory: int | None  # bytes its agents may use (MemAvailable), None: unknown, not checked
    tasks: int | None  # threads it can still start, None: unknown, not checked


@dataclass(frozen=True)
class Machines:
    machines: tuple[Machine, ...]
    hosts: tuple = ()  # topology.partition.Host, where servers go (none: all on machines[0])
    machine_of: Mapping[str, int] = field(default_factory=dict)  # host name → index of its machine
    _placed: dict = field(default_factory=dict, repr=False, compare=False)  # topology id → host of each server

    @classmethod
    def here(cls, memory: int | None, tasks: int | None) -> "Machines":
        """Every agent on this host, with `memory` bytes and `tasks` threads for them."""
        return cls((Machine("this machine", memory, tasks),))

    @classmethod
    def of_hosts(cls, hosts: Sequence, limits: Mapping[str, Mapping]) -> "Machines":
        """Agents on `hosts` (topology.partition.Host) whose `limits` (host name →
        {"machine": boot id, "memory": bytes, "tasks": threads}) their workers reported."""
        by_machine: dict[str, list[str]] = {}
        for host in hosts:
            by_machine.setdefault(str(limits[host.name]["machine"]), []).append(host.name)
        machines, machine_of = [], {}
        for names in by_machine.values():
            first = limits[names[0]]
            label = f"host {names[0]}" if len(names) == 1 else f"hosts {', '.join(names)} (one machine)"
            for name in names:
                machine_of[name] = len(machines)
            machines.append(Machine(label, first.get("memory"), first.get("tasks")))
        return cls(tuple(machines), tuple(hosts), machine_of)

    @property
    def split(self) -> bool:
        return bool(self.hosts)

    def spread(self, lab: LabSpec, topology: Topology, nodes: Sequence[str]) -> dict[int, list[str]]:
        """`nodes` (servers of `lab`) by the machine their agents run on (index → nodes)."""
        if not self.hosts:
            return {0: list(nodes)}
        host_of = self._placed.get(id(topology))
        if host_of is None:
            from orchestrator.topology.partition import place

            host_of = place(topology, list(self.hosts), default_bps=lab.links.bandwidth).host_of
            self._placed[id(topology)] = host_of
        out: dict[int, list[str]] = {}
        for node in nodes:
            out.setdefault(self.machine_of[host_of[node]], []).append(node)
        return out
