#!/usr/bin/env python3
"""The cost model beside the lab: every algorithm that runs on each lab, at three gradient
sizes, measured and predicted in the same run (issue 29).

    sudo .venv/bin/python bench/model_accuracy.py [--labs star,bcube] [--sizes 4MiB,25MiB]
                                                  [--algorithms ring,tree] [--iterations 3]
                                                  [--rate 50Mbit] [--super-packet-seconds 0.011]

Labs: star,8; bcube,3,1; torus,3,2; fattree,4; bigraph,4,2 (bare namespaces, agents over the
default transport, paced as `testbed run` paces them). Sizes: 64 KiB, 4 MiB, 25 MiB. Each
point runs `--warmup` + `--iterations` allreduces back to back; measured is the time per
synchronisation the experiment runner reports (experiment/results.py sync_times: from the
slowest agent's end of one allreduce to its end of the next), predicted the model's for the
very same schedules run back to back (Prediction.per_run), with α as measured on the lab
(kept in latency.json; measured first if it was not, as `testbed run` does). Where torch is installed, gloo's
own allreduce runs on star,8 beside ours, against the model's ring.

Prints a table, then one JSON line per point; exits 1 if any ratio leaves [0.90, 1.10].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agent_dataplane import cpu_counters, gloo_ring  # noqa: E402
from orchestrator import units  # noqa: E402
from orchestrator.agent import transports  # noqa: E402
from orchestrator.experiment import calibrate  # noqa: E402
from orchestrator.collectives import registry  # noqa: E402
from orchestrator.collectives.context import Context  # noqa: E402
from orchestrator.cost import Network  # noqa: E402
from orchestrator.cost.compiled import smallest_transfer_bytes  # noqa: E402
from orchestrator.collectives.partition import partitions  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.emulation import lab as lab_module  # noqa: E402
from orchestrator.experiment.results import entry_spread, sync_times  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.control import driver, workloads  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

BAND = (0.90, 1.10)
# (lab, rate): rates at which a 2-core machine keeps its CPU idle share (fattree's routers
# forward every packet several times)
LABS = (("star,8", "200Mbit"), ("bcube,3,1", "100Mbit"), ("torus,3,2", "100Mbit"), ("fattree,4", "50Mbit"),
        ("bigraph,4,2", "100Mbit"))
SIZES = ("64KiB", "4MiB", "25MiB")
SMALL = 2**20  # bytes: below, a point runs ten times the iterations
OPTIONS = {"ps": {"colocated": True}}  # every server a worker and a shard's server


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n}B"


def algorithms_for(lab) -> list[str]:
    """The built-in algorithms that can run over every server of `lab` (the others say why not)."""
    runnable = []
    for name in sorted(registry.ALGORITHMS):
        ctx = Context(len(lab.topology.servers), lab.topology, tuple(s.name for s in lab.topology.servers),
                      OPTIONS.get(name, {}))
        try:
            schedule = registry.builder(name)(ctx, 1024)
        except (ValueError, TypeError):
            continue
        if schedule.ranks == len(lab.topology.servers):
            runnable.append(name)
    return runnable


def run_point(lab, endpoints, network: Network, algorithm: str, size: int, iterations: int, warmup: int,
              trace: bool = False, options: dict | None = None):
    """`warmup` + `iterations` allreduces of `size` bytes back to back over the lab's agents,
    super-packets sized as `run` sizes them: (driver.RunResult, its Context). `options`: the
    algorithm's (default: this bench's, OPTIONS)."""
    elements = size // 4
    eps = list(endpoints)
    ctx = Context(len(eps), lab.topology, tuple(e.node for e in eps),
                  OPTIONS.get(algorithm, {}) if options is None else options)
    lab.fit_super_packets(smallest_transfer_bytes(registry.schedules(algorithm, ctx, elements,
                                                                      partitions([elements], None))))  # as `run` does
    result = driver.run(eps, algorithm, [elements], workloads.back_to_back([elements]),
                        iterations=warmup + iterations, ctx=ctx, network=network,
                        flow_paths=lab_agents.flow_paths(lab), trace=trace)
    return result, ctx


def measure(lab, endpoints, network: Network, algorithm: str, size: int, iterations: int, warmup: int) -> dict:
    before = cpu_counters()
    result, ctx = run_point(lab, endpoints, network, algorithm, size, iterations, warmup)
    after = cpu_counters()
    measured = statistics.fmean(sync_times(result.records())[warmup:])
    predicted = result.predicted.per_run
    unit = size / network.payload_rate  # S/B
    return {"algorithm": algorithm, "size_bytes": size, "measured_s": round(measured, 5),
            "predicted_s": round(predicted, 5), "ratio": round(measured / predicted, 3),
            "measured_s_over_b": round(measured / unit, 3), "predicted_s_over_b": round(predicted / unit, 3),
            "alone_s_over_b": round(result.predicted.seconds / unit, 3),
            "cpu_idle": round((after[1] - before[1]) / max(1e-9, after[0] - before[0]), 2),
            # how far apart the workers entered the timed allreduces, and the model's lockstep
            "entry_spread_ms": _ms(entry_spread(result.records(), ctx.workers, warmup)),
            "predicted_entry_spread_ms": _ms(result.predicted.entry_spread),
            "rendezvous": result.predicted.rendezvous}  # the run's sends waited for their receivers


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


def _shown_ms(ms: float | None) -> str:
    return "–" if ms is None else f"{ms:.1f} ms"


def with_alpha(lab, endpoints, network: Network) -> Network:
    """`network` with α as this machine measured it on the lab (as `testbed run` does: kept
    in latency.json, measured now if it was not)."""
    transport = transports.DEFAULT
    kept = calibrate.latency_for(lab.spec, transport)
    if kept is None:
        measured = calibrate.measure_latency(lab, endpoints, transport)
        calibrate.save_latency(lab.spec, transport, measured)
        kept = calibrate.Latency.of(measured)
        print(f"  α measured: {calibrate.describe_latency(measured)}", file=sys.stderr, flush=True)
    else:
        print(f"  α as kept: {kept.alpha * 1e6:,.0f} µs, {kept.peer * 1e6:,.0f} µs per further peer, "
              f"{kept.cores} cores", file=sys.stderr, flush=True)
    return dataclasses.replace(network, latency=kept.alpha, cores=kept.cores, peer_latency=kept.peer)


def run_lab(shorthand: str, rate: str, sizes: list[int], only: set[str], iterations: int, warmup: int,
            gloo: bool) -> list[dict]:
    name = "acc-" + shorthand.split(",")[0]
    spec = lab_from_argument(shorthand, name=name, **{"servers.runtime": "netns", "links.bandwidth": rate})
    rows = []
    with Lab.up(spec) as lab:
        endpoints = lab_agents.start(lab)
        try:
            network = with_alpha(lab, endpoints, Network.from_links(spec.links))
            names = [a for a in algorithms_for(lab) if not only or a in only]
            for size in sizes:
                for algorithm in names:
                    started = time.monotonic()
                    # small gradients: more of them, so that a point is not one scheduler hiccup
                    repeat = iterations if size >= SMALL else iterations * 10
                    row = {"lab": shorthand, "rate": rate, "alpha_s": network.latency,
                           "peer_latency_s": network.peer_latency,
                           **measure(lab, endpoints, network, algorithm, size, repeat, warmup)}
                    rows.append(row)
                    print(f"  {shorthand:<12} {_size(size):>7} {algorithm:<18} measured {row['measured_s']:8.4f} s "
                          f"predicted {row['predicted_s']:8.4f} s  ratio {row['ratio']:5.3f}  CPU idle "
                          f"{row['cpu_idle']:4.0%}  entries apart {_shown_ms(row['entry_spread_ms'])} "
                          f"(model {_shown_ms(row['predicted_entry_spread_ms'])})  ({time.monotonic() - started:.0f} s)",
                          file=sys.stderr, flush=True)
        finally:
            lab_agents.stop(endpoints)
        if gloo and shorthand.startswith("star"):
            servers = len(lab.topology.servers)
            for size in sizes:
                mbytes = size / 2**20
                if mbytes < 1:
                    continue  # gloo_ring takes whole MiB
                found = gloo_ring(lab, servers, int(mbytes), iterations)
                ours = next((r for r in rows if r["algorithm"] == "ring" and r["size_bytes"] == size), None)
                if found is not None and ours is not None:
                    predicted = ours["predicted_s"]
                    rows.append({"lab": shorthand, "rate": rate, "algorithm": "gloo (torch.distributed)",
                                 "size_bytes": size, "measured_s": found["time_s"], "predicted_s": predicted,
                                 "ratio": round(found["time_s"] / predicted, 3), "against": "the model's ring"})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", default="", help="comma-separated topology kinds (default: all five)")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated gradient sizes")
    parser.add_argument("--algorithms", default="", help="comma-separated algorithms (default: all that run)")
    parser.add_argument("--iterations", type=int, default=3, help="timed allreduces per point")
    parser.add_argument("--warmup", type=int, default=1, help="untimed allreduces first")
    parser.add_argument("--no-gloo", action="store_true", help="skip torch.distributed's gloo on star,8")
    parser.add_argument("--rate", default="", help="every lab's link rate instead of its own, e.g. 50Mbit")
    parser.add_argument("--super-packet-seconds", type=float, default=None,
                        help="a super-packet's most line time (A/B; default the lab's, "
                             f"{lab_module.SUPER_PACKET_SECONDS * 1e3:g} ms)")
    args = parser.parse_args()
    if args.super_packet_seconds is not None:
        lab_module.SUPER_PACKET_SECONDS = args.super_packet_seconds
    kinds = set(filter(None, args.labs.split(",")))
    only = set(filter(None, args.algorithms.split(",")))
    sizes = [units.parse_size(s) for s in args.sizes.split(",") if s]
    rows: list[dict] = []
    for shorthand, rate in LABS:
        if not kinds or shorthand.split(",")[0] in kinds:
            rate = args.rate or rate
            print(f"{shorthand} at {rate}:", file=sys.stderr, flush=True)
            rows += run_lab(shorthand, rate, sizes, only, args.iterations, args.warmup, not args.no_gloo)
    print(f"\n{'lab':<12} {'size':>7} {'algorithm':<26} {'measured':>10} {'predicted':>10} {'ratio':>6}")
    for r in rows:
        flag = "" if BAND[0] <= r["ratio"] <= BAND[1] else "  off"
        print(f"{r['lab']:<12} {_size(r['size_bytes']):>7} {r['algorithm']:<26} {r['measured_s']:9.4f}s "
              f"{r['predicted_s']:9.4f}s {r['ratio']:6.3f}{flag}")
    for r in rows:
        print(json.dumps(r))
    off = [r for r in rows if not BAND[0] <= r["ratio"] <= BAND[1]]
    print(f"{len(rows) - len(off)} of {len(rows)} points within [{BAND[0]:.2f}, {BAND[1]:.2f}]", file=sys.stderr)
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
