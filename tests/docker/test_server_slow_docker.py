"""`server-slow` on a Docker server: `docker update --cpus` holds its container to the share
asked, and undo lifts it (the netns runtime's cgroup: tests/netns/test_server_slow.py)."""

from __future__ import annotations

import subprocess
import time

from orchestrator.faults import Injector
from tests.netns.test_server_slow import share


def test_a_slowed_container_gets_its_share_of_a_core_until_undone(make_lab):
    lab = make_lab("star,2", name="dkslow", **{"servers.runtime": "docker"})
    container = lab.plan.container_name("h0")
    subprocess.run(["docker", "exec", "-d", container, "sh", "-c", "while :; do :; done"], check=True, timeout=60)
    deadline, pid = time.monotonic() + 10, None
    while pid is None:
        assert time.monotonic() < deadline, "the spinner never showed up in the container"
        top = subprocess.run(["docker", "top", container, "-eo", "pid,args"], capture_output=True, text=True,
                             timeout=30).stdout.splitlines()[1:]
        pid = next((int(line.split()[0]) for line in top if "while" in line), None)
        time.sleep(0.05)
    injector = Injector(lab)
    fault = injector.inject("server-slow", "h0", {"cpus": "0.2"}).fault
    slowed = share(pid)
    injector.undo(fault.id)
    free = share(pid)
    print(f"share of a core in a container: slowed to 0.2: {slowed:.3f}; undone: {free:.3f}")
    assert 0.1 < slowed < 0.3 and free > 0.6
