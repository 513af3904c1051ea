"""The hostile corpus (issue 27): bad inputs a careless user or script gives the commands that
need no root (`predict`, `run --dry-run`, `report`, `compare`), each run through the real
`testbed` command under a 1 GiB data limit (RLIMIT_DATA: heap and anonymous maps) and a time
limit. Each must be refused in one line with exit code 2, no traceback, in bounded time and
memory, and leave nothing behind in its directory beyond what the test made.

Every file is made inside the test's own tmp_path; no input names a system path.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

MEMORY = 1 << 30
SECONDS = 30


def run_testbed(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    script = Path(sys.executable).parent / "testbed"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.cli"]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))

    start = time.monotonic()
    try:
        done = subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, timeout=SECONDS,
                              preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"testbed {' '.join(args)} ran past {SECONDS} s")
    return done, time.monotonic() - start


def refused(done: subprocess.CompletedProcess, *expected: str) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "MemoryError" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# -- predict ----------------------------------------------------------------------------------
PREDICT = [
    (["star,4", "-a", "ps", "-o", "shards=1000000000"], ["option shards", "4096"]),
    (["star,4", "-a", "ps", "-o", "colocated=maybe"], ["option colocated", "boolean"]),
    (["star,4", "-a", "mesh", "-o", "bogus=1"], ["option bogus", "no such option"]),
    (["star,4", "-a", "ring", "-o", "x=y"], ["option x", "its options: order"]),
    (["star,4", "-a", "double-tree", "-o", "pipeline=1000000000"], ["option pipeline"]),
    (["star,4", "-a", "ring", "--partition-bytes", "1"], ["partition_bytes", "partitions, more than 10,000"]),
    (["star,4000", "-a", "mesh", "--size", "1MB"], ["31,992,000 transfers",
                                                     "more than the 2,200,000 one prediction may hold"]),
    # built (2,095,104 transfers, within what a prediction may hold), refused before its paths
    (["star,1024", "-a", "mesh"], ["1,047,552 connections", "more than the 6,000,000"]),
    (["fattree,16", "-a", "mesh"], ["1,047,552 connections", "more than the 6,000,000"]),
    (["star,2000", "-a", "ring"], ["7,996,000 transfers", "more than the 2,200,000"]),
    (["star,4000", "-a", "halving-doubling"], ["path-search steps", "more than the 6,000,000"]),
    (["star,4", "-a", "ring", "--size", "1000000000000000000000000000000"], ["--size"]),
    (["star,4", "-a", "ring", "--top", "-1"], ["--top"]),
]


@pytest.mark.parametrize("args, expected", PREDICT, ids=[" ".join(a) for a, _ in PREDICT])
def test_predict_refuses_in_bounded_time_and_memory(tmp_path, args, expected):
    done, _ = run_testbed("predict", *args, cwd=tmp_path)
    refused(done, *expected)
    assert not any(tmp_path.iterdir())


# -- run --dry-run: experiment files ----------------------------------------------------------
BASE = {
    "name": "hostile",
    "lab": {"name": "hostile", "topology": {"kind": "star", "servers": 4}, "servers": {"runtime": "netns"}},
    "agents": {"algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "4MB"}},
    "iterations": 4,
}


def experiment(**changes) -> dict:
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return data


EXPERIMENTS = [
    ("shards", experiment(agents__algorithms=[{"name": "ps", "options": {"shards": 1_000_000_000}}]),
     ["agents.algorithms.0.options", "option shards"]),
    ("bogus-option", experiment(agents__algorithms=[{"name": "mesh", "options": {"bogus": 1}}]),
     ["agents.algorithms.0.options", "option bogus"]),
    ("colocated-maybe", experiment(agents__algorithms=[{"name": "ps", "options": {"colocated": "maybe"}}]),
     ["option colocated"]),
    ("partition-bytes-1", experiment(partitioning={"partition_bytes": 1}), ["partitioning.partition_bytes", "10,000"]),
    ("sweep-partition", experiment(sweep={"partitionings": [{"partition_bytes": 1}]}), ["sweep.partitionings"]),
    ("repeat-bomb", experiment(faults={"events": [
        {"action": "link-down", "target": {"any": "link"}, "at": "1s", "for": "1s",
         "repeat": {"times": 10000, "every": "2s"}}] * 500}), ["faults.events", "more than 10,000"]),
    ("unreachable-iteration", experiment(faults={"events": [
        {"action": "link-down", "target": "h0-sw", "at_iteration": 1_000_000_000, "for": "1s"}]}),
     ["at_iteration"]),
    ("for-1e12", experiment(faults={"events": [{"action": "link-down", "target": "h0-sw", "at": "1s", "for": 1e12}]}),
     ["for"]),
    ("huge-size", experiment(agents__workload={"kind": "back-to-back", "size": 10**30}), ["agents.workload"]),
    ("many-tensors", experiment(agents__workload={"kind": "tensors", "tensors": [1 << 30] * 5000}),
     ["agents.workload"]),
    ("mesh-star-4000", experiment(lab__topology={"kind": "star", "servers": 4000}, agents__algorithms=["mesh"],
                                  agents__workload={"kind": "back-to-back", "size": "1MB"}), ["4000 agents"]),
    ("partitions-times-transfers", experiment(agents__workload={"kind": "back-to-back", "size": "40MB"},
                                              partitioning={"partition_bytes": "8KB"}),
     ["partitioning.partition_bytes", "in 5,120 partitions is 122,880 transfers", "more than the 60,000"]),
    ("docker-memory", experiment(lab__servers={"runtime": "docker", "memory": "64M"}), ["servers.memory"]),
    ("transport", experiment(agents__transport="carrier-pigeon"), ["agents.transport", "grpc, rdma, tcp"]),
    ("auto-and-sweep", experiment(lab__links={"bandwidth": "auto"}, sweep={"link_rates": ["1Gbit", "10Mbit"]}),
     ["lab.links.bandwidth: auto", "sweep.link_rates"]),
    ("sweep-topology", experiment(sweep={"topologies": ["bcube,99,1"]}), ["hostile.yaml", "sweep.topologies"]),
]


@pytest.mark.parametrize("data, expected", [(d, e) for _, d, e in EXPERIMENTS], ids=[n for n, _, _ in EXPERIMENTS])
def test_dry_run_refuses_in_bounded_time_and_memory(tmp_path, data, expected):
    path = tmp_path / "hostile.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    done, _ = run_testbed("run", str(path), "--dry-run", cwd=tmp_path)
    refused(done, *expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.yaml"]


def test_lab_path_error_names_the_experiment(tmp_path):
    (tmp_path / "lab.yaml").write_text("name: x\ntopology: {kind: star, servers: 0}\n")
    data = experiment()
    data["lab"] = "lab.yaml"
    path = tmp_path / "hostile.yaml"
    path.write_text(json.dumps(data))
    done, _ = run_testbed("run", str(path), "--dry-run", cwd=tmp_path)
    line = refused(done, "lab.yaml")
    assert "hostile.yaml" in line and "lab" in line


def test_a_valid_dry_run_still_plans(tmp_path):
    path = tmp_path / "fine.yaml"
    path.write_text(json.dumps(experiment(agents__algorithms=["ring", {"name": "ps", "options": {"colocated": True}}])))
    done, seconds = run_testbed("run", str(path), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hostile" in done.stdout


def test_a_path_with_markup_is_printed_as_text(tmp_path):
    done, _ = run_testbed("report", str(tmp_path / "mk[/x]"), cwd=tmp_path)
    line = refused(done, "mk[/x]")  # rich once read it as a closing tag: MarkupError traceback
    assert "no such directory" in line


def test_the_plan_table_is_whole_in_a_pipe(tmp_path):
    path = tmp_path / "fine.yaml"
    path.write_text(json.dumps(experiment(
        agents__algorithms=[{"name": "ps", "label": "a-rather-long-label-for-the-ps", "options": {"colocated": True}}])))
    done, _ = run_testbed("run", str(path), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "000-star-4-1gbit-4mib-a-rather-long-label-for-the-ps" in done.stdout
    assert "…" not in done.stdout
