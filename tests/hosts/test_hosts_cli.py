"""`testbed hosts up|status|down` and `testbed up --hosts` through the command line, over two
hosts faked as namespaces (`netns:` in the hosts file): Ansible installs a worker under
daemontools' supervise on each, the scheduler runs here with mutual TLS; a split lab is made,
listed, reached and taken down by name from other processes; a lab whose `up` was killed
midway is cleaned by name; a killed worker is started again by its supervisor; `hosts down`
leaves no process and no state. Every command runs with its state in this test's directory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from orchestrator.emulation import kernel
from orchestrator.hosts.fake import fake_hosts

TESTBED = [str(Path(sys.executable).parent / "testbed")]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """(run, hosts file, fake hosts, state directory): `run(*args)` is `testbed args` with
    this module's state directory; the hosts are up for the module and down after it."""
    directory = tmp_path_factory.mktemp("hostscli")
    state = directory / "state"
    env = {**os.environ, "TESTBED_STATE": str(state)}

    def run(*args: str, ok: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(TESTBED + list(args), env=env, capture_output=True, text=True, timeout=600, input=input)
        if ok:
            assert done.returncode == 0, f"testbed {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    with fake_hosts(f"tbh{os.getpid() % 1000}", ["x", "y"], orchestrator=True) as hosts:
        file = directory / "hosts.yaml"
        file.write_text("hosts:\n" + "".join(
            f"  - {{name: {h}, address: {hosts.address(h)}, mtu: 9000, netns: {hosts.namespace(h)}}}\n"
            for h in hosts.names))
        try:
            started = time.monotonic()
            first = run("hosts", "up", str(file))
            took = time.monotonic() - started
            assert "hosts x, y are up" in first.stdout
            started = time.monotonic()
            again = run("hosts", "up", str(file))  # idempotent: nothing to change
            print(f"testbed hosts up: {took:.1f} s the first time, {time.monotonic() - started:.1f} s again")
            assert "(0 changes" in again.stdout, again.stdout
            yield run, file, hosts, state
        finally:
            run("hosts", "down", "--force", ok=False)


def worker_pids(state: Path) -> dict[str, int]:
    """host → the pid of its running worker (the process supervise keeps up)."""
    found = {}
    for host in ("x", "y"):
        pid = (state / "engine" / "hosts" / host / "service" / "supervise" / "pid")
        out = subprocess.run(["svstat", str(pid.parent.parent)], capture_output=True, text=True).stdout
        if ": up (pid " in out:
            found[host] = int(out.split("(pid ")[1].split(")")[0])
    return found


def test_hosts_status_names_every_joined_host(cli):
    run, _, hosts, state = cli
    report = json.loads(run("hosts", "status", "--json").stdout)
    assert report["scheduler_running"] and report["address"].startswith("tls://")
    assert {name: entry["joined"] for name, entry in report["hosts"].items()} == {"x": True, "y": True}
    # the workers run in their hosts' namespaces, under supervise, with their own state
    pids = worker_pids(state)
    assert set(pids) == {"x", "y"}
    for host, pid in pids.items():
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{hosts.namespace(host)}").st_ino
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"TESTBED_STATE={state / 'engine' / 'hosts' / host / 'state'}".encode() in environ


def test_a_killed_worker_is_started_again_by_its_supervisor(cli):
    run, _, _, state = cli
    before = worker_pids(state)["x"]
    os.kill(before, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report = json.loads(run("hosts", "status", "--json").stdout)
        now = worker_pids(state).get("x")
        if now not in (None, before) and report["hosts"]["x"]["joined"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"host x's worker was not back within 60 s: {report}")


def test_a_split_lab_from_the_command_line(cli):
    run, file, hosts, state = cli
    made = run("up", "bcube,2,1", "--name", "clisp", "--runtime", "netns", "--hosts", str(file))
    assert "is up over 2 hosts" in made.stdout
    try:
        rows = {row["name"]: row for row in json.loads(run("ls", "--json").stdout)}
        assert rows["clisp"]["status"] == "up over hosts x, y"
        held = json.loads(run("hosts", "status", "--json").stdout)["hosts"]
        assert held["x"]["labs"] == ["clisp"] and held["y"]["labs"] == ["clisp"]
        refused = run("hosts", "down", ok=False)  # the hosts hold the lab
        assert refused.returncode != 0 and "clisp" in refused.stderr and "\n" not in refused.stderr.strip()
        again = run("up", "bcube,2,1", "--name", "clisp", "--runtime", "netns", "--hosts", str(file), ok=False)
        assert again.returncode != 0 and "is live already" in again.stderr
        # this machine reaches every server's management address through the server's host
        record = json.loads((state / "split" / "clisp" / "split.json").read_text())
        assert len(record["routes"]) == 4
        reached = subprocess.run(["fping", "-q", "-r", "2", "-t", "300",
                                  *(route.split("/")[0] for route in record["routes"])], capture_output=True, text=True)
        assert reached.returncode == 0, reached.stderr
        # exec and faults by name, from other processes, each on the node's host
        shown = run("exec", "clisp", "h11", "--", "ip", "-o", "-4", "address", "show", "dev", "h11-eth0").stdout
        assert "10." in shown and "h11-eth0" in shown
        assert run("exec", "clisp", "h11", "--", "sh", "-c", "exit 3", ok=False).returncode == 3
        # Mininet's CLI: each command line runs on its node's host
        shown = run("cli", "clisp", input="pingall\nh11 ip -o -4 address show dev h11-eth0\nh00 hostname -I\n")
        said = shown.stdout + shown.stderr  # Mininet logs to stderr, a command's output to stdout
        assert "Results: 0% dropped (12/12 received)" in said, said
        assert re.search(r"inet 10\.\d+\.\d+\.\d+/\d+ .*h11-eth0", said) and re.search(r"^10\.\d+\.\d+\.\d+ ", said, re.M), said
        shown = json.loads(run("status", "clisp", "--json").stdout)
        assert shown["status"] == "up" and shown["hosts"] == ["x", "y"]
        assert all(node["alive"] for node in shown["nodes"]) and len(shown["nodes"]) == 8
        assert {link["state"] for link in shown["links"]} == {"up"} and len(shown["links"]) == 8
        applied = run("fault", "clisp", "link-down", "h11-l1s1").stdout
        assert "applied" in applied
        states = {(link["a"], link["b"]): link["state"] for link in json.loads(run("status", "clisp", "--json").stdout)["links"]}
        assert [pair for pair, state in states.items() if state == "down"] == [("h11", "l1s1")], states
        assert [f["target"] for f in json.loads(run("fault", "clisp", "list", "--json").stdout)] == ["h11-l1s1"]
        down_end = run("exec", "clisp", "h11", "--", "ip", "-o", "link", "show", "dev", "h11-eth1").stdout
        assert "state DOWN" in down_end or "NO-CARRIER" in down_end or ",UP" not in down_end, down_end
        assert "undid 1 fault" in run("fault", "clisp", "heal").stdout
        # monitoring: this machine's Prometheus scrapes one fabric exporter per host, each
        # labelled with its host and giving the link directions its nodes send on
        url = re.search(r"http://127\.0\.0\.1:\d+", run("monitor", "up", "clisp").stdout).group(0)
        directions = 2 * len(lab_links("bcube,2,1"))
        seen: dict = {}

        def by_host() -> dict:
            query = urllib.parse.quote('count by (host) (testbed_link_transmit_bytes_total{job="fabric"})')
            with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=5) as reply:
                seen.update({r["metric"].get("host"): int(r["value"][1]) for r in json.load(reply)["data"]["result"]})
            return seen

        deadline = time.monotonic() + 60
        while set(by_host()) != {"x", "y"} or sum(seen.values()) != directions:
            assert time.monotonic() < deadline, f"fabric series by host: {seen}, {directions} directions expected"
            time.sleep(0.5)
    finally:
        down = run("down", "clisp", ok=False)
    assert down.returncode == 0, down.stderr
    assert not (state / "split" / "clisp").exists()
    # its Prometheus here and the hosts' exporters went with it
    left = subprocess.run(["pgrep", "-af", f"prometheus.*{state}|orchestrator.monitoring.exporter clisp"],
                          capture_output=True, text=True).stdout
    assert not left, left
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert not [route for route in record["routes"] if route.split("/")[0] + " " in routes]
    for host in hosts.names:
        assert not kernel.list_namespaces(hosts.netns_prefix(host)), host


def test_an_up_killed_midway_is_cleaned_by_name(cli):
    run, file, hosts, state = cli
    env = {**os.environ, "TESTBED_STATE": str(state)}
    building = subprocess.Popen(TESTBED + ["up", "fattree,4", "--name", "clikill", "--runtime", "netns", "--hosts",
                                           str(file)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(kernel.list_namespaces(hosts.netns_prefix(host)) for host in hosts.names):  # a host builds
        assert building.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.02)
    building.send_signal(signal.SIGKILL)
    building.wait()
    rows = {row["name"]: row for row in json.loads(run("ls", "--json").stdout)}
    assert rows["clikill"]["status"].startswith("building over hosts")
    cleaned = run("clean", "clikill")
    assert "lab clikill on host" in cleaned.stdout
    assert "clikill" not in {row["name"] for row in json.loads(run("ls", "--json").stdout)}
    for host in hosts.names:
        assert not kernel.list_namespaces(hosts.netns_prefix(host)), host
    assert json.loads(run("hosts", "status", "--json").stdout)["hosts"]["x"]["labs"] == []


def test_an_experiment_runs_split_over_the_hosts(cli, tmp_path):
    """`testbed run --hosts`: the smoke experiment (star,4, a degraded link, Prometheus) with
    its lab split over the hosts, its agents deployed by each host's Ansible: every point done, its link bytes read on both hosts, its
    fault applied and undone, each host's CPU in its verdict, and the lab gone after."""
    run, file, hosts, state = cli
    run("run", str(Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml"), "--hosts", str(file),
        "--out", str(tmp_path / "results"))
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["status"] == "complete"
    for point in results["points"]:
        assert point["status"] == "done" and point["ratio"] > 0, point.get("error")
        print(f"{point['id']} split over two hosts: {point['ratio']:.3f} × predicted, {point['fidelity']['verdict']}")
        # every direction of the 4 links carried bytes, each read on the host of its sender
        # (the servers are on both hosts): none is missing
        measured = point["bytes_per_link"]["measured"]
        assert len(measured) == 8, measured
        assert [event["undone"] is not None for event in point["fault_events"]] == [True]
        # the verdict's CPU headroom is each host's (the least of them and this machine's)
        fidelity = point["fidelity"]
        by_host, machine = fidelity["cpu_idle_by_host"], fidelity["cpu_idle_machine"]
        assert set(by_host) == set(hosts.names), by_host
        if machine is not None:  # a host was the tightest: the share judged is its own
            assert fidelity["cpu_idle_share"] == by_host[machine] == min(by_host.values()), fidelity
        else:  # this machine, which drives, was tighter than every host
            assert fidelity["cpu_idle_share"] <= min(by_host.values()), fidelity
    assert "ex-smoke" not in {row["name"] for row in json.loads(run("ls", "--json").stdout)}
    for host in hosts.names:
        assert not kernel.list_namespaces(hosts.netns_prefix(host)), host


def test_hosts_file_refusals_are_one_line(cli, tmp_path):
    run, file, _, _ = cli
    other = tmp_path / "other.yaml"
    other.write_text("hosts:\n  - {name: z, address: 198.18.254.9, netns: tbnosuch}\n")
    for args, words in ((["hosts", "up", str(other)], "other hosts are up"),
                        (["up", "star,2", "--runtime", "netns", "--hosts", str(other)], "host z at 198.18.254.9 is not up")):
        done = run(*args, ok=False)
        assert done.returncode != 0 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_split_runs_memory_is_held_against_the_machines_its_hosts_are(cli, tmp_path):
    """`testbed run --dry-run --hosts`: each host's worker says which machine it is and what it
    has; fake hosts are one machine (one boot id), so a gradient their agents cannot hold
    together is refused naming both hosts, in one line; one they can is planned, its CPU need
    not judged against this machine's calibration (its hosts' cores run it)."""
    from orchestrator.emulation.capacity import host_limits

    run, file, _, _ = cli
    available = host_limits().mem_available_mib << 20
    experiment = tmp_path / "big.yaml"
    for size, refused in ((available // 4, True), (1 << 20, False)):  # 4 agents of a quarter each: past 80 %
        experiment.write_text(
            "name: big\nlab: {name: big, topology: {kind: star, servers: 4}, servers: {runtime: netns}}\n"
            f"agents: {{algorithms: [ring], workload: {{kind: back-to-back, size: {size}}}}}\n")
        done = run("run", str(experiment), "--dry-run", "--hosts", str(file), ok=not refused)
        if refused:
            assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert "4 agents of about" in done.stderr and "hosts x, y (one machine) have available" in done.stderr, \
                done.stderr
        else:
            assert "ring" in done.stdout, done.stdout
            assert "CPU: not judged: a split run's agents and links use its hosts' cores" in done.stdout, done.stdout


def test_hosts_down_leaves_nothing(cli):
    """Last in the module: down, then no worker, svscan or scheduler runs and no state is left
    (the fixture's own down then finds nothing to do)."""
    run, file, hosts, state = cli
    pids = list(worker_pids(state).values())
    scheduler = json.loads((state / "engine" / "engine.json").read_text())["scheduler"]["pid"]
    done = run("hosts", "down")
    assert "hosts x, y are down" in done.stdout
    assert not (state / "engine").exists()
    for pid in [*pids, scheduler]:
        deadline = time.monotonic() + 30
        while running(pid):
            assert time.monotonic() < deadline, f"process {pid} still runs"
            time.sleep(0.1)
    assert run("hosts", "status").stdout.strip() == "no hosts are up"


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def lab_links(argument: str) -> list:
    from orchestrator.spec import lab_from_argument
    from orchestrator.topology import from_lab

    return from_lab(lab_from_argument(argument)).links

