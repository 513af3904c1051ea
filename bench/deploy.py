#!/usr/bin/env python3
"""Deploying 16 agents on bcube,4,1 (Docker) with Ansible, beside the `docker exec` start it
replaced, in the same run and on the same lab.

    sudo .venv/bin/python bench/deploy.py [--repeat 3] [--compare]

Baseline: the `exec` deployer (orchestrator/deploy/direct.py): `docker exec -d` of each
agent, then the same wait for health. Ours: playbooks/deploy.yml through ansible-runner and
the testbed_nsenter connection, forks 16, strategy free: a first run (after an undeploy:
files written, services linked, svscan starting them within its 5 s scan, health waited
for), and a rerun with nothing changed (changed=0). Goals (issue 15): first run <= 30 s,
rerun <= 15 s on a 2-core machine. --compare also times first runs and reruns with other
forks and strategies. Prints a table and one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.deploy import deploy, undeploy  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.control import driver  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

GOALS = {"first": 30.0, "rerun": 15.0}


def timed(action) -> tuple[float, object]:
    started = time.monotonic()
    result = action()
    return time.monotonic() - started, result


def baseline(lab) -> float:
    seconds, endpoints = timed(lambda: deploy(lab, via="exec").endpoints)
    driver.shutdown(endpoints)  # unsupervised: they exit
    deadline = time.monotonic() + 10
    while any(lab.exec(s.name, "pgrep -f 'testbed-agent --node'").returncode == 0 for s in lab.topology.servers[:1]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1)
    return seconds


def ansible(lab, forks: int, strategy: str) -> dict:
    undeploy(lab)
    extravars = {"testbed_strategy": strategy}
    first, deployment = timed(lambda: deploy(lab, extravars=extravars, forks=forks))
    rerun, again = timed(lambda: deploy(lab, extravars=extravars, forks=forks))
    assert sum(again.result.changed.values()) == 0, again.result.changed
    assert len(deployment.endpoints) == 16
    return {"first": first, "rerun": rerun}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", action="store_true", help="also forks 4 and 8, and strategy linear")
    args = parser.parse_args()
    spec = lab_from_argument("bcube,4,1", name="bench-deploy", **{"servers.runtime": "docker"})
    settings = [(16, "free")] + ([(16, "linear"), (8, "free"), (4, "free")] if args.compare else [])
    rows: dict[str, list[float]] = {}
    with Lab.up(spec) as lab:
        for _ in range(args.repeat):
            rows.setdefault("docker exec (baseline)", []).append(baseline(lab))
            for forks, strategy in settings:
                measured = ansible(lab, forks, strategy)
                for key in ("first", "rerun"):
                    rows.setdefault(f"ansible {key}, forks {forks}, {strategy}", []).append(measured[key])
            undeploy(lab)
    base = statistics.median(rows["docker exec (baseline)"])
    print(f"{'16 agents on bcube,4,1 (docker)':<40} {'median s':>9} {'runs':>24} {'× exec':>7} {'goal':>6}")
    for name, values in rows.items():
        kind = "first" if " first," in name else "rerun" if " rerun," in name else None
        goal = GOALS.get(kind) if name.endswith("forks 16, free") else None
        median = statistics.median(values)
        verdict = "" if goal is None else ("ok" if median <= goal else "MISSED")
        print(f"{name:<40} {median:>9.2f} {' '.join(f'{v:.2f}' for v in values):>24} {median / base:>7.2f} "
              f"{'' if goal is None else f'<={goal:g} {verdict}':>6}")
        print(json.dumps({"measure": name, "median_s": round(median, 3), "runs": [round(v, 3) for v in values],
                          "ratio_to_exec": round(median / base, 2), "goal_s": goal}))


if __name__ == "__main__":
    main()
