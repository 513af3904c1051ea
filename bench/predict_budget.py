#!/usr/bin/env python3
"""What `testbed predict` costs at the edge of the work budget (issue 27): every case is
predicted or refused within 30 s and 1 GiB.

    .venv/bin/python bench/predict_budget.py [--json]

Each case runs the real `testbed predict LAB -a ALG --size 25MB` in a process of its own
under RLIMIT_DATA 1 GiB, and is timed as a whole (start-up included) with its peak resident
memory. The baseline of the same run is `star,8 -a ring`, the smallest prediction: each
case's time is also printed as a ratio to it, so figures from machines of other speeds
compare. No root needed; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 1 << 30
LIMIT_SECONDS = 30.0
BASELINE = ("star,8", "ring", ())
CASES = [
    # refused from the plan's arithmetic, before anything is built
    ("star,4000", "mesh", ()),
    ("star,2000", "ring", ()),
    ("star,4", "ps", ("-o", "shards=1000000000")),
    ("star,4", "ring", ("--partition-bytes", "1")),
    # refused from the path-search estimate, before any path is searched
    ("star,1024", "mesh", ()),
    ("fattree,16", "mesh", ()),
    ("star,4000", "halving-doubling", ()),
    # predicted by events: the largest the event simulation's budget lets through
    ("star,128", "mesh", ()),
    ("star,150", "ring", ()),
    ("fattree,8", "halving-doubling", ()),
    ("bcube,4,2", "hips", ()),
    # predicted step by step (cost/stepwise.py): past the event simulation's budget
    ("fattree,16", "ring", ()),
    ("torus,8,3", "hips", ()),
    ("fattree,16", "halving-doubling", ()),
    ("fattree,8", "mesh", ()),
]


def predict(lab: str, algorithm: str, extra: tuple[str, ...]) -> dict:
    command = [str(ROOT / ".venv/bin/testbed"), "predict", lab, "-a", algorithm, "--size", "25MB", *extra]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))

    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, preexec_fn=limit)
        killer = threading.Timer(120, child.kill)  # a hang is a finding, not a wait
        killer.start()
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        killer.cancel()
        seconds = time.monotonic() - start
        errors.seek(0)
        stderr = errors.read()
    code = os.waitstatus_to_exitcode(status)
    peak = usage.ru_maxrss  # KiB
    return {"lab": lab, "algorithm": algorithm, "extra": " ".join(extra), "exit": code, "seconds": round(seconds, 2),
            "peak_mib": round(peak / 1024, 1),
            "outcome": "predicted" if code == 0 else ("refused" if code == 2 else f"FAILED {stderr.strip()[-200:]}"),
            "within": code in (0, 2) and seconds <= LIMIT_SECONDS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    args = parser.parse_args()
    baseline = predict(*BASELINE)
    rows = [predict(*case) for case in CASES]
    for row in [baseline, *rows]:
        row["x_baseline"] = round(row["seconds"] / baseline["seconds"], 1)
    if args.json:
        for row in [baseline, *rows]:
            print(json.dumps(row))
    else:
        print(f"{'predict':<48} {'outcome':<10} {'s':>6} {'× base':>7} {'peak MiB':>9}")
        for row in [baseline, *rows]:
            name = f"{row['lab']} -a {row['algorithm']} {row['extra']}".strip()
            print(f"{name:<48} {row['outcome'][:60]:<10} {row['seconds']:>6.2f} {row['x_baseline']:>7.1f} "
                  f"{row['peak_mib']:>9.0f}")
    bad = [row for row in rows if not row["within"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases predicted or refused within {LIMIT_SECONDS:.0f} s and 1 GiB",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
