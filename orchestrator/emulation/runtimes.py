"""What a server runs in, registered in one table: RUNTIMES, filled by `register_runtime`.

    netns    a bare network namespace: the host's files, the host's processes in it
    docker   a container (the lab's image), whose namespace is attached under the same name

A lab's `servers.runtime` names the entry its servers use; switches and routers always run
in netns (they forward, nothing runs on them), so ask `plan.runtime_of(node)` (or
`lab.runtime_of(node)`), never the lab's runtime name. Every method takes the live lab and
the node, so a runtime holds no state of its own and one object serves every lab.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from orchestrator.emulation import cleanup, cpu_limit, docker_engine, images, kernel
from orchestrator.emulation.journal import Entry
from orchestrator.emulation.plan import OPTIONAL_SYSCTLS, LabPlan
from orchestrator.errors import EmulationError, PluginError

if TYPE_CHECKING:
    from orchestrator.spec import LabSpec
# Lab and _Builder (emulation/lab.py, which imports this module) are named in annotations only.


@dataclass
class ExecResult:
    returncode: int
    stdout: str
    stderr: str = ""


class ServerRuntime(Protocol):
    name: str
    # the server is a container: the image's files (not the host's), processes Docker owns,
    # and a namespace that a restart replaces under the same name
    containerised: bool

    def prepare(self, spec: LabSpec, progress: Callable[[str, int, int], None]) -> None:
        """Before anything of the lab exists: refuse, or fetch, what the runtime needs."""

    def create(self, build: _Builder, nodes: list[str]) -> None:
        """The bring-up step: make `nodes`' namespaces, journalled first (build.record),
        counted with build.made(stage, count)."""

    def exec(self, lab: Lab, node: str, argv: list[str], timeout: float | None = None) -> ExecResult:
        """Run a command on the node and wait for it."""

    def call(self, lab: Lab, node: str, argv: list[str]) -> int:
        """Run a command on the node, its output straight to ours (`testbed exec`); its exit code."""

    def spawn(self, lab: Lab, node: str, argv: list[str], env: dict[str, str]) -> dict | None:
        """Start a long-running command on the node without waiting; {pid, start} of a host
        process for the journal, or None when the runtime owns it."""

    def command_prefix(self, lab: Lab, node: str) -> list[str]:
        """argv prefix that runs a host program in the node's network and hostname."""

    def start_module(self, lab: Lab, node: str, module: str, env: dict[str, str], **popen) -> subprocess.Popen:
        """`python -m module` on the node with the server's own Python and files (the host's
        for a namespace, the image's in a container), its stdio ours (`popen`: Popen's
        stdin, stdout, stderr, text...). Closing its stdin is how to stop it everywhere."""

    def server_processes(self, lab: Lab, server: str) -> list[dict]:
        """{pid, start} of what runs on the server, for `signal` later ([]: the runtime's own)."""

    def signal(self, lab: Lab, server: str, processes: list[dict], action: str) -> int:
        """stop | cont | kill what runs on the server; how many were signalled."""

    def throttle(self, lab: Lab, server: str, processes: list[dict], cpus: float | None, key: str) -> None:
        """Limit what runs on the server (`processes`, as server_processes listed them) to
        `cpus` of one core; None lifts the limit `key` set."""

    def revive(self, lab: Lab, server: str) -> bool:
        """Start a crashed server again, its interfaces moved into its new namespace (the lab
        configures them then); False when there was nothing to start."""

    def paused(self, lab: Lab, servers: list[str]) -> dict[str, str]:
        """Those of `servers` the runtime itself holds paused: server → why, and the fix."""


