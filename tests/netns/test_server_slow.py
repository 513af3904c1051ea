"""The `server-slow` fault (issue 32 item 2): a netns server's processes held to a share of
one core by a cgroup CPU quota, lifted by undo, and removed with the lab."""

from __future__ import annotations

import os
import sys
import time

from orchestrator.emulation import cleanup, cpu_limit
from orchestrator.faults import Injector

NETNS = {"servers.runtime": "netns"}


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def share(pid: int, span: float = 1.0) -> float:
    """The share of one core the process used over `span` seconds."""
    used, started = cpu_seconds(pid), time.monotonic()
    time.sleep(span)
    return (cpu_seconds(pid) - used) / (time.monotonic() - started)


def cpu_group(pid: int) -> str:
    """The process's group in the hierarchy that holds the cpu controller (v1 or v2)."""
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    raise AssertionError(f"process {pid} is in no cpu group")


def groups(lab) -> list:
    root, _ = cpu_limit.hierarchy()
    return sorted(root.glob(f"{cpu_limit.PREFIX}{lab.plan.id}-*"))


def test_a_slowed_server_gets_its_share_of_a_core_until_undone_and_the_lab_leaves_no_group(make_lab):
    lab = make_lab("star,2", name="ftslow", **NETNS)
    spinner = lab.popen("h0", [sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 10
        while spinner.pid not in {p["pid"] for p in lab.server_processes("h0")}:
            assert time.monotonic() < deadline, "the spinner never showed up in h0"
            time.sleep(0.05)
        before = cpu_group(spinner.pid)
        injector = Injector(lab)
        fault = injector.inject("server-slow", "h0", {"cpus": "0.2"}).fault
        assert [g.name for g in groups(lab)] == [cpu_limit.group_name(lab.plan.id, fault.id)]
        assert cpu_group(spinner.pid) != before
        slowed = share(spinner.pid)
        injector.undo(fault.id)
        assert groups(lab) == [] and cpu_group(spinner.pid) == before  # back where it was
        # free again: a core's worth as soon as nothing else wants the CPU (the kernel may
        # still be tearing down an earlier test's namespaces): waited for, within 15 s
        deadline, free = time.monotonic() + 15, share(spinner.pid)
        while free <= 0.6 and time.monotonic() < deadline:
            free = share(spinner.pid)
        print(f"share of a core: slowed to 0.2: {slowed:.3f}; undone: {free:.3f}")
        assert 0.1 < slowed < 0.3 and free > 0.6
        injector.inject("server-slow", "h0", {"cpus": "0.5"})  # still on when the lab goes
        assert len(groups(lab)) == 1
        removed = cleanup.clean_lab(lab.name)
        assert groups(lab) == [] and removed.get("cpu groups") == 1
    finally:
        spinner.kill()
        spinner.wait()
