"""Signals during a Docker lab's build: containers being started, and the management network
being built; the build is rolled back, containers included."""

from __future__ import annotations

import signal

import pytest

from orchestrator.emulation import docker_engine
from tests.build_control import Build, run_testbed
from tests.netns.test_build_safety import NOTHING, leftovers


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("point", ["container", "host_link"])
def test_a_signal_while_a_docker_lab_is_built_removes_its_containers_too(tmp_path, signum, point):
    name = f"dsig-{point.replace('_', '')}-{signum.name[3:].lower()}"
    build = Build("bcube,3,1", name, tmp_path, runtime="docker")
    try:
        build.freeze_at(point)
        build.signal(signum)
        code, stderr = build.finish()
    finally:
        build.kill()
    assert code == 128 + signum, stderr
    assert signal.Signals(signum).name in stderr.strip().splitlines()[-1], stderr
    assert leftovers(name, tmp_path) == NOTHING
    assert docker_engine.lab_containers(name) == []
    assert run_testbed("ls", state_root=tmp_path).stdout.strip() == "no labs"