class NetnsRuntime:
    name = "netns"
    containerised = False

    def prepare(self, spec: LabSpec, progress: Callable[[str, int, int], None]) -> None:
        pass

    def create(self, build: _Builder, nodes: list[str]) -> None:
        spaces = [build.plan.namespaces[n] for n in nodes]
        build.record([Entry("netns", space, {}) for space in spaces])
        kernel.create_namespaces(spaces)
        build.made("namespaces", len(nodes))

    def exec(self, lab: Lab, node: str, argv: list[str], timeout: float | None = None) -> ExecResult:
        result = subprocess.run(self.command_prefix(lab, node) + argv, capture_output=True, text=True, timeout=timeout)
        return ExecResult(result.returncode, result.stdout, result.stderr)

    def call(self, lab: Lab, node: str, argv: list[str]) -> int:
        return subprocess.call(self.command_prefix(lab, node) + argv)

    def spawn(self, lab: Lab, node: str, argv: list[str], env: dict[str, str]) -> dict | None:
        proc = subprocess.Popen(self.command_prefix(lab, node) + argv, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=os.environ | env)
        return {"pid": proc.pid, "start": cleanup.process_start_time(proc.pid)}

    def command_prefix(self, lab: Lab, node: str) -> list[str]:
        return kernel.in_netns(lab.namespace(node))

    def start_module(self, lab: Lab, node: str, module: str, env: dict[str, str], **popen) -> subprocess.Popen:
        return subprocess.Popen(self.command_prefix(lab, node) + [sys.executable, "-m", module],
                                env=os.environ | env, start_new_session=True, **popen)

    def server_processes(self, lab: Lab, server: str) -> list[dict]:
        found = []
        for pid in kernel.pids_in([lab.plan.namespaces[server]]):
            try:
                found.append({"pid": pid, "start": cleanup.process_start_time(pid)})
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue  # ended meanwhile
        groups = cpu_limit.current_groups([p["pid"] for p in found])  # where server-slow's undo puts them back
        return [{**p, "group": groups[str(p["pid"])]} if str(p["pid"]) in groups else p for p in found]

    def signal(self, lab: Lab, server: str, processes: list[dict], action: str) -> int:
        """Only the recorded processes that are still the same processes (not a pid's reuse)."""
        sig = {"stop": signal.SIGSTOP, "cont": signal.SIGCONT, "kill": signal.SIGKILL}[action]
        sent = 0
        for proc in processes:
            if cleanup.same_process(proc["pid"], proc["start"]):
                try:
                    os.kill(proc["pid"], sig)
                    sent += 1
                except ProcessLookupError:
                    pass
        return sent

    def throttle(self, lab: Lab, server: str, processes: list[dict], cpus: float | None, key: str) -> None:
        """The recorded processes still alive in a cpu cgroup of their own (cpu_limit); lifted,
        each goes back to the group it was listed in."""
        if cpus is None:
            cpu_limit.release(lab.plan.id, key, {str(p["pid"]): p["group"] for p in processes if p.get("group")})
        else:
            alive = [p["pid"] for p in processes if cleanup.same_process(p["pid"], p["start"])]
            cpu_limit.throttle(lab.plan.id, key, alive, cpus)

    def revive(self, lab: Lab, server: str) -> bool:
        return False  # the namespace outlives its processes: nothing to start

    def paused(self, lab: Lab, servers: list[str]) -> dict[str, str]:
        return {}  # its processes stop one by one: deploy looks for its agents' (deploy/answering.py)


