"""The vm tier, from the host: boot Debian kernels under qemu and run tests/vm/guest inside.

Two kernels, each booted once per session:
- Debian 12's stock kernel (linux-image-amd64 from this machine's apt sources, 6.1): netem
  labs, marking queues (RED, CoDel, FQ-CoDel) with dctcp under a mesh, and the refusal of
  soft-RoCE labs, since its rdma_rxe serves only the initial network namespace;
- the stock kernel of TESTBED_VM_RDMA_SUITE (default trixie-backports, whose rdma_rxe is
  per-namespace): soft-RoCE provisioning, RDMA exchanges across a lab's fabric, every
  algorithm over the agents' rdma transport, and a lab of Docker servers over rdma (the guest
  runs a Docker engine of its own on a disk image of this host's Docker state: docker_disk).
Each boot is bounded by TESTBED_VM_TIMEOUT seconds (default 600, so the tier by 20 minutes);
it takes about eight minutes once the kernels are cached (the first run downloads
~100 MB per kernel).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vm import qemu

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("TESTBED_VM_TIMEOUT", "600"))
RDMA_SUITE = os.environ.get("TESTBED_VM_RDMA_SUITE", "trixie-backports")


def guest_pytest(*paths: str, env: dict[str, str] | None = None) -> str:
    """The script the guest runs: pytest on guest tests, with this checkout's venv."""
    # no hypothesis plugin: under emulation every import costs seconds
    settings = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
    return (
        f"cd {REPO} && {settings}TESTBED_VM_JOB=/job exec {sys.executable} -m pytest {' '.join(paths)} "
        "-q -rs -p no:cacheprovider -p no:hypothesispytest --durations=8 --durations-min=10\n"
    )


DOCKER_DISKS = "docker"  # under the VM cache, readable by root alone: the host's images and containers' state


def docker_disk() -> tuple[Path | None, str]:
    """An ext4 image of this host's Docker state (its data root, copied by mkfs.ext4 -d), for
    the guest's own Docker engine (tests/vm/guest/test_softroce.py): the guest boots with it
    as a disk and finds testbed/server there, with no image to load (`docker load` of the
    server image took 70-105 s under qemu's emulation; this copy took 9-16 s here). The guest
    clears the containers and networks it copied before its engine starts. Kept in the VM
    cache while the server image's id holds; (None, why) when there is no current server
    image to give, or TESTBED_VM_DOCKER=0."""
    from docker.errors import ImageNotFound

    from orchestrator.emulation import docker_engine, images

    if os.environ.get("TESTBED_VM_DOCKER", "1") == "0":
        return None, "TESTBED_VM_DOCKER=0"
    try:
        engine = docker_engine.client(start=False)
        found = {name: engine.images.get(name) for name in (images.BASE, images.SERVER)}
        info = engine.info()
    except ImageNotFound as exc:
        return None, f"{exc.explanation or exc}: the docker tier builds the images"
    except Exception as exc:  # noqa: BLE001 - no engine (HostError, the SDK's): the summary says why it was not run
        return None, f"the Docker engine: {exc}"
    recipes = {images.BASE: images.base_recipe(), images.SERVER: images.server_recipe()}
    for name, image in found.items():  # else the guest would build it, offline
        if image.labels.get(images.RECIPE_LABEL) != recipes[name]:
            return None, f"{name} is older than this checkout: `testbed images build` makes it again"
    if info.get("Driver") != "overlay2":
        return None, f"this host's Docker stores images with {info.get('Driver')!r}, not overlay2 as the guest's engine"
    root = Path(info["DockerRootDir"])
    folder = qemu.CACHE / DOCKER_DISKS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / f"{found[images.SERVER].id.removeprefix('sha256:')[:12]}.ext4"
    if path.exists():
        return path, ""
    for stale in folder.iterdir():
        stale.unlink()
    partial = path.with_name(path.name + ".part")
    listed = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True).stdout.split()
    used = int(listed[0]) if listed else 0
    size = f"{(2 * used >> 30) + 2}G"  # room for the copy's metadata; sparse, so it costs what it holds
    try:
        made = subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(root), str(partial), size],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        partial.unlink(missing_ok=True)
        return None, f"copying {root} into a disk image: {exc}"
    if made.returncode != 0:
        partial.unlink(missing_ok=True)
        return None, f"copying {root} into a disk image failed: {made.stderr.strip()[-300:]}"
    partial.rename(path)
    return path, ""


def figures(run: qemu.VmRun) -> dict:
    lines = run.files.get("figures.jsonl", "").splitlines()
    return {item["name"]: item["value"] for item in map(json.loads, filter(None, lines))}


