#!/usr/bin/env python3
"""Emulated capacity: the sum of the server NICs' link rates at which an experiment keeps its
verdict "ok" on this machine (issue 28).

    sudo .venv/bin/python bench/capacity.py [--lab bcube,4,1] [--algorithms hips,ring]
                                            [--rates 100,250,300,350,400,600] [--w-over-b 1.0]

For each rate, lowest first: the lab in bare namespaces with every link at that rate, each
algorithm run as bench/fidelity.py runs it (warm-up, then back to back, against the cost
model's prediction for the same schedules), and judged by the very verdict `testbed run`
gives a point (orchestrator/experiment/verdict.py: CPU idle ≥ 20 % while it ran and measured
/ predicted within [0.90, 1.10]). The gradient grows with the rate so that every point moves
`--w-over-b` seconds of data per link (w/B), and the time it measures stays the same.

An algorithm's capacity is the NIC count × the highest rate at which it and every lower rate
were "ok"; the experiment's is the least over its algorithms. Goal: ≥ 8 Gbit/s on 2 cores
(bcube,4,1 at 100 Mbit, 3.2 Gbit/s, was the edge before). Prints a table and JSON lines;
exits 1 below the goal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fidelity import Case, LabCases, run_lab  # noqa: E402
from orchestrator.experiment import verdict  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402
from orchestrator.topology import from_lab  # noqa: E402
from orchestrator.units import parse_rate  # noqa: E402

GOAL_GBIT = 8.0


def server_nics(lab: str) -> int:
    topology = from_lab(lab_from_argument(lab, name="capacity"))
    return sum(len(topology.links_of(server.name)) for server in topology.servers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="bcube,4,1")
    parser.add_argument("--algorithms", default="hips,ring")
    parser.add_argument("--rates", default="100,250,300,350,400,600", help="Mbit/s, comma-separated")
    parser.add_argument("--w-over-b", type=float, default=1.0, help="seconds of data per link at each rate")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    algorithms = [a for a in args.algorithms.split(",") if a]
    rates = sorted(float(r) for r in args.rates.split(",") if r)
    nics = server_nics(args.lab)
    rows: list[dict] = []

    def progress(row: dict, seconds: float) -> None:
        print(f"  {row['lab']:<12} {row['rate']:<10} {row['algorithm']:<10} ratio {row['ratio']:5.3f}  "
              f"CPU idle {row['cpu_idle']:4.0%}  {row['verdict']}  ({seconds:.0f} s)", file=sys.stderr, flush=True)

    def judged(row: dict, seconds: float) -> None:
        row["verdict"] = verdict.judge({"ratio": row["ratio"], "cpu_idle_share": row["cpu_idle"]})["verdict"]
        progress(row, seconds)

    for mbit in rates:
        rate = f"{mbit:g}Mbit"
        mbytes = args.w_over_b * parse_rate(rate) / 8 / 1e6
        print(f"{args.lab} at {rate} ({nics} server NICs: {nics * mbit / 1000:g} Gbit/s), {mbytes:g} MB:",
              file=sys.stderr, flush=True)
        group = LabCases(args.lab, rate, tuple(Case(a, a) for a in algorithms))
        rows += run_lab(group, mbytes, args.iterations, args.warmup, True, judged)

    capacity: dict[str, float] = {}
    for algorithm in algorithms:
        best = 0.0
        for mbit in rates:  # every rate up to it ok
            row = next(r for r in rows if r["algorithm"] == algorithm and parse_rate(r["rate"]) == mbit * 1e6)
            if row["verdict"] != "ok":
                break
            best = mbit
        capacity[algorithm] = nics * best / 1000
    print(f"\n{'rate':<10} {'algorithm':<10} {'ratio':>6} {'CPU idle':>8}  verdict")
    for r in rows:
        print(f"{r['rate']:<10} {r['algorithm']:<10} {r['ratio']:6.3f} {r['cpu_idle']:8.0%}  {r['verdict']}")
    least = min(capacity.values(), default=0.0)
    print("\nemulated capacity (server NICs × the highest rate ok at it and below): " +
          ", ".join(f"{a} {c:g} Gbit/s" for a, c in capacity.items()) +
          f"; the experiment's {least:g} Gbit/s (goal ≥ {GOAL_GBIT:g})")
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"lab": args.lab, "server_nics": nics, "capacity_gbit": capacity, "least_gbit": least,
                      "goal_gbit": GOAL_GBIT}))
    return 0 if least >= GOAL_GBIT else 1


if __name__ == "__main__":
    sys.exit(main())
