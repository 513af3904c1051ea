#!/usr/bin/env python3
"""Lab bring-up and teardown against raw Mininet, same graph and shaping, in the same run.

    sudo .venv/bin/python bench/lab_bringup.py [--repeat 3] [--skip-baseline]

Baseline: bench/mininet_baseline.py (a copy of ../shared/bench/mininet_baseline.py): raw
Mininet 2.3.0 building a Fat-Tree(k) with LinuxBridge switches and 100 Mbit TCLinks.
Ours: the same graph (same nodes and links, every link HTB-shaped to 100 Mbit both ways),
`Lab.up` in `netns`; and BCube(4,1) with 16 Docker containers. Each timed `up` follows a
quiet gap of QUIET_S seconds, as each Mininet baseline runs in a fresh process; the
`up_down_cycle_s` column is an up+down started right after a down, for contrast. Goals (issue 3): fattree-8
netns up <= 5 s, down <= 3 s; bcube-4-1 docker up <= 15 s, down <= 5 s. Prints a table and
one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.emulation import Lab, docker_engine, images  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

HERE = Path(__file__).resolve().parent
GOALS = {("fattree-8", "netns"): (5.0, 3.0), ("bcube-4-1", "docker"): (15.0, 5.0)}


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline(k: int) -> dict:
    result = subprocess.run(
        [sys.executable, str(HERE / "mininet_baseline.py"), "--k", str(k), "--bw", "100"],
        capture_output=True, text=True, check=True,
    )
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return {"up_s": data["build_s"] + data["start_s"], "down_s": data["stop_s"], **data}


QUIET_S = 10  # the kernel frees a torn-down lab's namespaces in the background for seconds


def ours(argument: str, runtime: str, repeat: int) -> dict:
    """Timed up and down after a quiet gap, then an untimed-gap cycle (down → up at once),
    which shows what the kernel's background teardown of the last lab costs the next."""
    spec = lab_from_argument(argument, **{"servers.runtime": runtime, "links.bandwidth": "100Mbit"})
    ups, downs, mem, cycle = [], [], [], []
    for _ in range(repeat):
        time.sleep(QUIET_S)
        free = mem_available_mib()
        start = time.monotonic()
        lab = Lab.up(spec)
        ups.append(time.monotonic() - start)
        time.sleep(1)
        mem.append(free - mem_available_mib())
        containers_mib = _containers_mib(lab) if runtime == "docker" else 0.0
        start = time.monotonic()
        lab.down()
        downs.append(time.monotonic() - start)
        # straight after a down: the kernel is still tearing the last lab down
        start = time.monotonic()
        Lab.up(spec).down()
        cycle.append(time.monotonic() - start)
    return {
        "up_s": statistics.median(ups), "down_s": statistics.median(downs),
        "up_all": [round(x, 2) for x in ups], "down_all": [round(x, 2) for x in downs],
        "up_down_cycle_s": statistics.median(cycle),
        "host_memory_mib": round(statistics.median(mem), 1),
        "containers_memory_mib": round(containers_mib, 1),
        "servers": len(lab.topology.servers), "switches": len(lab.topology.switches),
        "links": len(lab.topology.links),
    }


def _containers_mib(lab: Lab) -> float:
    api = docker_engine.client().api
    total = 0
    for server in lab.topology.servers:
        stats = api.stats(lab.plan.container_name(server.name), stream=False)
        total += stats.get("memory_stats", {}).get("usage", 0)
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-baseline", action="store_true", help="skip raw Mininet (k=8 takes minutes)")
    args = parser.parse_args()
    images.build_all(lambda line: None)
    rows = []
    for k in (4, 8):
        base = None if args.skip_baseline else baseline(k)
        mine = ours(f"fattree,{k}", "netns", args.repeat)
        rows.append((f"fattree-{k}", "netns", mine, base))
    rows.append(("bcube-4-1", "docker", ours("bcube,4,1", "docker", args.repeat), None))

    print(f"{'lab':<11} {'runtime':<7} {'up s':>6} {'down s':>7} {'Mininet up':>11} {'Mininet down':>13} "
          f"{'up ratio':>9} {'down ratio':>11} {'goal up/down':>13} {'host MiB':>9}")
    for name, runtime, mine, base in rows:
        goal = GOALS.get((name, runtime))
        ratio_up = f"{mine['up_s'] / base['up_s']:.3f}" if base else "-"
        ratio_down = f"{mine['down_s'] / base['down_s']:.4f}" if base else "-"
        print(
            f"{name:<11} {runtime:<7} {mine['up_s']:6.2f} {mine['down_s']:7.2f} "
            f"{(base['up_s'] if base else float('nan')):11.2f} {(base['down_s'] if base else float('nan')):13.2f} "
            f"{ratio_up:>9} {ratio_down:>11} {(f'{goal[0]:g}/{goal[1]:g}' if goal else '-'):>13} "
            f"{mine['host_memory_mib'] + mine['containers_memory_mib']:9.1f}"
        )
    for name, runtime, mine, base in rows:
        goal = GOALS.get((name, runtime))
        print(json.dumps({"lab": name, "runtime": runtime, "ours": mine, "mininet": base,
                          "goal_up_s": goal[0] if goal else None, "goal_down_s": goal[1] if goal else None,
                          "meets_goal": (mine["up_s"] <= goal[0] and mine["down_s"] <= goal[1]) if goal else None}))
    print(json.dumps({"orchestrator_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
