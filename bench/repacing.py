#!/usr/bin/env python3
"""Re-pacing when a link changes under a running run: a run that starts with one link
degraded, which is undone mid-run, with the agents re-paced (the default) and without
(`links_now=None`: the pacing stays as the run started), pair by pair on one live lab.

    sudo .venv/bin/python bench/repacing.py [--lab star,8] [--rate 200Mbit] [--link h0-sw]
                                            [--degraded 50Mbit] [--algorithm ring] [--mbytes 12.5]
                                            [--iterations 7] [--undo-at 2] [--pairs 2]

Each run allreduces ResNet-50's gradient layout scaled to `--mbytes` back to back; the
degrade is undone once every agent has entered iteration `--undo-at`. The figure is the
time per synchronisation of the iterations after the next one (re-paced from there),
against the model's prediction for the same schedules and paths on the undegraded lab.
Prints each run, then one JSON line; exits 1 when the re-paced runs' median ratio leaves
[0.90, 1.10].
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.control import workloads  # noqa: E402
from orchestrator.control.endpoints import run_ids, until_iteration  # noqa: E402
from orchestrator.control.iterations import sync_times  # noqa: E402
from orchestrator.cost.routes import Routes  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.faults.injector import Injector  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

BAND = (0.90, 1.10)


def one_run(agents, args, tensors, repaced: bool) -> dict:
    injector = Injector(agents.lab)
    previous = run_ids(list(agents))
    degrade = injector.inject("link-degrade", args.link, {"rate": args.degraded})
    undone: list[float] = []

    def undo() -> None:
        try:
            until_iteration(list(agents), args.undo_at, previous, timeout=600)
        finally:
            injector.undo(degrade.fault.id)
            undone.append(time.time())

    thread = threading.Thread(target=undo)
    thread.start()
    try:
        extra = {} if repaced else {"links_now": None}
        result = agents.run(args.algorithm, tensors, workloads.back_to_back(tensors), args.iterations, **extra)
    finally:
        thread.join()
    compiled = result.compiled
    topology = agents.lab.topology  # undegraded: the degrade is undone
    undegraded = compiled.predicted(compiled.network, topology, Routes(topology, compiled.routes.pinned))
    after = sync_times(result.records())[args.undo_at + 1:]
    seconds = statistics.mean(after)
    return {"repaced": repaced, "seconds": seconds, "predicted_s": undegraded.prediction.per_run,
            "ratio": seconds / undegraded.prediction.per_run, "iterations": len(after),
            "repacings": len(result.repaced)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="star,8")
    parser.add_argument("--rate", default="200Mbit")
    parser.add_argument("--link", default="h0-sw")
    parser.add_argument("--degraded", default="50Mbit")
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--mbytes", type=float, default=12.5)
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--undo-at", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    if not 0 <= args.undo_at < args.iterations - 2:
        parser.error("--undo-at: leave at least two iterations after the one the undo falls in")
    full = sum(workloads.model_tensors("resnet50")) * 4
    tensors = workloads.model_tensors("resnet50", args.mbytes * 1e6 / full)
    spec = lab_from_argument(args.lab, name="bench-repace", **{"links.bandwidth": args.rate, "servers.runtime": "netns"})
    runs: list[dict] = []
    with Lab.up(spec) as lab:
        agents = lab_agents.start(lab)
        for pair in range(args.pairs):
            for repaced in (True, False):
                run = one_run(agents, args, tensors, repaced)
                runs.append(run)
                print(f"pair {pair + 1} {'re-paced' if repaced else 'as started':>10}: {run['seconds']:.3f} s per "
                      f"allreduce after the undo, {run['ratio']:.3f} × predicted {run['predicted_s']:.3f} s "
                      f"(re-paced {run['repacings']} times)", flush=True)
    medians = {label: statistics.median(r["ratio"] for r in runs if r["repaced"] == repaced)
               for label, repaced in (("repaced", True), ("as_started", False))}
    print(json.dumps({"lab": args.lab, "rate": args.rate, "link": args.link, "degraded": args.degraded,
                      "algorithm": args.algorithm, "bytes": sum(tensors) * 4, "median_ratio": medians, "runs": runs}))
    return 0 if BAND[0] <= medians["repaced"] <= BAND[1] else 1


if __name__ == "__main__":
    sys.exit(main())
