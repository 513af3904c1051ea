"""A user's topology kind (examples/ringnet.py, copied into the test's own directory) brought
up by `testbed up --plugin` in namespaces: later commands in other processes find the kind
again from the lab's state, every pair of servers reaches the other, and a ring on it runs
within [0.90, 1.10] of the cost model's prediction for that kind. Lab: ex-ringnet. (A mesh
here, 56 flows over the routers' ring, read 1.04-1.10 over four runs: TCP splits the shared
links less evenly than the model's max-min, a model question for issue 29, not the plugin's.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import plugins
from orchestrator.emulation import cleanup
from orchestrator.topology import KINDS
from tests.netns.probes import runs_as_predicted, unreachable_pairs

ROOT = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "orchestrator.cli"]
TENSORS = [1 << 19]  # 2 MiB


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    copy = tmp_path / "ringnet.py"
    shutil.copy(ROOT / "examples" / "ringnet.py", copy)
    copy.chmod(0o644)
    yield copy
    cleanup.clean_lab("ex-ringnet")
    from orchestrator.spec import unregister_topology

    if "ringnet" in KINDS:
        unregister_topology("ringnet")
    plugins._files.pop(copy.resolve(), None)


def test_a_plugin_topology_goes_up_is_found_again_and_runs_at_its_prediction(plugin, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def testbed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(TESTBED + list(args), capture_output=True, text=True, env=env, timeout=600)

    assert "ringnet" not in KINDS
    lab_file = tmp_path / "ringnet.yaml"
    lab_file.write_text("name: ex-ringnet\ntopology: {kind: ringnet, routers: 4, servers_per_router: 2}\n"
                        "links: {bandwidth: 100Mbit}\nservers: {runtime: netns}\n")
    up = testbed("up", str(lab_file), "--plugin", str(plugin))
    assert up.returncode == 0, up.stderr[-2000:]
    status = testbed("status", "ex-ringnet", "--json")  # no --plugin: the lab remembers its file
    assert status.returncode == 0, status.stderr[-2000:]
    assert len(json.loads(status.stdout)["links"]) == 12

    from orchestrator.emulation import Lab

    lab = Lab.attach("ex-ringnet")  # this process loads the kind from the recorded plugin too
    assert KINDS["ringnet"].origin == str(plugin.resolve())
    assert unreachable_pairs(lab) == []
    assert lab.topology.path("h0_0", "h3_1") == ["h0_0", "r0", "r3", "h3_1"]
    runs_as_predicted(lab, "ring", TENSORS, "ringnet,4,2 at 100 Mbit")

    down = testbed("down", "ex-ringnet")
    assert down.returncode == 0, down.stderr[-2000:]
