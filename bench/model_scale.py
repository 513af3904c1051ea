#!/usr/bin/env python3
"""The cost model on 1,024-server labs (issue 31 item 6): ring, HiPS and halving-doubling
predicted within 10 s and 1 GiB each; and, where the event simulation also runs (16 to 128
servers), how far the step-level model it takes past its budget is from it.

    .venv/bin/python bench/model_scale.py [--repeat 3] [--size 25MB] [--json] [--no-agreement] [CASE ...]

A CASE is LAB:ALGORITHM (e.g. fattree,16:ring); default: every case below. Each run is one
child process that builds the lab, predicts (`cost.report.predict_lab`, the library entry of
`testbed predict`) and reports its own wall time and peak RSS (resource.getrusage), so one
case's memory does not count against the next. The best of `--repeat` runs is kept: the
machines this runs on are shared and noisy. A case the model refuses (a work budget) prints
its one-line refusal instead of figures, with the seconds it took to refuse.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 10.0
GOAL_BYTES = 1 << 30
CASES = [
    ("fattree,16", "ring"), ("fattree,16", "halving-doubling"),
    ("bcube,32,1", "ring"), ("bcube,32,1", "hips"), ("bcube,32,1", "halving-doubling"),
    ("torus,4,5", "ring"), ("torus,4,5", "halving-doubling"),
    ("torus,8,3", "hips"),  # 512 servers: the case measured at 29 s and 1.3 GB before
]

# What one child runs: the lab, the prediction, and its own cost (JSON on its last line).
CHILD = r"""
import json, resource, sys, time
start = time.perf_counter()
from orchestrator.cost.report import predict_lab
from orchestrator.errors import BadUsage
from orchestrator.spec import lab_from_argument
lab, algorithm, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    report = predict_lab(lab_from_argument(lab), algorithm, size)
    outcome = {"seconds_predicted": report.prediction.seconds, "workers": report.prediction.workers,
               "events": report.prediction.events, "form": report.form_seconds, "model": report.prediction.model}
except BadUsage as exc:
    outcome = {"refused": str(exc)}
outcome["wall"] = time.perf_counter() - start
outcome["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(outcome))
"""


# Where both models run: the step-level model's time against the event simulation's, with α
# (100 µs, 20 µs more per peer past two) and the agents sharing 2 cores, as on this machine
AGREEMENT = [
    ("star,8", "ring"), ("fattree,4", "ring"), ("bcube,8,1", "ring"), ("torus,8,2", "ring"), ("fattree,8", "ring"),
    ("bcube,4,1", "hips"), ("torus,4,2", "hips"), ("torus,8,2", "hips"), ("bcube,3,2", "hips"),
    ("star,8", "halving-doubling"), ("bcube,3,1", "halving-doubling"), ("fattree,4", "halving-doubling"),
    ("bcube,8,1", "halving-doubling"), ("torus,8,2", "halving-doubling"), ("fattree,8", "halving-doubling"),
]
AGREEMENT_SIZES = (64 << 10, 4 << 20, 25 << 20)

AGREE_CHILD = r"""
import json, sys
from orchestrator.cost.compiled import over_servers
from orchestrator.cost.network import Network
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import ModelTooLarge, simulate
from orchestrator.cost.stepwise import stepwise
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab
lab, algorithm, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = lab_from_argument(lab)
topology = from_lab(spec)
run = over_servers(topology, algorithm, size)
network = Network.from_links(spec.links, None, 100e-6, 2, peer_latency=20e-6)
routes = Routes(topology)
steps = stepwise(routes, run.schedules, list(run.nodes), network, run.chunk_bytes).seconds
try:
    event = simulate(routes, run.schedules, list(run.nodes), network, run.chunk_bytes).seconds
except ModelTooLarge:
    event = None
print(json.dumps({"steps": steps, "event": event}))
"""


def agreement(lab: str, algorithm: str, size: int) -> dict:
    done = subprocess.run([sys.executable, "-c", AGREE_CHILD, lab, algorithm, str(size)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_once(lab: str, algorithm: str, size: int) -> dict:
    """One prediction in a fresh interpreter: its outcome, wall seconds and peak RSS bytes."""
    done = subprocess.run([sys.executable, "-c", CHILD, lab, algorithm, str(size)], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        return {"refused": f"crashed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}", "wall": 0.0,
                "rss": 0}
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of(lab: str, algorithm: str, size: int, repeat: int) -> dict:
    """The fastest of `repeat` runs, with the largest peak memory seen (memory is not noise)."""
    runs = [run_once(lab, algorithm, size) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["wall"])
    return {**best, "rss": max(r["rss"] for r in runs), "runs": repeat}


def parse_size(text: str) -> int:
    from orchestrator.units import parse_size as parse

    return parse(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="LAB:ALGORITHM (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is kept")
    parser.add_argument("--size", default="25MB", help="gradient size (default 25MB)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-agreement", action="store_true", help="leave out the step-level model's agreement")
    args = parser.parse_args()
    cases = [tuple(case.split(":", 1)) for case in args.cases] or CASES
    size = parse_size(args.size)
    results = []
    for lab, algorithm in cases:
        result = {"lab": lab, "algorithm": algorithm, **best_of(lab, algorithm, size, max(1, args.repeat))}
        results.append(result)
        if not args.json:
            print(line(result), flush=True)
    agreed = []
    if not args.no_agreement and not args.cases:
        if not args.json:
            print("\nstep-level model / event simulation where both run "
                  "(α 100 µs, 20 µs per peer past two, 2 cores):")
        for lab, algorithm in AGREEMENT:
            for each in AGREEMENT_SIZES:
                row = {"lab": lab, "algorithm": algorithm, "size": each, **agreement(lab, algorithm, each)}
                agreed.append(row)
                if not args.json:
                    print(agreement_line(row), flush=True)
        ratios = [row["steps"] / row["event"] for row in agreed if row.get("event")]
        if not args.json and ratios:
            print(f"{len(ratios)} cases: step / event from {min(ratios):.3f} to {max(ratios):.3f}")
    if args.json:
        print(json.dumps({"cases": results, "agreement": agreed}, indent=1))


def agreement_line(row: dict) -> str:
    head = f"  {row['lab']:<11} {row['algorithm']:<17} {row['size'] / 2**20:8.4g} MiB"
    if "error" in row:
        return f"{head}  error: {row['error']}"
    if row["event"] is None:
        return f"{head}  steps {row['steps']:.6g} s; the event simulation is past its budget"
    ratio = row["steps"] / row["event"]
    return f"{head}  steps {row['steps']:.6g} s  event {row['event']:.6g} s  step / event {ratio:.3f}"


def line(result: dict) -> str:
    wall, rss = result["wall"], result["rss"]
    head = f"{result['lab']:<12} {result['algorithm']:<17} {wall:7.2f} s ({wall / GOAL_SECONDS:5.2f} of 10 s)  " \
           f"{rss / 2**20:7.0f} MiB ({rss / GOAL_BYTES:5.2f} of 1 GiB)"
    if "refused" in result:
        return f"{head}  refused: {result['refused']}"
    model = result.get("model", "event")
    return f"{head}  {result['workers']} workers, {result['seconds_predicted']:.6g} s predicted " \
           f"({model} model, {result['events']} {'steps' if model == 'steps' else 'events'})"


if __name__ == "__main__":
    main()
