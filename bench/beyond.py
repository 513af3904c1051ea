#!/usr/bin/env python3
"""What no simulator gives (issue 32), measured beside predicted, each in one run. So far:
stragglers — a ring whose workers' compute is lognormal, and the same ring with every worker
at the mean, on one lab; each point's time per synchronisation measured / predicted, and the
skew's cost predicted and measured (skewed less even).

    .venv/bin/python bench/beyond.py [--lab star,8] [--rate 200Mbit] [--size 12.5MB]
                                     [--mean 50ms] [--sd 20ms] [--iterations 20] [--json]

Runs `testbed run` (root: a netns lab) on a generated experiment; prints a table, or JSON
lines with --json. Goal: each ratio within [0.90, 1.10].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator import units  # noqa: E402


def experiment(args, compute) -> dict:
    elements = max(1, int(units.parse_size(args.size)) // 4)
    return {
        "name": "beyond",
        "lab": {"name": "bench-beyond", "topology": args.lab, "links": {"bandwidth": args.rate},
                "servers": {"runtime": "netns"}},
        "agents": {"via": "nsenter", "algorithms": ["ring"],
                   "workload": {"kind": "tensors", "tensors": [elements], "compute": compute}},
        "iterations": args.iterations, "warmup": 2,
    }


def run(args, compute, out: Path) -> dict:
    path = out.with_suffix(".yaml")
    spec = experiment(args, compute)
    if "," in args.lab:  # a shorthand: written as the lab file's topology mapping
        from orchestrator.spec import lab_from_argument

        spec["lab"]["topology"] = lab_from_argument(args.lab).topology.model_dump(mode="json")
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"testbed run failed:\n{done.stderr[-2000:]}")
    (point,) = json.loads((out / "results.json").read_text())["points"]
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default="star,8")
    parser.add_argument("--rate", default="200Mbit")
    parser.add_argument("--size", default="12.5MB")
    parser.add_argument("--mean", default="50ms")
    parser.add_argument("--sd", default="20ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/beyond.py builds a netns lab: run it as root")
    with tempfile.TemporaryDirectory(prefix="beyond-") as tmp:
        even = run(args, args.mean, Path(tmp) / "even")
        skewed = run(args, {"distribution": "lognormal", "mean": args.mean, "sd": args.sd, "seed": args.seed},
                     Path(tmp) / "skewed")
    rows = []
    for label, point in (("even", even), ("lognormal", skewed)):
        measured, predicted = point["sync_s"]["fault_free_mean"], point["predicted"]["seconds"]
        rows.append({"case": f"stragglers {label}", "lab": args.lab, "rate": args.rate, "size": args.size,
                     "measured_s": measured, "predicted_s": predicted, "ratio": point["ratio"],
                     "skew_predicted_s": (point["predicted"].get("parts") or {}).get("skew"),
                     "verdict": (point.get("fidelity") or {}).get("verdict")})
    rows.append({"case": "skew's cost", "measured_s": rows[1]["measured_s"] - rows[0]["measured_s"],
                 "predicted_s": rows[1]["predicted_s"] - rows[0]["predicted_s"]})
    rows[-1]["ratio"] = rows[-1]["measured_s"] / rows[-1]["predicted_s"] if rows[-1]["predicted_s"] > 0 else None
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"{'case':<22} {'measured s':>11} {'predicted s':>12} {'ratio':>7}")
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row.get("ratio") is not None else "-"
        print(f"{row['case']:<22} {row['measured_s']:>11.4f} {row['predicted_s']:>12.4f} {ratio:>7}")


if __name__ == "__main__":
    main()
