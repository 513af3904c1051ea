"""Labs with Docker containers as servers, through a real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup, docker_engine, kernel
from orchestrator.emulation.journal import LabState, lab_id
from orchestrator.emulation.plan import namespace_name
from tests.conftest import host_snapshot
from tests.netns.probes import iperf3_mbit, unreachable_pairs

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


@pytest.mark.parametrize("lab_file", ["bcube-4-1.yaml", "fattree-4.yaml"])
def test_all_pairs_ping_in_docker(make_lab, lab_file):
    lab = make_lab(str(TOPOLOGIES / lab_file), **{"servers.runtime": "docker"})
    assert unreachable_pairs(lab) == []


PIN_64_MIB = """
import ctypes, mmap, resource
size = 64 << 20
assert resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] < size, "no limit to pass"
buffer = mmap.mmap(-1, size)
address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
libc = ctypes.CDLL(None, use_errno=True)
if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)):
    raise SystemExit(f"mlock: errno {ctypes.get_errno()}")
print("pinned")
"""


def test_containers_are_servers_with_no_docker_network(make_lab):
    lab = make_lab("bcube,3,1", name="ctr", **{"servers.runtime": "docker", "servers.cpus": 0.5, "servers.memory": "256M"})
    api = docker_engine.client().api
    for server in lab.topology.servers:
        info = api.inspect_container(lab.plan.container_name(server.name))
        assert info["Config"]["Hostname"] == server.name
        labels = info["Config"]["Labels"]  # the image's own labels are inherited too
        assert (labels["testbed.lab"], labels["testbed.node"]) == ("ctr", server.name)
        assert info["HostConfig"]["NetworkMode"] == "none"
        assert info["HostConfig"]["NanoCpus"] == 500_000_000
        assert info["HostConfig"]["Memory"] == 256 * 2**20
        links = lab.exec(server.name, ["ip", "-o", "link"]).stdout
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
        assert names == sorted(["lo", "mgmt0", *(n.name for n in server.data_nics())])
    # verbs pin the buffers they register (the rdma transport: the whole gradient): a server
    # pins 64 MiB, past the 8 MiB RLIMIT_MEMLOCK Docker hands down
    pinned = lab.exec("h00", ["python", "-c", PIN_64_MIB])
    assert pinned.returncode == 0 and pinned.stdout.strip() == "pinned", pinned.stdout
    # the agent's Python and this package are installed in the image, with rdma-core's
    # binding the rdma transport moves chunks with (pyverbs: Debian's, linked into the venv)
    probe = lab.exec("h00", ["python", "-c", "import orchestrator, grpc, numpy; from orchestrator.agent.transports "
                             "import rdma; assert rdma.CMID is not None, 'no pyverbs'; print('ok')"])
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stdout + probe.stderr


def test_bridges_work_under_dockers_forward_drop(make_lab):
    nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    if not (nf.exists() and nf.read_text().strip() == "1" and "-P FORWARD DROP" in rules):
        pytest.skip("the Docker FORWARD DROP + br_netfilter hazard is not present on this host")
    before = host_snapshot()["rules"]
    lab = make_lab("star,4", name="fwd", **{"servers.runtime": "docker"})
    assert unreachable_pairs(lab) == []
    assert iperf3_mbit(lab, "h0", "h1", seconds=2) > 0.9 * lab.spec.links.bandwidth / 1e6
    assert host_snapshot()["rules"] == before  # and not one firewall rule was touched


def _lab_traces(name: str) -> dict:
    prefix = namespace_name(name, "")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {
        "namespaces": kernel.list_namespaces(prefix),
        "containers": [c["name"] for c in docker_engine.lab_containers(name)],
        "root links": [l for l in links.splitlines() if f"tb{lab_id(name)}-" in l],
        "state": LabState(name).exists(),
        "processes": subprocess.run(["pgrep", "-f", f"orchestrator.cli up .*--name {name}"], capture_output=True, text=True).stdout.split(),
    }


def _timed_up(name: str, runtime: str) -> float:
    command = [sys.executable, "-m", "orchestrator.cli", "up", "bcube,4,1", "--runtime", runtime, "--name", name]
    start = time.monotonic()
    subprocess.run(command, check=True, capture_output=True)
    elapsed = time.monotonic() - start
    cleanup.clean_lab(name)
    return elapsed


@pytest.mark.parametrize("runtime", ["docker", "netns"])
def test_sigkill_during_up_then_clean_leaves_nothing(runtime):
    name = f"kill-{runtime}"
    before = host_snapshot()
    duration = _timed_up(name, runtime)
    command = [sys.executable, "-m", "orchestrator.cli", "up", "bcube,4,1", "--runtime", runtime, "--name", name]
    for fraction in (0.15, 0.35, 0.55, 0.75, 0.9):
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(duration * fraction)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        clean = subprocess.run([sys.executable, "-m", "orchestrator.cli", "clean", name], capture_output=True, text=True)
        assert clean.returncode == 0, clean.stderr
        traces = _lab_traces(name)
        assert traces == {"namespaces": [], "containers": [], "root links": [], "state": False, "processes": []}, fraction
        again = subprocess.run([sys.executable, "-m", "orchestrator.cli", "clean", name], capture_output=True, text=True)
        assert again.stdout.strip() == "nothing to clean", (fraction, again.stdout)
    assert host_snapshot() == before


def test_status_json_of_a_docker_lab(make_lab):
    lab = make_lab("star,3", name="st", **{"servers.runtime": "docker", "links.bandwidth": "50Mbit"})
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "status", "st", "--json"], capture_output=True, text=True, check=True
    ).stdout)
    assert report["runtime"] == "docker"
    assert all(n["alive"] for n in report["nodes"])
    assert [n["container"] for n in report["nodes"] if n["role"] == "server"] == [f"testbed-st-h{i}" for i in range(3)]
    assert {l["rate_bps"] for l in report["links"]} == {50_000_000}
    assert report["rxe"] == []