def boot(summary: list[str], what: str, suite: str | None, *paths: str, env: dict[str, str] | None = None,
         memory_mb: int = 2048, disks: tuple[Path, ...] = ()) -> qemu.VmRun:
    try:
        kernel = qemu.prepare(suite=suite)
    except qemu.VmUnavailable as exc:
        pytest.skip(f"vm tier ({what}): {exc}")
    script = guest_pytest(*paths, env=env)
    run = qemu.run(kernel, script, timeout=TIMEOUT, memory_mb=memory_mb, disks=disks)
    crashed = run.returncode is None and not run.timed_out
    if crashed:
        # The guest's kernel died under qemu's software emulation, before the guest's root was
        # up (seen: an int3 Oops 1.5 s into boot, once in ~20 boots) or while its tests ran
        # (seen: the VM off at 68 s with no exit code, after `clocksource: Marking clocksource
        # 'tsc' as unstable`): boot once more. A test that really kills the kernel does it
        # again and fails; the console of the first crash stays in the summary.
        first = run
        run = qemu.run(kernel, script, timeout=TIMEOUT, memory_mb=memory_mb, disks=disks)
    boot_s = f"{run.boot_seconds:.1f} s" if run.boot_seconds is not None else "never"
    summary.append(f"{what}: {kernel.package} — boot {boot_s}, VM total {run.seconds:.0f} s")
    if crashed:
        when = ("before the guest ran" if first.boot_seconds is None
                else f"while the guest ran (it had printed {first.output.strip()[-80:]!r})")
        summary.append(f"  first boot's kernel died {when}: {first.console.strip()[-300:]!r}")
    for name, value in figures(run).items():
        summary.append(f"  {name}: {value}")
    summary += [f"  guest {line}" for line in run.output.splitlines()
                if line.startswith("SKIPPED") or _SLOW.match(line)]  # and its slowest tests: the tier's time
    return run


_SLOW = re.compile(r"\d+\.\d+s (setup|call|teardown) ")


def explain(run: qemu.VmRun) -> str:
    state = f"timed out after {run.seconds:.0f} s" if run.timed_out else f"exit {run.returncode}"
    return f"guest tests {state}\n--- guest output ---\n{run.output[-6000:]}\n--- console ---\n{run.console[-3000:]}"


@pytest.fixture(scope="session")
def vm_runs() -> list[qemu.VmRun]:
    return []


@pytest.fixture(scope="session")
def stock_run(vm_summary, vm_runs) -> qemu.VmRun:
    run = boot(vm_summary, "Debian 12 stock kernel", None, "tests/vm/guest")
    vm_runs.append(run)
    return run


@pytest.fixture(scope="session")
def docker_state() -> dict:
    """What rdma_run gave the guest for its Docker servers: {"disk": path or None, "why": …}."""
    return {}


@pytest.fixture(scope="session")
def rdma_run(vm_summary, vm_runs, docker_state) -> qemu.VmRun:
    if not RDMA_SUITE:
        pytest.skip("TESTBED_VM_RDMA_SUITE is empty: no kernel with per-namespace rdma_rxe to boot")
    try:
        qemu.prepare(suite=RDMA_SUITE)  # before copying Docker's state for a VM that cannot boot (cached)
    except qemu.VmUnavailable as exc:
        pytest.skip(f"vm tier ({RDMA_SUITE} stock kernel): {exc}")
    disk, why = docker_disk()
    docker_state.update(disk=disk, why=why)
    if disk is None:
        vm_summary.append(f"Docker servers on soft-RoCE not run: {why}")
    run = boot(vm_summary, f"{RDMA_SUITE} stock kernel", RDMA_SUITE, "tests/vm/guest/test_softroce.py",
               env={"TESTBED_VM_DOCKER_DISK": "/dev/vda"} if disk else None, memory_mb=3072 if disk else 2048,
               disks=(disk,) if disk else ())
    vm_runs.append(run)
    return run


def test_guest_tests_pass_on_debian_12s_stock_kernel(stock_run):
    assert stock_run.returncode == 0, explain(stock_run)
    assert {"netem_rtt_ms", "netem_loss", "netem_jitter_rtt_ms", "queue_delay_mesh16"} <= figures(stock_run).keys(), \
        explain(stock_run)


def test_rdma_exchange_on_a_kernel_with_per_namespace_rxe(rdma_run, docker_state):
    assert rdma_run.returncode == 0, explain(rdma_run)
    exchanges = [name for name in figures(rdma_run) if name.startswith("rdma_ib_send_bw")]
    assert len(exchanges) == 2, explain(rdma_run)  # they ran, they were not skipped
    agents = [name for name in figures(rdma_run) if name.startswith("rdma_agents")]
    assert len(agents) == 2, explain(rdma_run)  # ring and HiPS over the agents' rdma transport
    assert "rdma_cut_link_detected_s" in figures(rdma_run), explain(rdma_run)  # stall naming over rdma
    assert any(name.startswith("rdma_repaced") for name in figures(rdma_run)), explain(rdma_run)  # re-pacing
    assert any(name.startswith("rdma_every_algorithm") for name in figures(rdma_run)), explain(rdma_run)
    assert "rdma_survive_rejoin star,4" in figures(rdma_run), explain(rdma_run)  # a crash survived, then rejoined
    assert "rdma_hdrm bigraph,4,1" in figures(rdma_run), explain(rdma_run)  # HDRM, on BiGraph only
    if docker_state.get("disk") is not None:  # Docker servers with rdma, where the host had the server image to give
        assert any(name.startswith("rdma_docker") for name in figures(rdma_run)), explain(rdma_run)


def test_vm_tier_leaves_nothing_on_the_host(vm_runs):
    if not vm_runs:
        pytest.skip("no VM was booted")
    children = subprocess.run(["pgrep", "-a", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    assert qemu.QEMU not in children, f"qemu still running: {children}"
    assert [run.job for run in vm_runs if run.job.exists()] == []
