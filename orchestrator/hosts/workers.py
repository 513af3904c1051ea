"""The hosts split labs run on, as `testbed hosts up|down|status` keeps them: the engine's
scheduler beside the orchestrator, and on every host one root worker (dask_engine.worker_argv)
under daemontools' supervise, installed by Ansible (playbooks/hosts.yml, role `worker`) like
the agents are. One set of hosts per machine, its state in `<state>/engine/`:

    engine.json   the hosts file, the scheduler's address and process, the svscans started here
    tls/          the hosts' CA and every party's certificate (hosts/tls.py)
    hosts/<name>/ a host faked as a namespace of this machine (`netns:`): its worker's files,
                  its svscan's directory and its own state (labs' journals)

A real host keeps its worker in /var/lib/testbed-worker and is supervised by the svscan of
Debian's daemontools-run (/etc/service); its python must have testbed installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.deploy.playbook import Progress
from orchestrator.emulation import kernel
from orchestrator.emulation.cleanup import process_start_time, same_process
from orchestrator.emulation.journal import global_lock, state_root, write_inside
from orchestrator.emulation.plan import NAMESPACE_PREFIX
from orchestrator.errors import BadUsage, TestbedError
from orchestrator.hosts.dask_engine import start_scheduler, worker_argv
from orchestrator.hosts.engine import ENGINES, HostEngine
from orchestrator.hosts.tls import Credentials, credentials
from orchestrator.spec.hosts import HostSpec, HostsSpec

REAL_HOME = Path("/var/lib/testbed-worker")
REAL_SERVICE_DIR = Path("/etc/service")  # Debian's daemontools-run
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOIN_TIMEOUT = 90.0


class HostsError(TestbedError):
    """The hosts could not be brought up, reached or taken down."""


def engine_dir() -> Path:
    return state_root() / "engine"


def _record_file() -> Path:
    return engine_dir() / "engine.json"


def record() -> dict | None:
    """What `hosts up` wrote, or None when no hosts are up."""
    try:
        data = json.loads(_record_file().read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HostsError(f"{_record_file()}: unreadable ({exc}): `testbed hosts down` removes it") from None
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        raise HostsError(f"{_record_file()}: not a hosts record: `testbed hosts down` removes it")
    return data


def _write(data: dict) -> None:
    write_inside(engine_dir(), "engine.json", json.dumps(data, indent=1))


def home(host: HostSpec) -> Path:
    """Where the host's worker keeps its files, on that host."""
    return engine_dir() / "hosts" / host.name if host.netns else REAL_HOME


def host_state(host: HostSpec) -> Path | None:
    """A faked host's own state directory (a real host has the default one)."""
    return home(host) / "state" if host.netns else None


def netns_prefix(host: HostSpec) -> str | None:
    """How a faked host begins the names of its lab namespaces (the machine's are shared)."""
    return f"{NAMESPACE_PREFIX}{host.name}-" if host.netns else None


