#!/usr/bin/env python3
"""Lab bring-up and teardown against raw Mininet, same graph and shaping, in the same run.

    sudo .venv/bin/python bench/lab_bringup.py [--repeat 3] [--skip-baseline | --mininet-max-k 4] [--only fattree-16 ...]

Baseline: bench/mininet_baseline.py (a copy of ../shared/bench/mininet_baseline.py): raw
Mininet 2.3.0 building a Fat-Tree(k) with LinuxBridge switches and 100 Mbit TCLinks.
Ours: the same graph (same nodes and links, every link HTB-shaped to 100 Mbit both ways),
`Lab.up` in `netns`; and BCube(4,1) with 16 Docker containers. Each timed `up` follows a
quiet gap of QUIET_S seconds, as each Mininet baseline runs in a fresh process; the
`up_down_cycle_s` column is an up+down started right after a down, for contrast. Goals (issue 3): fattree-8
netns up <= 5 s, down <= 3 s; bcube-4-1 docker up <= 15 s, down <= 5 s. Goals (issue 13):
fattree-16 (1,024 servers) up <= 60 s, down <= 10 s, host memory <= 1.5 GiB.

Raw Mininet bridges the fat-tree's loops with LinuxBridge and no STP: while its k=8 network is
up, broadcasts circle (121 million softnet drops here) and slow the whole machine for the
~15 minutes its teardown then takes; on a shared machine, --mininet-max-k 4.

fattree-12 and fattree-16 have no Mininet baseline: raw Mininet took 41 s up and 210 s down
at k=8 (384 links) and grows faster than the link count, so k=16 (3,072 links) would take
hours. Their baseline is our own fattree-8 of the same run, scaled by the number of kernel
objects (namespaces + links): the `per-object` ratio is 1.0 when a lab's time grows
linearly from fattree-8's. They need more learnt ARP entries than a stock kernel allows
(`up` refuses them otherwise), so the run raises net.ipv4.neigh.default.gc_thresh3 for
their duration and puts it back. Prints a table and one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.emulation import Lab, capacity, docker_engine, images  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402
from orchestrator.topology import from_lab  # noqa: E402

HERE = Path(__file__).resolve().parent
GOALS = {("fattree-8", "netns"): (5.0, 3.0), ("bcube-4-1", "docker"): (15.0, 5.0),
         ("fattree-16", "netns"): (60.0, 10.0)}
MEMORY_GOALS_MIB = {("fattree-16", "netns"): 1536}
NAME_PREFIX = "bench-"  # never the name of a lab someone else may have up on this machine
GC_THRESH3 = Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3")


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
    name = NAME_PREFIX + argument.replace(",", "-")
    spec = lab_from_argument(argument, **{"servers.runtime": runtime, "links.bandwidth": "100Mbit", "name": name})
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
        "links": len(lab.topology.links), "objects": len(lab.topology.nodes) + len(lab.topology.links),
    }


@contextmanager
def neighbour_room(argument: str):
    """Raise the host-wide ARP table limit to what `up` asks for this lab, then restore it."""
    need = capacity.estimate(from_lab(lab_from_argument(argument)), "netns")
    wanted = 1 << max(need.neighbours, need.neighbours_all_pairs).bit_length()
    before = int(GC_THRESH3.read_text())
    if before < need.neighbours:
        print(f"# {argument}: net.ipv4.neigh.default.gc_thresh3 {before} -> {wanted} for this run", flush=True)
        GC_THRESH3.write_text(str(wanted))
    try:
        yield
    finally:
        if before < need.neighbours:
            GC_THRESH3.write_text(str(before))


def _containers_mib(lab: Lab) -> float:
    api = docker_engine.client().api
    total = 0
    for server in lab.topology.servers:
        stats = api.stats(lab.plan.container_name(server.name), stream=False)
        total += stats.get("memory_stats", {}).get("usage", 0)
    return total / 2**20


LABS = [  # (name, shorthand, runtime, Mininet baseline k or None)
    ("fattree-4", "fattree,4", "netns", 4),
    ("fattree-8", "fattree,8", "netns", 8),
    ("bcube-4-1", "bcube,4,1", "docker", None),
    ("fattree-12", "fattree,12", "netns", None),
    ("fattree-16", "fattree,16", "netns", None),
]
NO_MININET = "raw Mininet: 210 s down at k=8, hours at this size; baseline: our fattree-8 per object"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-baseline", action="store_true", help="skip raw Mininet (k=8 takes minutes)")
    parser.add_argument("--mininet-max-k", type=int, default=8, help="largest Fat-Tree raw Mininet builds")
    parser.add_argument("--only", nargs="*", help="lab names to run (fattree-8 always runs: it is the big ones' baseline)")
    args = parser.parse_args()
    wanted = set(args.only or [name for name, *_ in LABS]) | {"fattree-8"}
    if any(runtime == "docker" and name in wanted for name, _, runtime, _ in LABS):
        images.build_all(lambda line: None)
    rows = []
    for name, argument, runtime, k in LABS:
        if name not in wanted:
            continue
        base = None if args.skip_baseline or k is None or k > args.mininet_max_k else baseline(k)
        with neighbour_room(argument):
            mine = ours(argument, runtime, args.repeat)
        rows.append((name, runtime, mine, base))
    reference = next(mine for name, _, mine, _ in rows if name == "fattree-8")
    no_mininet = {name for name, _, _, k in LABS if k is None}

    print(f"{'lab':<11} {'runtime':<7} {'up s':>6} {'down s':>7} {'Mininet up':>11} {'Mininet down':>13} "
          f"{'up ratio':>9} {'down ratio':>11} {'per-object up/down':>19} {'goal up/down':>13} {'host MiB':>9}")
    for name, runtime, mine, base in rows:
        goal = GOALS.get((name, runtime))
        ratio_up = f"{mine['up_s'] / base['up_s']:.3f}" if base else "-"
        ratio_down = f"{mine['down_s'] / base['down_s']:.4f}" if base else "-"
        scaled = "-"
        if name in no_mininet and runtime == "netns":
            scale = mine["objects"] / reference["objects"]
            scaled = f"{mine['up_s'] / (reference['up_s'] * scale):.2f}/{mine['down_s'] / (reference['down_s'] * scale):.2f}"
        print(
            f"{name:<11} {runtime:<7} {mine['up_s']:6.2f} {mine['down_s']:7.2f} "
            f"{(base['up_s'] if base else float('nan')):11.2f} {(base['down_s'] if base else float('nan')):13.2f} "
            f"{ratio_up:>9} {ratio_down:>11} {scaled:>19} {(f'{goal[0]:g}/{goal[1]:g}' if goal else '-'):>13} "
            f"{mine['host_memory_mib'] + mine['containers_memory_mib']:9.1f}"
        )
    if any(name in no_mininet and runtime == "netns" for name, runtime, _, _ in rows):
        print(f"# fattree-12, fattree-16: {NO_MININET}")
    for name, runtime, mine, base in rows:
        goal = GOALS.get((name, runtime))
        memory_goal = MEMORY_GOALS_MIB.get((name, runtime))
        meets = None
        if goal:
            meets = mine["up_s"] <= goal[0] and mine["down_s"] <= goal[1]
            if memory_goal:
                meets = meets and mine["host_memory_mib"] <= memory_goal
        print(json.dumps({"lab": name, "runtime": runtime, "ours": mine, "mininet": base,
                          "baseline_note": NO_MININET if name in no_mininet and runtime == "netns" else None,
                          "goal_up_s": goal[0] if goal else None, "goal_down_s": goal[1] if goal else None,
                          "goal_memory_mib": memory_goal, "meets_goal": meets}))
    print(json.dumps({"orchestrator_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
