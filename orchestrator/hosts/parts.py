"""What each host of a split lab runs, as tasks of its worker (hosts/split.py sends them):
its share built, prepared and cleaned, and whatever the orchestrator asks of its nodes — a
command, an agent started, a route looked up, a fault's part, its status and counters. Each
attaches the host's own journal of the lab (`Lab.attach`) and acts on the nodes placed there
(`Lab.here`); the imports are inside, so a worker loads only what a task needs."""

from __future__ import annotations

from orchestrator.emulation import kernel
from orchestrator.spec import LabSpec


def status_part(name: str) -> dict:
    from orchestrator.emulation.lab import Lab

    return Lab.attach(name).status()


def families_part(name: str) -> list:
    """On a host: the link families its share's exporter would give now."""
    from orchestrator.emulation.lab import Lab
    from orchestrator.monitoring.exporter import FabricCollector

    collector = FabricCollector(Lab.attach(name))
    try:
        return collector.link_families()
    finally:
        collector.close()


def fault_event_part(name: str, fault_id: str, phase: str, action: str, target: str, params: dict | None,
                     at: float) -> None:
    """On a host: one phase of a fault injected from the orchestrator, in its share's fault log
    (what its exporter counts)."""
    from orchestrator.emulation.lab import Lab

    Lab.attach(name).state.record_fault_event(fault_id, phase, action, target, params, at)


def limits_part(_name: str) -> dict:
    """On a host: the machine it is (its kernel's boot id: hosts that are namespaces of one
    machine share it) and what that machine has for agents: MemAvailable bytes and the
    threads it can still start (experiment/machines.py)."""
    from orchestrator.emulation.capacity import host_limits, machine_id

    limits = host_limits()
    return {"machine": machine_id(), "memory": limits.mem_available_mib << 20, "tasks": limits.tasks_free}


def cpu_part(_name: str) -> dict[str, float]:
    """On a host: its CPU seconds so far (idle, busy), as the exporter reads them (whichever
    lab asks)."""
    from orchestrator.monitoring.exporter import host_cpu

    return host_cpu()


def _off_the_pool() -> None:
    """A task that may take long (a command, a playbook) leaves its worker's thread pool, so
    the host's other tasks (a fault, counters, status) do not wait behind it."""
    try:
        from distributed import secede

        secede()
    except (ImportError, ValueError):  # not in a worker's task (called directly)
        pass


def exec_part(name: str, node: str, argv: list[str], timeout: float | None):
    from orchestrator.emulation.lab import Lab

    _off_the_pool()
    return Lab.attach(name).exec(node, argv, timeout)


def spawn_part(name: str, node: str, argv: list[str], env: dict[str, str]) -> dict:
    """On a host: a long-running command on one of its servers, journalled in its journal."""
    from orchestrator.emulation.journal import Entry
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    started = lab.runtime_of(node).spawn(lab, node, argv, env)
    if started is not None:
        lab.state.record([Entry("process", f"spawned-{node}-{started['pid']}", started)])
    return started or {}


class Hidden(bytes):
    """A secret handed to a host's task: the engine may log a failed task's arguments."""

    def __repr__(self) -> str:
        return "<hidden>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "<hidden>"


def deploy_part(name: str, servers: list[str], roles: dict[str, str], via: str, secret: bytes,
                extravars: dict | None, timeout: float, forks: int) -> int:
    """On a host: the project's Ansible deploy (`via`: nsenter or ssh) onto its servers of the
    lab, from here into its own namespaces, supervised and healthy, with the orchestrator's
    secret (so the tokens are the ones its calls carry); journalled in the host's journal,
    so `clean` on the host stops them."""
    from orchestrator.deploy import deploy
    from orchestrator.deploy.agents import share_secret
    from orchestrator.emulation.lab import Lab

    _off_the_pool()
    lab = Lab.attach(name)
    share_secret(lab.state.dir, bytes(secret))
    # the orchestrator checked the lab's faults (this host's log is a copy at most)
    deploy(lab, servers, roles, via=via, extravars=extravars, timeout=timeout, forks=forks, faults_checked=True)
    return len(servers)


