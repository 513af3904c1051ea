#!/usr/bin/env python3
"""The README's Python API, faithful by default: the same HiPS run on one live lab, through
`agents.run(...)` with no further arguments and with `faithful=False`, pair by pair.

    sudo .venv/bin/python bench/python_api.py [--lab bcube,4,1] [--rate 100Mbit] [--mbytes 12.5]
                                              [--algorithm hips] [--pairs 3] [--iterations 5]

Each run allreduces ResNet-50's gradient layout scaled to `--mbytes` back to back; its time
per allreduce (NCCL-tests' way, after one warm-up) is set beside the cost model's prediction
for the very same schedules. Prints each pair, then one JSON line; exits 1 when the default
run's median ratio leaves [0.90, 1.10].
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.control import workloads  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

BAND = (0.90, 1.10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="bcube,4,1")
    parser.add_argument("--rate", default="100Mbit")
    parser.add_argument("--mbytes", type=float, default=12.5)
    parser.add_argument("--algorithm", default="hips")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    full = sum(workloads.model_tensors("resnet50")) * 4
    tensors = workloads.model_tensors("resnet50", args.mbytes * 1e6 / full)
    spec = lab_from_argument(args.lab, name="bench-api", **{"links.bandwidth": args.rate, "servers.runtime": "netns"})
    ratios: dict[str, list[float]] = {"default": [], "faithful=False": []}
    predicted = None
    with Lab.up(spec) as lab:
        agents = lab_agents.start(lab)
        for pair in range(args.pairs):
            for label, extra in (("default", {}), ("faithful=False", {"faithful": False})):
                result = agents.run(args.algorithm, tensors, workloads.back_to_back(tensors), args.iterations, **extra)
                predicted = result.predicted.per_run if result.predicted else predicted
                seconds = statistics.mean(result.back_to_back_times(warmup=1))
                ratios[label].append(seconds / predicted if predicted else float("nan"))
                print(f"pair {pair + 1} {label:>15}: {seconds:.3f} s per allreduce, {ratios[label][-1]:.3f} × predicted "
                      f"{predicted:.3f} s", flush=True)
    medians = {label: statistics.median(values) for label, values in ratios.items()}
    print(json.dumps({"lab": args.lab, "rate": args.rate, "bytes": sum(tensors) * 4, "algorithm": args.algorithm,
                      "predicted_s": predicted, "median_ratio": medians, "ratios": ratios}))
    return 0 if BAND[0] <= medians["default"] <= BAND[1] else 1


if __name__ == "__main__":
    sys.exit(main())
