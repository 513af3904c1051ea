"""The one place that talks to Docker: the engine, images and containers (docker SDK).

Containers are lab servers: started with no Docker network at all (`network_mode=none`,
so no docker0 interface can carry traffic past the emulated fabric), labelled with their
lab and node, limited in CPU and memory as the lab file says. The emulation layer wires
their network namespace from outside, by PID.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from orchestrator.errors import EmulationError, HostError

LAB_LABEL, NODE_LABEL = "testbed.lab", "testbed.node"
DOCKERD_LOG = Path("/var/log/testbed-dockerd.log")
_client: docker.DockerClient | None = None


def client(start: bool = True) -> docker.DockerClient:
    """A client of a running engine; starts dockerd (idempotently) if it is installed."""
    global _client
    if _client is not None:
        return _client
    try:
        candidate = docker.from_env(timeout=120)
        candidate.ping()
        _client = candidate
        return _client
    except DockerException:
        if not start:
            raise HostError("the Docker engine is not reachable: start dockerd (or run ./setup.sh)") from None
    start_engine()
    return client(start=False)


def engine_reachable() -> bool:
    try:
        client(start=False)
        return True
    except HostError:
        return False


def start_engine(timeout: float = 30.0) -> None:
    """Start dockerd in the background if it is not running (nothing else will on CI)."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise HostError("Docker is not installed: apt-get install docker.io (or run ./setup.sh)")
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen([dockerd], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            docker.from_env(timeout=5).ping()
            return
        except DockerException:
            time.sleep(0.3)
    raise HostError(f"dockerd did not start within {timeout:.0f} s: see {DOCKERD_LOG}")


# -- images ------------------------------------------------------------------------------------
def image_label(reference: str, label: str) -> str | None:
    """A label of a local image, or None if the image is absent."""
    try:
        return (client().images.get(reference).labels or {}).get(label)
    except ImageNotFound:
        return None


def image_exists(reference: str) -> bool:
    try:
        client().images.get(reference)
        return True
    except ImageNotFound:
        return False


def import_image(tarball: Path, reference: str, changes: list[str] | None = None) -> None:
    """`docker import`: a root filesystem tarball becomes an image."""
    repository, _, tag = reference.partition(":")
    with open(tarball, "rb") as data:
        try:
            client().api.import_image_from_data(
                data.read(), repository=repository, tag=tag or "latest", changes=changes
            )
        except APIError as exc:
            raise EmulationError(f"docker import of {tarball} failed: {exc.explanation}") from None


def build_image(
    context: Path, reference: str, labels: dict[str, str], on_line: Callable[[str], None]
) -> None:
    """`docker build` of a context directory, streaming its output lines to `on_line`."""
    api = client().api
    stream = api.build(path=str(context), tag=reference, labels=labels, rm=True, forcerm=True, decode=True)
    for chunk in stream:
        if "stream" in chunk:
            for line in chunk["stream"].splitlines():
                if line.strip():
                    on_line(line)
        if "error" in chunk:
            raise EmulationError(f"building image {reference} failed: {chunk['error'].strip()}")


def prune_replaced(label: str) -> int:
    """Remove the untagged images that carry `label` (any value), which no container uses:
    those a rebuild of one of ours left behind (each held its ~0.5-1.6 GB until removed, and
    a long-lived host gathered 7 GB of them). A replaced image under a child image that still
    has its tag (testbed/server under an old testbed/server-torch) goes once the child does,
    so this prunes until nothing more goes. Labels are inherited: an untagged image a user
    built FROM one of ours goes too. Returns how many images went."""
    removed = 0
    for _ in range(4):  # an image, its replaced child, that child's: our images are three deep
        try:
            gone = client().images.prune(filters={"dangling": True, "label": label}).get("ImagesDeleted") or []
        except (DockerException, requests.RequestException):  # another prune under way, or slow:
            break  # the build itself is done, and the next build's prune takes what is left
        went = [entry for entry in gone if entry.get("Deleted")]
        removed += len(went)
        if not went:
            break
    return removed


# -- containers -------------------------------------------------------------------------------
def run_containers(
    specs: list[dict], workers: int = 8, on_started: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Create and start containers in parallel; returns {name: pid of its init}.

    Each spec has name, hostname, image, labels and optional nano_cpus, mem_limit and rdma
    (give it the host's RDMA devices: `rdma_access`).
    """
    api = client().api

    def one(spec: dict) -> tuple[str, int]:
        host_config = api.create_host_config(
            network_mode="none",
            init=True,
            # researchers tune routes and tc inside; verbs pin what they register (the rdma
            # transport: the whole gradient buffer), and without IPC_LOCK a container may pin
            # only RLIMIT_MEMLOCK (8 MiB, which a host without CAP_SYS_RESOURCE cannot raise)
            cap_add=["NET_ADMIN", "NET_RAW", "IPC_LOCK"],
            nano_cpus=spec.get("nano_cpus"),
            mem_limit=spec.get("mem_limit"),
            **(rdma_access() if spec.get("rdma") else {}),
        )
        try:
            created = api.create_container(
                spec["image"],
                command=["sleep", "infinity"],
                name=spec["name"],
                hostname=spec["hostname"],
                labels=spec["labels"],
                host_config=host_config,
            )
            api.start(created["Id"])
            pid = api.inspect_container(created["Id"])["State"]["Pid"]
        except (APIError, ImageNotFound) as exc:
            detail = getattr(exc, "explanation", None) or str(exc)
            raise EmulationError(f"container {spec['name']}: {detail}") from None
        if on_started:
            on_started(spec["name"], pid)
        return spec["name"], pid

    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        return dict(pool.map(one, specs))
    finally:
        # on an error, containers not yet started are not started (the caller rolls back)
        pool.shutdown(wait=True, cancel_futures=True)


INFINIBAND = Path("/dev/infiniband")
UVERBS_MAJOR = 231  # the kernel's fixed char major of /dev/infiniband/uverbs* (IB_UVERBS_MAJOR)


def rdma_access(devices: Path = INFINIBAND) -> dict:
    """What a container needs to use the host's RDMA devices (soft-RoCE's rxe among them):
    /dev/infiniband bound in, so that the uverbs nodes of rxe devices made after the
    container started (a lab makes them per server once it runs) appear inside, and the
    device cgroup opened to them and to rdma_cm. Nothing when the host has no RDMA stack."""
    if not devices.is_dir():
        return {}
    rules = [f"c {UVERBS_MAJOR}:* rwm"]
    try:
        cm = (devices / "rdma_cm").stat().st_rdev
        rules.append(f"c {os.major(cm)}:{os.minor(cm)} rwm")
    except OSError:
        pass  # rdma_ucm not loaded: verbs without the connection manager
    return {"binds": {str(devices): {"bind": str(devices), "mode": "rw"}}, "device_cgroup_rules": rules}


def remove_containers(names: Iterable[str], workers: int = 8) -> int:
    """Force-remove containers by name, in parallel; missing ones are fine. Returns count."""
    api = client().api

    def one(name: str) -> int:
        try:
            api.remove_container(name, force=True, v=True)
            return 1
        except NotFound:
            return 0
        except APIError as exc:
            if exc.status_code == 409:  # removal already in progress
                return 0
            raise EmulationError(f"removing container {name}: {exc.explanation}") from None

    names = list(names)
    if not names:
        return 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, names))


def lab_containers(lab: str | None = None) -> list[dict]:
    """Containers carrying testbed labels (of one lab, or of all): name, node, lab, pid."""
    label = f"{LAB_LABEL}={lab}" if lab else LAB_LABEL
    found = []
    for summary in client().api.containers(all=True, filters={"label": label}):
        labels = summary.get("Labels") or {}
        found.append(
            {
                "name": summary["Names"][0].lstrip("/"),
                "lab": labels.get(LAB_LABEL),
                "node": labels.get(NODE_LABEL),
                "state": summary.get("State"),
            }
        )
    return found


def container_pid(name: str) -> int | None:
    try:
        state = client().api.inspect_container(name)["State"]
    except NotFound:
        return None
    return state["Pid"] if state.get("Running") else None


def start_container(name: str) -> int | None:
    """Start a stopped (killed) container again; the PID of its new init, or None if it
    was running already."""
    api = client().api
    try:
        if api.inspect_container(name)["State"].get("Running"):
            return None
        api.start(name)
        return api.inspect_container(name)["State"]["Pid"]
    except NotFound:
        raise EmulationError(f"container {name} is gone: the lab must be rebuilt (testbed down, then up)") from None
    except APIError as exc:
        raise EmulationError(f"start container {name}: {getattr(exc, 'explanation', exc)}") from None


def exec_in(name: str, command: list[str], stream: Callable[[bytes], None] | None = None) -> tuple[int, bytes]:
    """Run a command in a container as `docker exec` does (its cgroups, env, namespaces)."""
    api = client().api
    try:
        handle = api.exec_create(name, command)
        if stream is None:
            output = api.exec_start(handle["Id"])
        else:
            output = b""
            for chunk in api.exec_start(handle["Id"], stream=True):
                stream(chunk)
        code = api.exec_inspect(handle["Id"])["ExitCode"]
    except (APIError, NotFound) as exc:
        raise EmulationError(f"exec in {name}: {getattr(exc, 'explanation', exc)}") from None
    return code if code is not None else -1, output


def exec_detached(name: str, command: list[str], environment: dict[str, str] | None = None) -> None:
    """Start a long-running command in a container and return (`docker exec -d`).
    `environment`: variables of that process alone (secrets stay off its command line)."""
    api = client().api
    try:
        handle = api.exec_create(name, command, environment=environment)
        api.exec_start(handle["Id"], detach=True)
    except (APIError, NotFound) as exc:
        raise EmulationError(f"exec in {name}: {getattr(exc, 'explanation', exc)}") from None


def container_cpus(name: str, cpus: float | None, period_us: int = 100_000) -> None:
    """Limit a container to `cpus` of one core (CFS quota, `docker update --cpus`); None lifts it."""
    quota = -1 if cpus is None else max(1000, round(cpus * period_us))
    try:
        client().api.update_container(name, cpu_period=period_us, cpu_quota=quota)
    except NotFound:
        raise EmulationError(f"container {name} is gone") from None
    except APIError as exc:
        raise EmulationError(f"limit the CPU of container {name}: {getattr(exc, 'explanation', exc)}") from None


def container_action(name: str, action: str) -> int:
    """stop (pause: the cgroup freezer), cont (unpause) or kill (SIGKILL) a container;
    1 if done, 0 if the container is gone or already in that state."""
    api = client().api
    calls = {"stop": api.pause, "cont": api.unpause, "kill": lambda n: api.kill(n, "SIGKILL")}
    try:
        calls[action](name)
    except NotFound:
        return 0
    except APIError as exc:
        explanation = str(getattr(exc, "explanation", exc))
        if exc.status_code == 409 or "not paused" in explanation or "already paused" in explanation:
            return 0  # already paused / not paused / not running: the wanted state holds
        raise EmulationError(f"{action} container {name}: {explanation}") from None
    return 1
