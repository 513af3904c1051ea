#!/usr/bin/env python3
"""What no simulator gives (issue 32), measured beside predicted, each in one run:

- stragglers: a ring whose workers' compute is lognormal, and the same ring with every worker
  at the mean, on one lab; each point's time per synchronisation measured / predicted, and
  the skew's cost predicted and measured (skewed less even);
- jobs: two 4-server ring jobs on bcube,4,1 (50 Mbit), alone and together, packed (their
  rings apart) and placed where their rings relay through the same servers (random, seeds 1
  and 11); each job's interference factor (together / alone) measured and predicted;
- torch: PyTorch's gloo all_reduce and the project's ring on one lab (default star,8 at
  200 Mbit, 12.5 MB back to back), each beside the model's ring, and ours over gloo's time;
- queues: in the vm tier (Debian 12's stock kernel under qemu: this kernel has no sch_red nor
  dctcp), a 16-server TCP mesh on star,16 at 10 Mbit, tail-drop FIFO with cubic and RED
  marking at K = 20 packets with dctcp: the 99th percentile of every link direction's
  queueing delay, drops and marks, and red+dctcp's p99 over fifo+cubic's
  (tests/vm/guest/test_queues.py; about 4 minutes).

    .venv/bin/python bench/beyond.py [--only stragglers,jobs,torch,queues] [--lab star,8] [--rate 200Mbit]
                                     [--size 12.5MB] [--mean 50ms] [--sd 20ms] [--iterations 20] [--json]

Runs `testbed run` (root: netns labs) on generated experiments; prints a table, or JSON
lines with --json. Goals: each ratio within [0.90, 1.10]; ours no slower than gloo.
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

CASES = ("stragglers", "jobs", "torch", "queues")


def _lab(args, name: str, topology: str, rate: str) -> dict:
    from orchestrator.spec import lab_from_argument

    return {"name": name, "topology": lab_from_argument(topology).topology.model_dump(mode="json"),
            "links": {"bandwidth": rate}, "servers": {"runtime": "netns"}}


def run(spec: dict, out: Path) -> dict:
    """`testbed run` of `spec`; its results.json."""
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"testbed run failed:\n{done.stderr[-2000:]}")
    return json.loads((out / "results.json").read_text())


def stragglers(args, tmp: Path) -> list[dict]:
    elements = max(1, int(units.parse_size(args.size)) // 4)

    def one(compute, name: str) -> dict:
        spec = {"name": "beyond", "lab": _lab(args, "bench-beyond", args.lab, args.rate),
                "agents": {"via": "nsenter", "algorithms": ["ring"],
                           "workload": {"kind": "tensors", "tensors": [elements], "compute": compute}},
                "iterations": args.iterations, "warmup": 2}
        (point,) = run(spec, tmp / name)["points"]
        return point

    even = one(args.mean, "even")
    skewed = one({"distribution": "lognormal", "mean": args.mean, "sd": args.sd, "seed": args.seed}, "skewed")
    rows = []
    for label, point in (("even", even), ("lognormal", skewed)):
        measured, predicted = point["sync_s"]["fault_free_mean"], point["predicted"]["seconds"]
        rows.append({"case": f"stragglers {label}", "lab": args.lab, "rate": args.rate, "size": args.size,
                     "measured_s": measured, "predicted_s": predicted, "ratio": point["ratio"],
                     "skew_predicted_s": (point["predicted"].get("parts") or {}).get("skew"),
                     "verdict": (point.get("fidelity") or {}).get("verdict")})
    cost = {"case": "skew's cost", "measured_s": rows[1]["measured_s"] - rows[0]["measured_s"],
            "predicted_s": rows[1]["predicted_s"] - rows[0]["predicted_s"]}
    cost["ratio"] = cost["measured_s"] / cost["predicted_s"] if cost["predicted_s"] > 0 else None
    return rows + [cost]


def jobs(args, tmp: Path) -> list[dict]:
    spec = {"name": "beyond-jobs", "lab": _lab(args, "bench-jobs", "bcube,4,1", "50Mbit"),
            "agents": {"workload": {"kind": "tensors", "tensors": [250_000], "compute": "10ms"}},
            "jobs": [{"name": "a", "servers": {"count": 4, "seed": 1}, "algorithm": "ring"},
                     {"name": "b", "servers": {"count": 4, "seed": 11}, "algorithm": "ring"}],
            "iterations": max(6, args.iterations // 2), "warmup": 1, "sweep": {"placements": ["packed", "random"]}}
    rows = []
    for row in run(spec, tmp / "jobs")["jobs"]:
        measured, predicted = row["factor_measured"], row["factor_predicted"]
        rows.append({"case": f"jobs {row['placement']} {row['job']}", "lab": "bcube,4,1", "rate": "50Mbit",
                     "servers": row["servers"], "measured_s": row["together_measured_s"],
                     "predicted_s": row["together_predicted_s"], "factor_measured": measured,
                     "factor_predicted": predicted,
                     "ratio": measured / predicted if measured and predicted else None})
    return rows


def torch(args, tmp: Path) -> list[dict]:
    spec = {"name": "beyond-torch", "lab": _lab(args, "bench-torch", args.lab, args.rate),
            "agents": {"algorithms": ["ring", {"name": "ring", "framework": "torch"}],
                       "workload": {"kind": "back-to-back", "size": args.size}},
            "iterations": 6, "warmup": 1}
    ours, gloo = run(spec, tmp / "torch")["points"]
    rows = [{"case": f"torch {p['algorithm']}", "lab": args.lab, "rate": args.rate, "size": args.size,
             "measured_s": p["sync_s"]["fault_free_mean"], "predicted_s": p["predicted"]["seconds"],
             "ratio": p["ratio"], "checker": (p.get("checker") or {}).get("summary"),
             "verdict": (p.get("fidelity") or {}).get("verdict")} for p in (ours, gloo)]
    rows.append({"case": "ours / gloo (time)", "measured_s": rows[0]["measured_s"], "predicted_s": rows[1]["measured_s"],
                 "ratio": rows[0]["measured_s"] / rows[1]["measured_s"]})
    return rows


def queues(args, tmp: Path) -> list[dict]:
    from tests.vm import qemu
    from tests.vm.test_vm_tier import figures, guest_pytest

    try:
        kernel = qemu.prepare()
    except qemu.VmUnavailable as exc:
        sys.exit(f"queues: the vm tier cannot boot here: {exc}")
    run = qemu.run(kernel, guest_pytest("tests/vm/guest/test_queues.py -k dctcp_marks"), timeout=1200)
    found = figures(run).get("queue_delay_mesh16")
    if run.returncode != 0 or not found:
        sys.exit(f"queues: the guest's mesh failed (exit {run.returncode}):\n{run.output[-3000:]}")
    rows = [{"case": f"mesh16 {label.replace('_', '+')}", "measured_s": found[label]["p99_ms"] / 1000,
             "predicted_s": None, "ratio": None, "p50_ms": found[label]["p50_ms"], "drops": found[label]["drops"],
             "marks": found[label]["marks"], "kernel": kernel.package} for label in ("fifo_cubic", "red_dctcp")]
    rows.append({"case": "p99 red+dctcp / fifo", "measured_s": rows[1]["measured_s"], "predicted_s": rows[0]["measured_s"],
                 "ratio": found["p99_red_over_fifo"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(CASES), help="which cases, comma separated")
    parser.add_argument("--lab", default="star,8")
    parser.add_argument("--rate", default="200Mbit")
    parser.add_argument("--size", default="12.5MB")
    parser.add_argument("--mean", default="50ms")
    parser.add_argument("--sd", default="20ms")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        sys.exit(f"--only: no case {unknown[0]}: use some of {', '.join(CASES)}")
    if os.geteuid() != 0:
        sys.exit("bench/beyond.py builds netns labs: run it as root")
    rows = []
    with tempfile.TemporaryDirectory(prefix="beyond-") as tmp:
        for case in chosen:
            rows += {"stragglers": stragglers, "jobs": jobs, "torch": torch, "queues": queues}[case](args, Path(tmp))
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"{'case':<22} {'measured s':>11} {'predicted s':>12} {'ratio':>7}  (jobs: factor measured / predicted; "
          "mesh16: p99 queueing delay, drops, marks)")
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row.get("ratio") is not None else "-"
        factor = (f"  {row['factor_measured']:.3f} / {row['factor_predicted']:.3f}"
                  if row.get("factor_measured") and row.get("factor_predicted") else "")
        queue = (f"  p50 {row['p50_ms']} ms, drops {row['drops']}, marks {row['marks']} ({row['kernel']})"
                 if "marks" in row else "")
        predicted = "-" if row.get("predicted_s") is None else f"{row['predicted_s']:.4f}"
        print(f"{row['case']:<22} {row['measured_s'] or 0:>11.4f} {predicted:>12} {ratio:>7}{factor}"
              f"{queue}")


if __name__ == "__main__":
    main()
