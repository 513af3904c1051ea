"""One lab over several hosts: each host's worker builds its share (emulation's own bring-up,
restricted to the nodes placed there, `emulation.lab.Part`), the links between hosts are
VXLAN wires (wires.py), and every host keeps its own journal, so `clean` on a host works
without the engine.

    lab = split.up(spec, engine, hosts, underlay)     # hosts: topology.partition.Host
    split.down(lab, engine)

Management: every host lays out the same plan (one subnet, chosen here); each forwards what
this machine sends its servers onto its management bridge from the gateway's address, and
this machine routes each server's address via its host.

This machine's side is a record, `<state>/split/<name>/split.json`, written before any host
builds and before any route is added: the spec, the placement, the wires, the underlay and
the routes. `attach` makes the lab again from it in another process (`testbed down`), and
`clean` removes what it names after a crash, here and, where the engine reaches them, on
the hosts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Mapping, Sequence

from orchestrator.emulation import kernel
from orchestrator.emulation.journal import LabState, check_name, global_lock, state_root, write_inside
from orchestrator.emulation.lab import management_subnet
from orchestrator.emulation.plan import LabPlan
from orchestrator.errors import DeployError, EmulationError, LabExists, LabNotFound, NodeNotFound, TestbedError
from orchestrator.hosts import parts
from orchestrator.hosts import wires as wires_lib
from orchestrator.hosts.engine import HostEngine
from orchestrator.hosts.exporters import HostExporters
from orchestrator.spec import LabSpec
from orchestrator.topology import Link, Topology, from_lab
from orchestrator.topology.partition import Host, Placement, check_underlay, place


RECORD = "split.json"
LOG = logging.getLogger("testbed.hosts")


def _state_dir(name: str) -> Path:
    """Where this machine keeps its side of split lab `name`."""
    return state_root() / "split" / check_name(name)


def exists(name: str) -> bool:
    return (_state_dir(name) / RECORD).is_file()


def names() -> list[str]:
    """The split labs this machine holds a record of."""
    root = state_root() / "split"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not p.is_symlink() and (p / RECORD).is_file())


def read_record(name: str) -> dict:
    try:
        data = json.loads((_state_dir(name) / RECORD).read_text())
    except FileNotFoundError:
        raise LabNotFound(f"no split lab named {name!r} is live") from None
    except (OSError, ValueError) as exc:
        raise EmulationError(f"split lab {name}: its record is unreadable ({exc}): `testbed clean {name}`") from None
    if not isinstance(data, dict):
        raise EmulationError(f"split lab {name}: its record is not one: `testbed clean {name}`")
    return data


def _save(lab: "SplitLab", status: str) -> None:
    _state_dir(lab.name).mkdir(mode=0o700, parents=True, exist_ok=True)
    write_inside(_state_dir(lab.name), RECORD, json.dumps({
        "status": status,
        "spec": lab.spec.model_dump(mode="json"),
        "hosts": [dataclasses.asdict(host) for host in lab.placement.hosts],
        "host_of": dict(lab.placement.host_of),
        "method": lab.placement.method,
        "wires": [[i, w.vni, *w.hosts] for i, w in zip(lab.link_index(w.link for w in lab.wires), lab.wires)],
        "underlay": {host: str(address) for host, address in lab.underlay.items()},
        "routes": [str(prefix) for prefix in lab.routes],
    }, indent=1))


class SplitState(LabState):
    """The orchestrator's side of a split lab's state, beside its record: its secret,
    deployment notes, and the faults injected from here (their journal and timeline; what a
    fault changes on a host is undone there by `clean` with the rest). Whatever runs on a
    host is journalled there, by that host."""

    def __init__(self, name: str, mirror: Callable[..., object] | None = None) -> None:
        self.name = check_name(name)
        self.dir = _state_dir(name)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.mirror = mirror

    def record_fault_event(self, fault_id: str, phase: str, action: str, target: str, params: dict | None = None,
                           at: float | None = None) -> None:
        """Journalled here, and mirrored to the lab's first host: its fabric exporter then gives
        the faults' gauges and counts (Grafana's annotations), once, as one lab's exporter does."""
        at = time.time() if at is None else at
        super().record_fault_event(fault_id, phase, action, target, params, at)
        if self.mirror is not None:
            try:
                self.mirror(fault_id, phase, action, target, params, at)
            except Exception as exc:  # noqa: BLE001 - a host lost or a broken link to it: the fault
                # acted and its own record is here; only the host's exporter misses it
                LOG.warning("fault %s %s not mirrored to the lab's first host: %s", fault_id, phase, exc)


