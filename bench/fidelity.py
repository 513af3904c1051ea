#!/usr/bin/env python3
"""Every algorithm measured beside the cost model's prediction, in the same run.

    sudo .venv/bin/python bench/fidelity.py [--mbytes 12.5] [--iterations 8] [--warmup 3]
                                            [--only bcube,star] [--no-pace]

For each case (issue 14): a lab in bare namespaces, agents deployed with Ansible, the
algorithm run back to back (NCCL-tests' way: `--warmup` untimed iterations, then the time per
allreduce of the rest, mean over agents), and the prediction for the very same schedules
(RunResult.predicted). Beside each: the CPU's idle share during the run (when it is small,
the figure is the machine's, not the network's) and the agents' peak memory beyond their
gradient buffers. Prints a table, then one JSON line per case; exits 1 if any
measured/predicted ratio is over 1.10 (or memory over 80 MB).

The HiPS comparison on bcube,4,1: measured HiPS : PS : ring in units of w/B (w gradient
bytes, B link rate) beside the paper's 0.938 : 1.5 : 1.875, where the paper's PS is mesh
with relaying (REFERENCE.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agent_dataplane import cpu_counters  # noqa: E402
from orchestrator.collectives import registry  # noqa: E402
from orchestrator.collectives.context import Context  # noqa: E402
from orchestrator.cost import Network  # noqa: E402
from orchestrator.cost.compiled import smallest_transfer_bytes  # noqa: E402
from orchestrator.collectives.partition import partitions  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.control import driver, workloads  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

GOAL = 1.10
MEMORY_GOAL_MIB = 80e6 / 2**20  # 80 MB


@dataclass(frozen=True)
class Case:
    label: str
    algorithm: str
    options: dict = field(default_factory=dict)
    servers: int = 0  # parameter servers (separate), taken from the end of `ps_nodes`
    ps_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabCases:
    lab: str
    rate: str
    cases: tuple[Case, ...]


STAR_ALGORITHMS = ("ring", "mesh", "halving-doubling", "tree", "double-tree", "hierarchical", "flextree")
LABS = (
    LabCases("bcube,4,1", "100Mbit", (
        Case("ring", "ring"), Case("mesh", "mesh"),
        Case("ps colocated 16 shards", "ps", {"colocated": True, "shards": 16}),
        # one server per level-0 and per level-1 switch
        Case("ps 4 servers, 12 workers", "ps", {"shards": 4}, 4, ("h00", "h11", "h22", "h33")),
        Case("hips", "hips"), Case("bml", "bml"), Case("hierarchical", "hierarchical"),
        Case("halving-doubling", "halving-doubling"),
    )),
    # the issue names no rate for these: at 100 Mbit a 2-core machine is the bound (torus
    # HiPS, 64 NICs busy: CPU idle 10 %; Fat-Tree's routers forward every packet 3-5 times:
    # a ring left 10 % idle), so they run at 50 Mbit
    LabCases("torus,4,2", "50Mbit", (Case("hips", "hips"), Case("ring", "ring"))),
    LabCases("bigraph,4,4", "50Mbit", (Case("hdrm", "hdrm"), Case("ring", "ring"))),
    LabCases("fattree,4", "50Mbit", (
        Case("ring", "ring"), Case("halving-doubling", "halving-doubling"),
        Case("double-tree", "double-tree"), Case("mesh", "mesh"),
    )),
    LabCases("star,8", "200Mbit", tuple(Case(a, a) for a in STAR_ALGORITHMS) + (
        Case("ps colocated 8 shards", "ps", {"colocated": True, "shards": 8}),
        Case("ps 4 servers, 4 workers", "ps", {"shards": 4}, 4, ("h4", "h5", "h6", "h7")),
    )),
)


def ranked(endpoints: list, case: Case) -> list:
    """The endpoints of a case: workers first (ranks 0..), then its parameter servers."""
    servers = set(case.ps_nodes)
    workers = [e for e in endpoints if e.node not in servers]
    ps = [e for e in endpoints if e.node in servers]
    return [dataclasses.replace(e, rank=i, role="worker") for i, e in enumerate(workers)] + \
        [dataclasses.replace(e, rank=len(workers) + i, role="ps") for i, e in enumerate(ps)]


def measure(lab, endpoints: list, network: Network, case: Case, elements: int, iterations: int, warmup: int,
            pace: bool) -> dict:
    eps = ranked(endpoints, case)
    workers = [e for e in eps if e.role == "worker"]
    ctx = Context(len(workers), lab.topology, tuple(e.node for e in eps), case.options)
    lab.fit_super_packets(smallest_transfer_bytes(registry.schedules(case.algorithm, ctx, elements,
                                                                      partitions([elements], None))))  # as `run` does
    before = cpu_counters()
    result = driver.run(eps, case.algorithm, [elements], workloads.back_to_back([elements]),
                        iterations=warmup + iterations, ctx=ctx, network=network, pace=pace,
                        flow_paths=lab_agents.flow_paths(lab))
    after = cpu_counters()
    measured = statistics.fmean(result.back_to_back_times(warmup))
    # per timed iteration, its slowest rank: a stall shows here, not in the mean
    per_iteration = [max(r.records[i].gst_seconds for r in result.results)
                     for i in range(warmup, min(len(r.records) for r in result.results))]
    predicted = result.predicted.seconds
    unit = elements * 4 / (network.bandwidth / 8)  # w/B
    return {
        "lab": lab.spec.name, "algorithm": case.label, "workers": len(workers), "servers": len(eps) - len(workers),
        "measured_s": round(measured, 4), "predicted_s": round(predicted, 4), "ratio": round(measured / predicted, 3),
        "measured_w_over_b": round(measured / unit, 3), "predicted_w_over_b": round(predicted / unit, 3),
        "cpu_idle": round((after[1] - before[1]) / max(1e-9, after[0] - before[0]), 4),
        "rss_beyond_buffer_mib": round(max(r.peak_rss_mib - r.buffer_mib for r in result.results), 1),
        "iterations_s": [round(t, 3) for t in per_iteration],
        "paced": pace,
    }


def run_lab(group: LabCases, mbytes: float, iterations: int, warmup: int, pace: bool, progress) -> list[dict]:
    name = "fid-" + group.lab.split(",")[0]
    spec = lab_from_argument(group.lab, name=name, **{"servers.runtime": "netns", "links.bandwidth": group.rate})
    network = Network.from_links(spec.links)
    elements = int(mbytes * 1e6) // 4
    rows = []
    with Lab.up(spec) as lab:
        endpoints = lab_agents.start(lab)
        try:
            for case in group.cases:
                started = time.monotonic()
                # fresh agents (their supervisor starts them again): peak memory per case
                driver.shutdown(endpoints)
                time.sleep(0.5)
                driver.wait_healthy(endpoints, timeout=60)
                row = measure(lab, endpoints, network, case, elements, iterations, warmup, pace)
                row["lab"], row["rate"] = group.lab, group.rate
                rows.append(row)
                progress(row, time.monotonic() - started)
        finally:
            lab_agents.stop(endpoints)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbytes", type=float, default=12.5, help="gradient size, MB (12.5 MB = 1 s at 100 Mbit)")
    parser.add_argument("--iterations", type=int, default=8, help="timed allreduces per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed allreduces first (NCCL-tests: -w)")
    parser.add_argument("--only", default="", help="comma-separated topology kinds to run (default: all)")
    parser.add_argument("--no-pace", action="store_true", help="do not pace connections at their fair share (A/B)")
    args = parser.parse_args()
    kinds = set(filter(None, args.only.split(",")))
    rows: list[dict] = []

    def progress(row: dict, seconds: float) -> None:
        print(f"  {row['lab']:<12} {row['algorithm']:<26} measured {row['measured_s']:7.3f} s  predicted "
              f"{row['predicted_s']:7.3f} s  ratio {row['ratio']:5.3f}  CPU idle {row['cpu_idle']:4.0%}  "
              f"memory +{row['rss_beyond_buffer_mib']:5.1f} MiB  slowest iteration "
              f"{max(row['iterations_s'], default=0):.3f} s  ({seconds:.0f} s)", file=sys.stderr, flush=True)

    for group in LABS:
        if not kinds or group.lab.split(",")[0] in kinds:
            print(f"{group.lab} at {group.rate}:", file=sys.stderr, flush=True)
            rows += run_lab(group, args.mbytes, args.iterations, args.warmup, not args.no_pace, progress)

    print(f"\n{'lab':<12} {'rate':<8} {'algorithm':<26} {'measured':>9} {'predicted':>9} {'ratio':>6} "
          f"{'w/B':>6} {'CPU idle':>8} {'memory':>8}")
    for r in rows:
        flag = "  over" if r["ratio"] > GOAL else ""
        print(f"{r['lab']:<12} {r['rate']:<8} {r['algorithm']:<26} {r['measured_s']:8.3f}s {r['predicted_s']:8.3f}s "
              f"{r['ratio']:6.3f} {r['measured_w_over_b']:6.3f} {r['cpu_idle']:8.0%} {r['rss_beyond_buffer_mib']:6.1f}Mi{flag}")
    bcube = {r["algorithm"]: r["measured_w_over_b"] for r in rows if r["lab"] == "bcube,4,1"}
    if {"hips", "mesh", "ring"} <= bcube.keys():
        print(f"\nHiPS : PS (mesh, relayed) : ring on bcube,4,1, in w/B: measured {bcube['hips']:.3f} : "
              f"{bcube['mesh']:.3f} : {bcube['ring']:.3f}; the paper 0.938 : 1.5 : 1.875")
    for r in rows:
        print(json.dumps(r))
    over = [r for r in rows if r["ratio"] > GOAL]
    heavy = [r for r in rows if r["rss_beyond_buffer_mib"] > MEMORY_GOAL_MIB]
    if over or heavy:
        print(f"{len(over)} case(s) over {GOAL} × predicted, {len(heavy)} over 80 MB beyond the gradient",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