def undeploy_part(name: str, servers: list[str], via: str) -> int:
    """On a host: its servers' agents stopped and removed (the undeploy playbook)."""
    from orchestrator.deploy import undeploy
    from orchestrator.emulation.lab import Lab

    _off_the_pool()
    undeploy(Lab.attach(name), servers, via=via)
    return len(servers)


def prepare_part(document: dict) -> None:
    """On a host: what its runtime needs before the lab (Docker's engine and image)."""
    from orchestrator.emulation.runtimes import runtime_named

    spec = LabSpec.model_validate(document)
    runtime_named(spec.servers.runtime).prepare(spec, lambda *_: None)


def build_part(document: dict, host: str, host_of: dict, wires: tuple, underlay: dict) -> dict:
    """On a host (a task of its worker): its share of the lab, journalled here."""
    from orchestrator.emulation.lab import Lab, Part

    spec = LabSpec.model_validate(document)
    lab = Lab.up(spec, part=Part(host, host_of, tuple(wires), underlay))
    return {"host": host, "nodes": sum(1 for node in host_of.values() if node == host), "state": str(lab.state.dir)}


def clean_part(name: str) -> dict:
    from orchestrator.emulation import cleanup

    return cleanup.clean_lab(name)


def connections_part(name: str, servers: list[str], port: int) -> list[tuple]:
    """On a host: (server, local address, port, remote address, port) of its servers'
    established connections to `port`."""
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    spaces = {lab.plan.namespaces[server]: server for server in servers}
    found = kernel.in_namespaces(spaces, lambda _: kernel.tcp_connections(port))
    return [(spaces[ns], *connection) for ns, connections in found.items() for connection in connections]


def route_part(name: str, queries: list[tuple]) -> list[tuple]:
    """On a host: for each (id, node, dst, src, arrived on, sport, dport), the interface and
    gateway that node's routing picks for that flow."""
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    out = []
    with kernel.Netlink() as nl:
        for i, node, dst, src, iif, sport, dport in queries:
            ns = lab.plan.namespaces[node]
            oif, gateway = kernel.route_get(nl, ns, dst, src, nl.index(ns, iif) if iif else None, sport, dport)
            out.append((i, nl.name(ns, oif), gateway))
    return out


def link_up_part(name: str, a: str, b: str) -> bool:
    from orchestrator.emulation.lab import Lab

    return bool(Lab.attach(name).link_up(a, b))


def set_links_part(name: str, changes: list[tuple[int, bool]], held: list[int]) -> int:
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    links = lab.topology.links
    return lab.set_links([(links[i], up) for i, up in changes], [links[i] for i in held])


def shape_part(name: str, link: int, *shape) -> None:
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    lab.set_link_shape(lab.topology.links[link], *shape)


def super_packets_part(name: str, smallest_transfer: int, servers: list[str] | None = None) -> int:
    from orchestrator.emulation.lab import Lab

    return Lab.attach(name).fit_super_packets(smallest_transfer, servers)


def server_part(name: str, what: str, server: str, *args):
    """A server's processes listed, signalled or throttled, or the server revived, on its host."""
    from orchestrator.emulation.lab import Lab

    lab = Lab.attach(name)
    return {"processes": lab.server_processes, "signal": lab.signal_server, "revive": lab.revive_server,
            "throttle": lab.throttle_server}[what](
        server, *args)


def settle_part(name: str, nodes: list[str]) -> None:
    from orchestrator.emulation.lab import Lab

    Lab.attach(name).settle(nodes)


def nft_part(name: str, scripts: dict[str, str]) -> None:
    from orchestrator.emulation.lab import Lab

    Lab.attach(name).run_nft(scripts)