@dataclass(frozen=True)
class SplitLab:
    """The lab as the orchestrator holds it once split: what deploy and the run driver ask of
    a lab (spec, topology, state, management addresses, each server's runtime), with every
    server's runtime work done on its host by the engine."""

    spec: LabSpec  # with the management subnet the orchestrator chose for every host
    topology: Topology
    placement: Placement
    wires: tuple[wires_lib.Wire, ...]
    plan: LabPlan  # names and management addresses, as every host laid them out
    engine: HostEngine
    routes: tuple[ipaddress.IPv4Network, ...] = ()  # this machine's, to each server's management address
    underlay: Mapping[str, ipaddress.IPv4Address] = dataclasses.field(default_factory=dict)  # host → its address

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def state(self) -> SplitState:
        first = self.placement.hosts[0].name
        return SplitState(self.spec.name, lambda *event: self.engine.run_on(first, parts.fault_event_part,
                                                                           self.spec.name, *event))

    def deploy_on_hosts(self, servers: list[str], roles: dict[str, str] | None, via: str, extravars: dict | None,
                        timeout: float, forks: int) -> None:
        """Ansible onto `servers`, each host at once running the project's playbook into its
        own servers' namespaces (parts.deploy_part), with this lab's secret."""
        from orchestrator.deploy.agents import lab_secret

        secret = parts.Hidden(lab_secret(self.state.dir))  # never shown in the engine's logs
        self._each_host(servers, "deploy", lambda here: (parts.deploy_part, self.name, here,
                                                        {s: r for s, r in (roles or {}).items() if s in here}, via,
                                                        secret, extravars, timeout, forks), timeout + 600.0)

    def undeploy_on_hosts(self, servers: list[str], via: str) -> None:
        self._each_host(servers, "undeploy", lambda here: (parts.undeploy_part, self.name, here, via), 600.0)

    def _each_host(self, servers: list[str], what: str, task: Callable[[list[str]], tuple], timeout: float) -> None:
        """`task(its servers)` = (work, *args) on every host holding some of `servers`, at
        once; every host that failed is named (its log is on that host)."""
        by_host = self._hosts_of(servers)
        failed = []
        with ThreadPoolExecutor(max(1, len(by_host))) as pool:
            futures = {host: pool.submit(self.engine.run_on, host, *task(here), timeout=timeout)
                       for host, here in by_host.items()}
            for host, future in futures.items():
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - whatever a host raised, named with its host
                    failed.append(f"host {host}: {what}: {exc if isinstance(exc, TestbedError) else repr(exc)}")
        if failed:
            raise DeployError("; ".join(failed))

    def down(self) -> dict[str, dict]:
        return clean(self.name, self.engine)

    def status(self) -> dict:
        """As `Lab.status`, from every host: each node as its host sees it; a link up when both
        its ends are (each on its host), its rate and counters from its first end's host."""
        reports = self._on_hosts(self.host_names, parts.status_part)
        host_of = self.placement.host_of
        first = next(iter(reports.values()))
        seen_by = {host: {n["name"]: n for n in report["nodes"]} for host, report in reports.items()}
        nodes = [seen_by[host_of[node]][node] for node in self.topology.nodes]
        links = []
        for index, link in enumerate(self.topology.links):
            seen = {host_of[link.a.node], host_of[link.b.node]}
            entry = dict(reports[host_of[link.a.node]]["links"][index])
            entry["state"] = "up" if all(reports[h]["links"][index]["state"] == "up" for h in seen) else "down"
            links.append(entry)
        return {**first, "status": read_record(self.name).get("status", "unknown"), "nodes": nodes, "links": links,
                "hosts": sorted(reports), "rxe": [d for report in reports.values() for d in report["rxe"]]}

    def fabric_collector(self) -> "HostFabric":
        """What an experiment reads the links' counters with: each host's, for its nodes."""
        return HostFabric(self)

    @property
    def fabric_exporters(self) -> HostExporters:
        """What `testbed monitor up` starts for the fabric: an exporter on every host."""
        return HostExporters(self.engine)

    def mgmt_address(self, server: str) -> ipaddress.IPv4Address:
        return self.plan.mgmt[server][1].ip

    def runtime_of(self, node: str) -> "HostRuntime":
        self.check_node(node)
        return HostRuntime(self.engine, self.placement.host_of[node])

    def exec(self, node: str, command: str | Sequence[str], timeout: float | None = None):
        """As `Lab.exec`: a command on a node (by its host), waited for."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return self.runtime_of(node).exec(self, node, argv, timeout)

    # -- faults (orchestrator.faults calls these, as on a Lab): each host acts on its nodes --
    def check_node(self, node: str) -> None:
        if node not in self.topology.nodes:
            raise NodeNotFound(f"lab {self.name} has no node {node!r}")

    def links_between(self, a: str, b: str) -> list[Link]:
        self.check_node(a)
        self.check_node(b)
        return self.topology.links_between(a, b)

    def _hosts_of(self, nodes: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node in nodes:
            out.setdefault(self.placement.host_of[node], []).append(node)
        return out

    def _on_hosts(self, hosts: Iterable[str], work: Callable, *args) -> dict[str, object]:
        """`work(name, *args)` on each of `hosts` at once: {host: result}."""
        hosts = sorted(set(hosts))
        with ThreadPoolExecutor(max(1, len(hosts))) as pool:
            futures = {host: pool.submit(self.engine.run_on, host, work, self.name, *args) for host in hosts}
            return {host: future.result() for host, future in futures.items()}

    def link_index(self, links: Iterable[Link]) -> list[int]:
        """Each link's place in the topology's links: how hosts and the record name it."""
        position = {(link.a, link.b): i for i, link in enumerate(self.topology.links)}
        return [position[(link.a, link.b)] for link in links]

    @property
    def host_names(self) -> list[str]:
        return [host.name for host in self.placement.hosts]

    def link_up(self, a: str, b: str) -> bool | None:
        """Whether every link between a and b is up at both ends (each asked on its host)."""
        if not self.topology.links_between(a, b):
            return None
        return all(self._on_hosts({self.placement.host_of[a], self.placement.host_of[b]}, parts.link_up_part, a, b).values())

    def set_links(self, changes: Sequence[tuple[Link, bool]], down_elsewhere: Collection[Link] = ()) -> int:
        """As `Lab.set_links`, on every host at once (each reroutes its nodes; a link between
        hosts is cut at both ends)."""
        indices = list(zip(self.link_index(link for link, _ in changes), (up for _, up in changes)))
        held = self.link_index(down_elsewhere)
        return sum(self._on_hosts(self.host_names, parts.set_links_part, indices, held).values())

    def set_link_shape(self, link: Link, rate_bps: int | None = None, delay_s: float = 0.0, jitter_s: float = 0.0,
                       loss_percent: float = 0.0, queue_too: bool = False) -> None:
        self._on_hosts({self.placement.host_of[link.a.node], self.placement.host_of[link.b.node]}, parts.shape_part,
                       self.link_index([link])[0], rate_bps, delay_s, jitter_s, loss_percent, queue_too)

    def fit_super_packets(self, smallest_transfer: int, servers: Collection[str] | None = None) -> int:
        """As `Lab.fit_super_packets`, on the hosts of `servers` (default every host; each
        sizes its servers' NICs)."""
        hosts = self.host_names if servers is None else {self.placement.host_of[s] for s in servers}
        chosen = None if servers is None else sorted(servers)
        return min(self._on_hosts(hosts, parts.super_packets_part, smallest_transfer, chosen).values())

    def server_processes(self, server: str) -> list[dict]:
        return self.engine.run_on(self.placement.host_of[server], parts.server_part, self.name, "processes", server)

    def signal_server(self, server: str, processes: list[dict], action: str) -> int:
        return self.engine.run_on(self.placement.host_of[server], parts.server_part, self.name, "signal", server,
                                  processes, action)

    def throttle_server(self, server: str, processes: list[dict], cpus: float | None, key: str) -> None:
        self.engine.run_on(self.placement.host_of[server], parts.server_part, self.name, "throttle", server,
                           processes, cpus, key)

    def revive_server(self, server: str) -> bool:
        return self.engine.run_on(self.placement.host_of[server], parts.server_part, self.name, "revive", server)

    def settle(self, nodes: Collection[str]) -> None:
        for host, here in self._hosts_of(nodes).items():
            self.engine.run_on(host, parts.settle_part, self.name, here)

    def run_nft(self, scripts: dict[str, str]) -> None:
        for host, nodes in self._hosts_of(scripts).items():
            self.engine.run_on(host, parts.nft_part, self.name, {node: scripts[node] for node in nodes})

    def connection_paths(self, port: int) -> dict[tuple[str, ipaddress.IPv4Address], list[str]]:
        """As `Lab.connection_paths`: every established connection from a server to `port`,
        with the path its 5-tuple takes, each hop asked where that hop is. All connections
        step together, one request per host and hop."""
        hosts = self.host_names
        servers = {host: [s.name for s in self.topology.servers if self.placement.host_of[s.name] == host]
                   for host in hosts}
        walks: list[_Walk] = []
        for host in hosts:
            for server, src, sport, dst, dport in self.engine.run_on(host, parts.connections_part, self.name,
                                                                        servers[host], port):
                target = self.topology.owner(dst)
                if target is None:
                    raise EmulationError(f"{server} has a connection to {dst}, which no node of lab {self.name} holds")
                walks.append(_Walk(server, src, sport, dst, dport, target.node, server, None, [server]))
        for _ in range(4 * len(self.topology.nodes)):
            active = [i for i, walk in enumerate(walks) if walk.node != walk.target]
            if not active:
                break
            asked: dict[str, list] = {}
            for i in active:
                walk = walks[i]
                asked.setdefault(self.placement.host_of[walk.node], []).append(
                    (i, walk.node, walk.dst, walk.src, walk.arrived_on, walk.sport, walk.dport))
            for host, queries in asked.items():
                for i, oif, gateway in self.engine.run_on(host, parts.route_part, self.name, queries):
                    walk = walks[i]
                    walk.path += self.topology.hop(walk.node, oif, gateway or walk.dst)
                    entry = self.topology.owner(gateway or walk.dst)
                    walk.node, walk.arrived_on = entry.node, entry.interface
        else:
            raise EmulationError(f"paths of lab {self.name} loop: {[w.path[:12] for w in walks if w.node != w.target][:1]}")
        return {(walk.server, walk.dst): walk.path for walk in walks}


def attach(name: str, engine: HostEngine) -> SplitLab:
    """The split lab `name` as its record describes it, its hosts' work done by `engine`."""
    data = read_record(name)
    try:
        spec = LabSpec.model_validate(data["spec"])
        topology = from_lab(spec)
        placement = Placement(tuple(Host(**host) for host in data["hosts"]), dict(data["host_of"]), data["method"])
        wires = tuple(wires_lib.Wire(topology.links[i], int(vni), (a, b)) for i, vni, a, b in data["wires"])
        routes = tuple(ipaddress.IPv4Network(prefix) for prefix in data["routes"])
        underlay = {str(host): ipaddress.IPv4Address(address) for host, address in data["underlay"].items()}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EmulationError(f"split lab {name}: its record does not describe a lab ({reason}): "
                             f"`testbed clean {name}`") from None
    plan = LabPlan(spec.name, topology, spec.servers.runtime, spec.management.subnet)
    return SplitLab(spec, topology, placement, wires, plan, engine, routes, underlay)


def vnis_taken(hosts: list[str]) -> set[int]:
    """The VNIs of the wires of every split lab recorded here that uses one of `hosts`."""
    taken = set()
    for other in names():
        try:
            data = read_record(other)
            taken |= {int(vni) for _, vni, a, b in data.get("wires", []) if a in hosts or b in hosts}
        except (EmulationError, TypeError, ValueError):
            continue
    return taken


@dataclass(frozen=True)
class HostFabric:
    """A split lab's link counters as monitoring.exporter.FabricCollector gives one lab's:
    every host reads the directions its nodes send on."""

    lab: SplitLab

    def link_families(self) -> list:
        merged: dict = {}
        for families in self.lab._on_hosts(self.lab.host_names, parts.families_part).values():
            for family, samples in families:
                merged.setdefault(family, []).extend(samples)
        return list(merged.items())

    def host_cpus(self) -> dict[str, dict[str, float]]:
        """Each host's CPU seconds so far (idle, busy): the machines the servers run on."""
        return dict(self.lab._on_hosts(self.lab.host_names, parts.cpu_part))

    def close(self) -> None:
        pass


@dataclass
class _Walk:
    """One connection's path being followed, hop by hop (SplitLab.connection_paths)."""

    server: str
    src: ipaddress.IPv4Address
    sport: int
    dst: ipaddress.IPv4Address
    dport: int
    target: str  # the node that holds dst
    node: str  # where the walk is
    arrived_on: str | None  # the interface it came in by (None: it starts here)
    path: list[str]


@dataclass(frozen=True)
class HostRuntime:
    """A split lab's server as deploy sees it: its runtime's work, done on its host."""

    engine: HostEngine
    host: str
    name: str = "host"
    containerised: bool = False

    def spawn(self, lab: SplitLab, node: str, argv: list[str], env: dict[str, str]) -> None:
        self.engine.run_on(self.host, parts.spawn_part, lab.spec.name, node, argv, env)
        return None  # journalled on its host, where `clean` kills it

    def exec(self, lab: SplitLab, node: str, argv: list[str], timeout: float | None = None):
        """A command on the node, run by its host; its exit code and output."""
        return self.engine.run_on(self.host, parts.exec_part, lab.spec.name, node, argv, timeout,
                                  timeout=(timeout or 600.0) + 30.0)

    def call(self, lab: SplitLab, node: str, argv: list[str]) -> int:
        """`testbed exec`: the command's output here once it ends (no terminal across hosts)."""
        import sys

        result = self.exec(lab, node, argv)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode


def up(spec: LabSpec, engine: HostEngine, hosts: list[Host], underlay: Mapping[str, ipaddress.IPv4Address],
       progress: Callable[[str, int, int], None] = lambda *_: None) -> SplitLab:
    """Build `spec` over `hosts` (each with a worker in `engine`), every host's share at once;
    on any failure every host cleans what it built, and the first error is raised."""
    topology = from_lab(spec)
    placement = place(topology, hosts, default_bps=spec.links.bandwidth)
    check_underlay(topology, placement, spec.links.bandwidth, spec.links.mtu)
    with global_lock():
        if exists(spec.name) or LabState(spec.name).exists():
            raise LabExists(f"lab {spec.name} is live already: `testbed down {spec.name}` first, or give another name")
        wires = tuple(wires_lib.plan(topology, placement, taken=vnis_taken([host.name for host in hosts])))
        # one management subnet for every host, free here, where the orchestrator routes to it
        subnet = management_subnet(spec, topology)
        spec = spec.model_copy(update={"management": spec.management.model_copy(update={"subnet": subnet})})
        plan = LabPlan(spec.name, topology, spec.servers.runtime, subnet)
        built = SplitLab(spec, topology, placement, wires, plan, engine, underlay=dict(underlay))
        _save(built, "building")  # before anything is built: `clean` finds it after a crash
    try:
        built = _build(built, engine, [host.name for host in hosts], progress)
    except BaseException:  # a host's failure, or Ctrl-C: every host cleans what it built, and so does this one
        clean(spec.name, engine)
        raise
    progress("up", 3, 3)
    return built


def _build(built: SplitLab, engine: HostEngine, host_names: list[str],
           progress: Callable[[str, int, int], None]) -> SplitLab:
    """Every host's share, at once, then this machine's management routes (each step
    recorded before it acts); the first host's error is raised once all have ended."""
    document = built.spec.model_dump(mode="json")
    progress(f"preparing {len(host_names)} hosts", 0, 3)
    for name in host_names:  # one host at a time: hosts that share an image store build it once
        engine.run_on(name, parts.prepare_part, document)
    progress(f"building on {len(host_names)} hosts", 1, 3)
    with ThreadPoolExecutor(len(host_names)) as pool:
        futures = [pool.submit(engine.run_on, name, parts.build_part, document, name, dict(built.placement.host_of),
                               built.wires, dict(built.underlay)) for name in host_names]
        errors = [future.exception() for future in futures]
    if any(errors):
        raise next(error for error in errors if error)
    built = dataclasses.replace(built, routes=tuple(ipaddress.IPv4Network(address.ip)
                                                    for _, address in built.plan.mgmt.values()))
    _save(built, "building")  # the routes, before they are added
    progress("management routes", 2, 3)
    _route_management(built.plan, built.placement, built.underlay)
    _save(built, "up")
    return built


def _route_management(plan: LabPlan, placement: Placement, underlay: Mapping[str, ipaddress.IPv4Address]) -> None:
    """This machine's route to each server's management address, via the server's host (which
    forwards it onto its management bridge from the gateway's address)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr, kernel.Netlink() as nl:
        towards = {}  # a host's underlay address → this machine's device that reaches it
        for address in set(underlay.values()):
            index = ipr.route("get", dst=str(address))[0].get_attr("RTA_OIF")
            towards[address] = ipr.link("get", index=index)[0].get_attr("IFLA_IFNAME")
        for server, (_, address) in plan.mgmt.items():
            host = underlay[placement.host_of[server]]
            kernel.add_route(nl, None, ipaddress.IPv4Network(address.ip), [(towards[host], host)])


def _stop_processes(state: SplitState) -> int:
    """What the lab started here (its Prometheus and Grafana), each if still that process (a
    journal line without its start time names no process)."""
    from orchestrator.emulation.cleanup import kill_recorded

    return sum(kill_recorded(entry.extra.get("pid"), entry.extra["start"]) for entry in state.journal()
               if entry.kind == "process" and isinstance(entry.extra.get("pid"), int)
               and isinstance(entry.extra.get("start"), str))


def _delete_routes(spec: dict, routes: list, underlay: dict) -> int:
    """This machine's routes a record names, each only if it is a host route inside the lab's
    management subnet via one of its hosts (a record is a file on disk: nothing else may go on
    its word)."""
    from pyroute2 import IPRoute

    try:
        subnet = ipaddress.IPv4Network(spec["management"]["subnet"])
        hosts = {str(ipaddress.IPv4Address(address)) for address in underlay.values()}
        prefixes = [ipaddress.IPv4Network(prefix) for prefix in routes]
    except (KeyError, TypeError, ValueError):
        return 0
    removed = 0
    with IPRoute() as ipr, kernel.Netlink() as nl:
        for prefix in prefixes:
            if prefix.prefixlen != 32 or not prefix.subnet_of(subnet):
                continue
            found = ipr.get_routes(family=2, dst=str(prefix.network_address), dst_len=32, table=254)
            gateways = {route.get_attr("RTA_GATEWAY") for route in found}
            gateways |= {hop.get_attr("RTA_GATEWAY") for route in found for hop in route.get_attr("RTA_MULTIPATH") or []}
            if found and gateways <= hosts | {None} and gateways & hosts:
                removed += kernel.delete_route(nl, None, prefix)
    return removed


def down(lab: SplitLab, engine: HostEngine | None = None) -> dict[str, dict]:
    """Every host's share of the lab removed (what each cleaned), and this machine's routes to
    it; hosts the engine has lost are named in the result and left for `testbed clean` there."""
    return clean(lab.name, engine or lab.engine)


def clean(name: str, engine: HostEngine | None) -> dict[str, dict]:
    """What split lab `name`'s record names removed: this machine's routes, then each host's
    share where `engine` reaches it (all of them, built or not: cleaning is idempotent), then
    the record. Hosts out of reach are named (`"lost": True`) and the record kept for them."""
    data = read_record(name)
    here = {"routes": _delete_routes(data.get("spec") or {}, data.get("routes") or [], data.get("underlay") or {}),
            "processes": _stop_processes(SplitState(name))}
    out: dict[str, dict] = {"here": here}
    hosts = [host.get("name") for host in data.get("hosts") or [] if isinstance(host, dict)]
    for host in hosts:
        if engine is None or engine.missing([host]):
            out[host] = {"lost": True}
            continue
        out[host] = engine.run_on(host, parts.clean_part, name)
    if not any(result.get("lost") for result in out.values()):
        shutil.rmtree(_state_dir(name), ignore_errors=True)  # the record, its secret, deployment notes
    else:
        data["routes"] = []
        write_inside(_state_dir(name), RECORD, json.dumps(data, indent=1))
    return out