class DockerRuntime:
    name = "docker"
    containerised = True

    def prepare(self, spec: LabSpec, progress: Callable[[str, int, int], None]) -> None:
        docker_engine.client()
        images.ensure(spec.servers.image, lambda line: progress(f"image: {line}", 0, 0))

    def create(self, build: _Builder, nodes: list[str]) -> None:
        plan, spec = build.plan, build.spec
        build.record([Entry("container", plan.container_name(n), {}) for n in nodes]
                     + [Entry("netns", plan.namespaces[n], {}) for n in nodes])
        servers = spec.servers
        specs = [
            {
                "name": plan.container_name(n),
                "hostname": n,
                "image": servers.image,
                "labels": {docker_engine.LAB_LABEL: spec.name, docker_engine.NODE_LABEL: n},
                "nano_cpus": int(servers.cpus * 1e9) if servers.cpus else None,
                "mem_limit": servers.memory,
                "rdma": spec.rdma == "softroce",
            }
            for n in nodes
        ]
        by_container = {plan.container_name(n): n for n in nodes}

        def attached(container: str, pid: int) -> None:
            kernel.attach_namespace(plan.namespaces[by_container[container]], pid)
            build.made("containers", 1)
            build.checkpoint()  # in a starter thread: stops the containers not yet started

        docker_engine.run_containers(specs, on_started=attached)

    def exec(self, lab: Lab, node: str, argv: list[str], timeout: float | None = None) -> ExecResult:
        code, output = docker_engine.exec_in(lab.plan.container_name(node), argv)  # `docker exec`: no timeout
        return ExecResult(code, output.decode(errors="replace"))

    def call(self, lab: Lab, node: str, argv: list[str]) -> int:
        code, _ = docker_engine.exec_in(lab.plan.container_name(node), argv,
                                        stream=lambda chunk: sys.stdout.buffer.write(chunk) and sys.stdout.flush())
        return code

    def spawn(self, lab: Lab, node: str, argv: list[str], env: dict[str, str]) -> dict | None:
        docker_engine.exec_detached(lab.plan.container_name(node), argv, env)
        return None  # Docker owns it: it goes with the container

    def command_prefix(self, lab: Lab, node: str) -> list[str]:
        """The container's network and hostname, not its filesystem: host tools (iperf3,
        tcpdump) work the same on every runtime."""
        pid = docker_engine.container_pid(lab.plan.container_name(node))
        if pid is None:
            raise EmulationError(f"container of {node} is not running")
        return ["nsenter", "-t", str(pid), "-n", "-u", "--"]

    def start_module(self, lab: Lab, node: str, module: str, env: dict[str, str], **popen) -> subprocess.Popen:
        """`docker exec -i` in the container, with the image's python3 (its venv comes first on
        PATH); the exec'd process sees its stdin close when this client's does."""
        settings = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        return subprocess.Popen(["docker", "exec", "-i", *settings, lab.plan.container_name(node), "python3", "-m", module],
                                start_new_session=True, **popen)

    def server_processes(self, lab: Lab, server: str) -> list[dict]:
        return []  # Docker's: `signal` acts on the whole container

    def signal(self, lab: Lab, server: str, processes: list[dict], action: str) -> int:
        """docker pause / unpause / kill of the server's container."""
        return docker_engine.container_action(lab.plan.container_name(server), action)

    def throttle(self, lab: Lab, server: str, processes: list[dict], cpus: float | None, key: str) -> None:
        """`docker update --cpus` of the server's container (its own cgroup)."""
        docker_engine.container_cpus(lab.plan.container_name(server), cpus)

    def revive(self, lab: Lab, server: str) -> bool:
        """A container that starts gets a fresh namespace from Docker: the server's
        interfaces, kept alive in the old one (which its name still holds), move over."""
        pid = docker_engine.start_container(lab.plan.container_name(server))
        if pid is None:
            return False  # running already
        space = lab.plan.namespaces[server]
        with kernel.Netlink() as old:
            moving = [name for name in kernel.links_in(old, space) if name != "lo"]  # opens a socket in it
            # the name now holds the new namespace; `old` still talks to the old one, which
            # goes with its last reference once its interfaces are out
            kernel.delete_namespace(space)
            kernel.attach_namespace(space, pid)
            # before the interfaces arrive: they take the namespace's defaults (rp_filter, RPS)
            kernel.in_namespaces([space], lambda _: kernel.write_sysctls(lab.sysctls(server), OPTIONAL_SYSCTLS))
            kernel.move_links(old, space, moving, pid)
        return True

    def paused(self, lab: Lab, servers: list[str]) -> dict[str, str]:
        names = {lab.plan.container_name(s): s for s in servers}
        return {names[c["name"]]: f"its container {c['name']} is paused (docker pause): `docker unpause {c['name']}`"
                for c in docker_engine.lab_containers(lab.name) if c["name"] in names and c.get("state") == "paused"}


RUNTIMES: dict[str, ServerRuntime] = {}


def register_runtime(name: str, runtime: ServerRuntime) -> None:
    """Add a server runtime to the table (built-ins and plugins alike); a taken name is refused."""
    if name in RUNTIMES:
        raise PluginError(f"server runtime {name} is registered already: give yours another name")
    RUNTIMES[name] = runtime


def runtime_named(name: str) -> ServerRuntime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise EmulationError(f"no server runtime {name!r}: one of {', '.join(RUNTIMES)} "
                             "(a plugin's must be loaded before its labs are used)") from None


def server_runtime(plan: LabPlan) -> ServerRuntime:
    """The runtime of a lab's servers: its `runtime`, from the table."""
    return runtime_named(plan.runtime)


def runtime_of(plan: LabPlan, node: str) -> ServerRuntime:
    """What `node` runs in: the servers' runtime, or netns for a switch whatever the lab's."""
    return server_runtime(plan) if plan.topology.nodes[node].is_server else runtime_named("netns")


def by_runtime(plan: LabPlan, nodes: Iterable[str]) -> list[tuple[ServerRuntime, list[str]]]:
    """`nodes` grouped by their runtime, in the table's order: netns (every switch's) first,
    as bring-up has always made namespaces before containers."""
    groups: dict[int, tuple[ServerRuntime, list[str]]] = {}  # by identity: a runtime need not hash
    for node in nodes:
        runtime = runtime_of(plan, node)
        groups.setdefault(id(runtime), (runtime, []))[1].append(node)
    order = {id(runtime): n for n, runtime in enumerate(RUNTIMES.values())}
    return sorted(groups.values(), key=lambda group: order.get(id(group[0]), len(order)))


register_runtime("netns", NetnsRuntime())
register_runtime("docker", DockerRuntime())
