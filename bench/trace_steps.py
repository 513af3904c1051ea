#!/usr/bin/env python3
"""One point of bench/model_accuracy.py traced: every step of the allreduce, when it ended in
the run and in the cost model, so that a ratio off the band points at the step that lost (or
gained) the time (issue 29).

    sudo .venv/bin/python bench/trace_steps.py bigraph,4,2 flextree 4MiB [--rate 100Mbit]
                                                [--iterations 8] [--warmup 1] [--json]
                                                [--option shards=2 ...]

The lab is built as model_accuracy builds it (bare namespaces, agents over the default
transport, paced, α as kept for the lab or measured now), the point runs back to back with
every transfer traced (driver.run(trace=True)), and the model simulates the very run it
predicted, as many allreduces in a row (CompiledRun.timeline). Prints the measured and
predicted time per synchronisation, then one row per step (experiment/timeline.py), then how
long the transfers alone on their links and those crossed by another step's took against
their bytes at the line's rate (timeline.paces). Halving-doubling on star,8 at 4 MiB, 1.107 ×
the model: its lone transfers took 0.983 × their line time (median; p90 1.020), its crossed
ones 1.097 (p90 1.399); HDRM on bigraph,4,2, 1.165 ×: 0.990 (p90 1.030) and 1.111 (p90 1.731).
The links keep their rate; the time goes where steps cross, which the model's lockstep has not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.model_accuracy import LABS, run_point, with_alpha  # noqa: E402
from orchestrator import units  # noqa: E402
from orchestrator.collectives import registry  # noqa: E402
from orchestrator.cost import Network  # noqa: E402
from orchestrator.cost.simulate import ModelTooLarge  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.errors import TestbedError  # noqa: E402
from orchestrator.experiment import timeline  # noqa: E402
from orchestrator.experiment.results import sync_times  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402


def trace(shorthand: str, rate: str, algorithm: str, size: int, iterations: int, warmup: int,
          options: dict | None = None) -> dict:
    spec = lab_from_argument(shorthand, name="trace-" + shorthand.split(",")[0],
                             **{"servers.runtime": "netns", "links.bandwidth": rate})
    with Lab.up(spec) as lab:
        endpoints = lab_agents.start(lab)
        try:
            network = with_alpha(lab, endpoints, Network.from_links(spec.links))
            result, _ = run_point(lab, endpoints, network, algorithm, size, iterations, warmup, trace=True,
                                  options=options)
        finally:
            lab_agents.stop(endpoints)
    compiled = result.compiled
    prediction = result.predicted
    skip = warmup
    wire = timeline.run_wire(result.transfers())
    capacities = compiled.routes.capacities(network)
    crossed, paced = timeline.crossings_and_paces(compiled.routes, compiled.schedules, compiled.nodes, wire,
                                                  capacities, skip=skip)
    sim, modelled, model_paced, caveat = None, [], None, ""
    try:
        sim = compiled.timeline(warmup + iterations)
        modelled, model_paced = timeline.crossings_and_paces(
            compiled.routes, compiled.schedules, compiled.nodes, timeline.model_wire(sim, len(compiled.schedules)),
            capacities, skip=skip)
    except ModelTooLarge as exc:
        caveat = f"the model's allreduces in a row are past its budget ({exc}): the run's steps alone"
    if not caveat and prediction.back_to_back is None:
        caveat = (f"predicted: one allreduce alone ({prediction.model} model; the allreduces in a row were past its "
                  "budget), while the steps' model columns are the allreduces in a row")
    rows = timeline.compare(sim, compiled.schedules, result.records(), result.transfers(), skip=skip)
    measured = statistics.fmean(sync_times(result.records())[warmup:])
    return {"lab": shorthand, "rate": rate, "algorithm": algorithm, "size_bytes": size,
            "measured_s": measured, "predicted_s": prediction.per_run, "ratio": measured / prediction.per_run,
            "rendezvous": prediction.rendezvous, "caveat": caveat,
            "steps": [dataclasses.asdict(row) for row in rows],
            "crossings": [dataclasses.asdict(c) for c in crossed],
            "model_crossings": [dataclasses.asdict(c) for c in modelled],
            # on the wire against the line: lone transfers at the line's rate and crossed ones
            # slower put the time on the crossings, not on the links' emulation
            "paces": {name: dataclasses.asdict(p) for name, p in paced.items()},
            "model_paces": None if model_paced is None else {name: dataclasses.asdict(p)
                                                             for name, p in model_paced.items()},
            "table": "\n".join([timeline.table(rows, crossed, modelled), *timeline.pace_lines(paced, model_paced)])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", help="a topology shorthand, e.g. bigraph,4,2")
    parser.add_argument("algorithm")
    parser.add_argument("size", help="gradient size, e.g. 4MiB")
    parser.add_argument("--rate", default="", help="link rate (default: model_accuracy's for the lab)")
    parser.add_argument("--iterations", type=int, default=8, help="timed allreduces")
    parser.add_argument("--warmup", type=int, default=1, help="untimed allreduces first")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the algorithm, as a lab file writes it (ps: colocated=true, shards=2); "
                             "given any, they replace model_accuracy's")
    args = parser.parse_args()
    options = None
    for given in args.option:
        key, equals, value = given.partition("=")
        if not equals or not key.strip():
            parser.error(f"--option: {given!r} is not KEY=VALUE (e.g. shards=2)")
        try:
            options = (options or {}) | {key.strip(): yaml.safe_load(value)}
        except yaml.YAMLError:
            parser.error(f"--option: the value of {given!r} is not what a lab file could hold "
                         "(YAML: a number, true/false, a word, a list)")
    if args.algorithm not in registry.ALGORITHMS:
        parser.error(f"algorithm: {args.algorithm!r} is not one of {', '.join(sorted(registry.ALGORITHMS))}")
    if args.iterations < 1 or args.warmup < 0 or args.iterations + args.warmup < 2:
        parser.error("--iterations must be at least 1 and --warmup at least 0, two allreduces in all "
                     "(a time per synchronisation runs from one's end to the next's)")
    rate = args.rate or dict(LABS).get(args.lab, "100Mbit")
    try:
        size = units.parse_size(args.size)
        if options is not None:  # before any lab goes up
            registry.check_options(args.algorithm, options)
        found = trace(args.lab, rate, args.algorithm, size, args.iterations, args.warmup, options)
    except (TestbedError, ValueError) as exc:  # a lab, size or rate it cannot take: one line
        print(f"trace_steps: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in found.items() if k != "table"}))
        return 0
    print(f"{found['lab']} at {rate}, {found['algorithm']}, {args.size}: measured {found['measured_s'] * 1e3:,.1f} ms "
          f"per synchronisation, predicted {found['predicted_s'] * 1e3:,.1f} ms ({found['ratio']:.3f} ×; "
          f"rendezvous {'taken' if found['rendezvous'] else 'not taken'})")
    if found["caveat"]:
        print(found["caveat"])
    print(found["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