def _listen_address(spec: HostsSpec) -> str:
    """Where the scheduler listens: the hosts file's `scheduler`, or this machine's source
    address towards the first host."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        local = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=2)}
        if spec.scheduler is not None:
            if str(spec.scheduler) not in local:
                raise BadUsage(f"scheduler: {spec.scheduler} is not an address of this machine: give one the hosts "
                               "reach, or leave it out")
            return str(spec.scheduler)
        first = spec.hosts[0]
        try:
            source = ipr.route("get", dst=str(first.address))[0].get_attr("RTA_PREFSRC")
        except Exception as exc:  # pyroute2's NetlinkError: no route
            raise BadUsage(f"hosts.0.address: this machine has no route to {first.address} ({exc}): connect the "
                           "hosts' network, or give `scheduler:`") from None
    if source is None or source not in local:
        raise BadUsage(f"hosts.0.address: no address of this machine faces {first.address}: give `scheduler:`")
    return source


def _check_netns(spec: HostsSpec) -> None:
    present = set(kernel.list_namespaces(""))
    for index, host in enumerate(spec.hosts):
        if host.netns is not None and host.netns not in present:
            raise BadUsage(f"hosts.{index}.netns: no network namespace {host.netns!r} on this machine: make it "
                           "(ip netns add) or leave netns out for a real host")


def _inventory(spec: HostsSpec, address: str, tls: Path) -> dict:
    """The Ansible inventory of the hosts: how each is reached, and its worker's command."""
    hosts = {}
    for host in spec.hosts:
        where = home(host)
        python = host.python or sys.executable
        party = Credentials(where / "tls" / "ca.pem", where / "tls" / "worker.pem", where / "tls" / "worker.key")
        env = {"PATH": PATH}
        if host.netns:
            env |= {"TESTBED_STATE": str(host_state(host)), "TESTBED_NETNS_PREFIX": netns_prefix(host)}
            reach = {"ansible_connection": "testbed_nsenter", "testbed_netns": host.netns,
                     "ansible_python_interpreter": sys.executable}
            service_dir = where / "scan"
        else:
            reach = {"ansible_host": str(host.address), "ansible_user": "root",
                     "ansible_python_interpreter": "/usr/bin/python3"}
            service_dir = REAL_SERVICE_DIR
        hosts[host.name] = reach | {
            "worker_home": str(where), "worker_service_dir": str(service_dir), "worker_python": python,
            "worker_env": env, "worker_command": shlex.join(worker_argv(address, host.name, party, python)),
            "worker_tls_sources": {"ca.pem": str(tls / "ca.pem"), "worker.pem": str(tls / f"worker-{host.name}.pem"),
                                   "worker.key": str(tls / f"worker-{host.name}.key")},
        }
    return {"all": {"hosts": hosts}}


def _run_playbook(name: str, spec: HostsSpec, data: dict, progress: Progress):
    from orchestrator.deploy import inventory as inventory_lib, playbook

    path = write_inside(engine_dir(), "inventory.yaml",
                        inventory_lib.to_yaml(_inventory(spec, data["address"], engine_dir() / "tls")))
    return playbook.run(engine_dir() / "ansible", name, path, len(spec.hosts), progress)


def _start_svscan(host: HostSpec) -> dict:
    """A faked host's supervisor, in its namespace (a real host runs its own)."""
    scan = home(host) / "scan"
    scan.mkdir(parents=True, exist_ok=True)
    with open(home(host) / "svscan.log", "ab") as log:
        process = subprocess.Popen(kernel.in_netns(host.netns) + ["svscan", str(scan)], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, start_new_session=True)
    return {"pid": process.pid, "start": process_start_time(process.pid)}


