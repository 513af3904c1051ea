"""Builds that are interrupted, raced or crash, and commands that name labs: each lab is
touched only by what names it exactly, and nothing of it outlives a signal or a crash.

Builds run as `testbed up` processes against a throw-away state root in tmp_path; they are
frozen at a chosen point of the build (tests/build_control.py) before being signalled.
"""

from __future__ import annotations

import json
import signal

import pytest

from orchestrator.emulation import cleanup, kernel
from orchestrator.emulation.journal import lab_id
from tests.build_control import Build, run_testbed
from tests.netns.probes import unreachable_pairs


def leftovers(name: str, state_root) -> dict:
    """Everything of lab `name` still on the host or in the state root."""
    prefix = f"tb{lab_id(name)}-"
    with kernel.Netlink() as nl:
        root_links = [m.get_attr("IFLA_IFNAME") for m in nl[None].get_links()]
    return {
        "namespaces": cleanup.lab_namespaces(name),
        "root links": [link for link in root_links if link.startswith(prefix)],
        "state": (state_root / "labs" / name).exists(),
        "lock": (state_root / "locks" / name).exists(),
    }


NOTHING = {"namespaces": [], "root links": [], "state": False, "lock": False}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("point,lab", [("state", "fattree,4"), ("netns", "fattree,4"), ("host_link", "fattree,8")])
def test_a_signal_at_any_point_of_a_build_rolls_it_back(tmp_path, signum, point, lab):
    name = f"sig-{point.replace('_', '')}-{signum.name[3:].lower()}"
    build = Build(lab, name, tmp_path)
    try:
        build.freeze_at(point)
        build.signal(signum)
        code, stderr = build.finish()
    finally:
        build.kill()
    assert code == 128 + signum, stderr
    lines = stderr.strip().splitlines()
    assert lines and signal.Signals(signum).name in lines[-1] and "removed" in lines[-1], stderr
    assert leftovers(name, tmp_path) == NOTHING
    assert run_testbed("ls", state_root=tmp_path).stdout.strip() == "no labs"


def test_down_clean_and_exec_refuse_a_build_in_progress_which_then_comes_up_whole(tmp_path):
    name = "race-up"
    build = Build("fattree,4", name, tmp_path)
    try:
        build.freeze_at("netns")
        for argv in (["down", name], ["clean", name], ["exec", name, "p0e0h0", "--", "true"], ["status", name]):
            result = run_testbed(*argv, state_root=tmp_path)
            assert result.returncode == 1, (argv, result.stdout, result.stderr)
            assert "being built" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "building" in run_testbed("ls", state_root=tmp_path).stdout
        build.thaw()
        code, stderr = build.finish()
    finally:
        build.kill()
    assert code == 0, stderr
    try:
        assert "up" in run_testbed("ls", state_root=tmp_path).stdout
        assert run_testbed("exec", name, "p0e0h0", "--", "true", state_root=tmp_path).returncode == 0
    finally:
        assert run_testbed("down", name, state_root=tmp_path).returncode == 0
    assert leftovers(name, tmp_path) == NOTHING


def test_a_build_whose_process_died_shows_as_crashed_and_clean_removes_it(tmp_path):
    name = "crashed-up"
    build = Build("fattree,4", name, tmp_path)
    build.freeze_at("host_link")
    build.kill()  # SIGKILL: nothing can be rolled back by the process itself
    assert leftovers(name, tmp_path)["namespaces"]
    listed = json.loads(run_testbed("ls", "--json", state_root=tmp_path).stdout)
    assert [row["status"] for row in listed] == [f"crashed — run testbed clean {name}"], listed
    for argv in (["status", name], ["exec", name, "p0e0h0", "--", "true"]):
        result = run_testbed(*argv, state_root=tmp_path)
        assert result.returncode == 1 and f"testbed clean {name}" in result.stderr, result.stderr
    again = run_testbed("up", "fattree,4", "--runtime", "netns", "--name", name, state_root=tmp_path)
    assert again.returncode == 1 and f"testbed clean {name}" in again.stderr, again.stderr
    assert run_testbed("clean", name, state_root=tmp_path).returncode == 0
    assert leftovers(name, tmp_path) == NOTHING


def test_clean_of_a_name_never_touches_a_lab_whose_name_it_prefixes(make_lab):
    lab = make_lab("star,2", name="relq-a", **{"servers.runtime": "netns"})
    result = run_testbed("clean", "relq")
    assert result.returncode == 0 and result.stdout.strip() == "nothing to clean", result.stdout
    assert len(cleanup.lab_namespaces("relq-a")) == len(lab.topology.nodes)
    assert unreachable_pairs(lab) == []
    # and a lab named like the prefix builds beside it (leftovers are matched exactly too)
    short = make_lab("star,2", name="relq", **{"servers.runtime": "netns"})
    assert unreachable_pairs(short) == [] and unreachable_pairs(lab) == []
    assert run_testbed("down", "relq").returncode == 0
    assert unreachable_pairs(lab) == []


def test_clean_all_leaves_a_build_in_progress_alone(tmp_path):
    name = "busy-all"
    build = Build("fattree,4", name, tmp_path)
    try:
        build.freeze_at("host_link")
        result = run_testbed("clean", "--all", state_root=tmp_path)
        assert result.returncode == 0 and f"left lab {name} alone" in result.stderr, result.stderr
        assert leftovers(name, tmp_path)["namespaces"]
        build.thaw()
        code, stderr = build.finish()
    finally:
        build.kill()
    assert code == 0, stderr
    assert run_testbed("clean", name, state_root=tmp_path).returncode == 0
    assert leftovers(name, tmp_path) == NOTHING


SCRIPT = """
import sys, time
from orchestrator.emulation import Lab
from orchestrator.spec import lab_from_argument
with Lab.up(lab_from_argument("star,2", name=sys.argv[1], **{"servers.runtime": "netns"})) as lab:
    print("up", flush=True)
    time.sleep(120)
print("after", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_script_s_lab_comes_down_when_the_script_is_terminated(tmp_path, signum):
    """`with Lab.up(...)` in a user's script: SIGTERM or SIGHUP (a job scheduler's stop, a
    closed terminal) unwinds the block as Ctrl-C does and the lab comes down; Python's
    default handler ended the process and left it up."""
    import os
    import subprocess
    import sys

    name = f"term-{signum.name[3:].lower()}"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TESTBED_STATE": str(tmp_path)})
    try:
        assert proc.stdout.readline().strip() == "up", proc.stderr.read()
        assert leftovers(name, tmp_path)["namespaces"]
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
        left = leftovers(name, tmp_path)
    finally:
        proc.kill()
        run_testbed("clean", name, state_root=tmp_path)  # whatever a failure left
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
    assert left == NOTHING