def _kill(process: dict | None) -> None:
    if process and same_process(process["pid"], process["start"]):
        try:
            os.killpg(process["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass


def connect(timeout: float = 30.0) -> tuple[HostEngine, HostsSpec]:
    """The engine of the hosts that are up, and their hosts file."""
    data = record()
    if data is None:
        raise HostsError("no hosts are up: `testbed hosts up FILE` starts them")
    spec = HostsSpec.model_validate(data["hosts"])
    return ENGINES["dask"](engine_dir(), data["address"], timeout=timeout), spec


def up(spec: HostsSpec, progress: Progress) -> dict:
    """The scheduler here and a supervised worker on every host, each host joined; on failure
    everything started is stopped again. Up already with the same hosts: checked, and any
    missing worker installed again."""
    with global_lock():
        data = record()
        if data is not None and data["hosts"] != spec.model_dump(mode="json"):
            raise BadUsage(f"other hosts are up ({', '.join(h['name'] for h in data['hosts']['hosts'])}): "
                           "`testbed hosts down` first")
        _check_netns(spec)
        fresh = data is None
        if fresh:
            engine_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
            data = {"hosts": spec.model_dump(mode="json"), "address": None, "scheduler": None, "svscans": {}}
            _write(data)
        try:
            if not (data["scheduler"] and same_process(data["scheduler"]["pid"], data["scheduler"]["start"])):
                progress("scheduler", 0, len(spec.hosts) + 1)
                process, data["address"] = start_scheduler(engine_dir(), _listen_address(spec))
                data["scheduler"] = {"pid": process.pid, "start": process_start_time(process.pid)}
                _write(data)
            for host in spec.hosts:
                credentials(engine_dir() / "tls", f"worker-{host.name}")
                svscan = data["svscans"].get(host.name)
                if host.netns and not (svscan and same_process(svscan["pid"], svscan["start"])):
                    data["svscans"][host.name] = _start_svscan(host)
                    _write(data)
            result = _run_playbook("hosts.yml", spec, data, progress)
            if result.failures or result.status != "successful":
                raise result.error()
            engine, _ = connect()
            try:
                progress("hosts joining", len(spec.hosts), len(spec.hosts) + 1)
                engine.wait_for([host.name for host in spec.hosts], timeout=JOIN_TIMEOUT)
            finally:
                engine.close()
        except BaseException:
            if fresh:
                _teardown(spec, data, lambda *_: None)
            raise
        return {"address": data["address"], "hosts": [host.name for host in spec.hosts],
                "changed": sum(result.changed.values()), "seconds": round(result.seconds, 1)}


def status() -> dict:
    """The scheduler's address and whether it runs; each host joined or missing, and the
    labs whose share it holds."""
    data = record()
    if data is None:
        return {"up": False, "hosts": {}}
    spec = HostsSpec.model_validate(data["hosts"])
    scheduler = data.get("scheduler") or {}
    running = bool(scheduler) and same_process(scheduler.get("pid", 0), scheduler.get("start", ""))
    hosts = {host.name: {"address": str(host.address), "joined": False, "labs": []} for host in spec.hosts}
    if running:
        engine, _ = connect(timeout=10.0)
        try:
            joined = set(engine.hosts())
            for name, entry in hosts.items():
                if name in joined:
                    entry["joined"] = True
                    entry["labs"] = engine.run_on(name, labs_here, timeout=30.0)
        finally:
            engine.close()
    return {"up": True, "address": data["address"], "scheduler_running": running, "hosts": hosts}


def labs_here() -> list[str]:
    """On a host: the labs whose share it holds."""
    from orchestrator.emulation.journal import LabState

    return [state.name for state in LabState.all()]


def down(progress: Progress, force: bool = False) -> dict:
    """Every worker stopped and removed, the scheduler stopped, the state gone. Refused while
    a host holds a lab's share, unless `force`: then every host first cleans the labs it holds."""
    with global_lock():
        try:
            data = record()
        except HostsError:  # what it started cannot be known: the record goes
            shutil.rmtree(engine_dir(), ignore_errors=True)
            return {"stopped": [], "removed": str(engine_dir())}
        if data is None:
            return {"stopped": []}
        spec = HostsSpec.model_validate(data["hosts"])
        held = {name: entry["labs"] for name, entry in status()["hosts"].items() if entry["labs"]}
        if held and not force:
            labs = sorted({lab for names in held.values() for lab in names})
            raise BadUsage(f"hosts hold labs {', '.join(labs)}: `testbed down` them first (or hosts down --force)")
        if held:
            from orchestrator.hosts import parts, split

            engine, _ = connect(timeout=10.0)
            try:
                for lab in split.names():  # this machine's side too: its routes and records
                    split.clean(lab, engine)
                for host, labs in held.items():
                    for lab in labs:
                        engine.run_on(host, parts.clean_part, lab)
            finally:
                engine.close()
        return _teardown(spec, data, progress)


def _teardown(spec: HostsSpec, data: dict, progress: Progress) -> dict:
    """Stop and remove what `up` started, as far as it got; hosts Ansible could not reach are
    named (their worker stays until they are reachable again)."""
    unreached: list[str] = []
    if data.get("address"):
        result = _run_playbook("hosts-down.yml", spec, data, progress)
        unreached = sorted({failure.host for failure in result.failures})
    for svscan in data.get("svscans", {}).values():
        _kill(svscan)
    _kill(data.get("scheduler"))
    shutil.rmtree(engine_dir(), ignore_errors=True)  # faked hosts' homes too: they live under it
    return {"stopped": [h.name for h in spec.hosts if h.name not in unreached], "unreached": unreached}
