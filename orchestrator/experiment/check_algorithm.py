"""`testbed check-algorithm NAME|FILE`: what the project checks of its own algorithms, for a
user's.

1. exact reduction (collectives/verify.py): generated rank counts, sizes and partitionings,
   with and without a topology, in process and without root;
2. the cost model's prediction on a few topologies, beside the plugin's closed form if it
   gives one;
3. a run of real agents on loopback, every worker's result verified by the agents.

A failure names the case, the rank, the byte range and the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator import plugins
from orchestrator.collectives import registry, verify
from orchestrator.collectives.context import Context
from orchestrator.errors import BadUsage, TestbedError

# labs the reduction runs on (every server a worker) and the prediction is shown for
TOPOLOGIES = ("star,4", "star,5", "bcube,3,1", "torus,3,2", "fattree,4", "bigraph,4,2")
PREDICTED = ("star,8", "bcube,3,1", "torus,3,2", "fattree,4")
PREDICT_RATE, PREDICT_BYTES = "100Mbit", 4 << 20
AGENT_TENSORS = [1000, 37, 4099]  # elements: a run's gradient of three tensors
AGENT_ITERATIONS = 2
MAX_LOOPBACK_AGENTS = 16


@dataclass
class Verdict:
    name: str
    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def say(self, line: str, failed: bool = False) -> None:
        self.lines.append(line)
        self.failed |= failed


def names_of(target: str) -> list[str]:
    """The algorithms `target` names: a registered name, or a plugin file's registrations."""
    if target.endswith(".py") or Path(target).is_file():
        names = plugins.load_file(target)
        if not names:
            raise BadUsage(f"check-algorithm: {target} registers no algorithm (a topology kind only?): "
                           "give a plugin that calls orchestrator.collectives.register")
        return names
    plugins.load_entry_points()
    try:
        registry.get(target)
    except ValueError as exc:
        raise BadUsage(f"check-algorithm: {exc}, or give a plugin file (.py)") from None
    return [target]


def check(name: str, options: dict | None = None, agents: bool = True,
          progress: Callable[[str], None] = lambda line: None) -> Verdict:
    """Every check of algorithm `name`, said as lines; `failed` when one fails."""
    from orchestrator import topology as topology_lib
    from orchestrator.spec import lab_from_argument

    verdict = Verdict(name)
    try:
        options = registry.check_options(name, options)
    except ValueError as exc:
        raise BadUsage(f"--option: {exc}") from None
    labs = {label: topology_lib.from_lab(lab_from_argument(label)) for label in TOPOLOGIES}
    progress(f"{name}: exact reduction")
    generic = verify.check(name, verify.generic_cases(), options)
    placed = verify.check(name, verify.topology_cases(labs), options)
    for title, outcome in (("without a topology", generic), ("on " + ", ".join(TOPOLOGIES), placed)):
        declined = f"; {len(outcome.refused)} declined, e.g. {outcome.refused[0]}" if outcome.refused else ""
        if outcome.failures:
            verdict.say(f"FAIL exact reduction {title}: {len(outcome.failures)} of {outcome.checked} cases wrong, "
                        f"first: {outcome.failures[0]}",
                        failed=True)
        else:
            verdict.say(f"ok   exact reduction {title}: {outcome.checked} cases, every worker ends with the exact "
                        f"sum{declined}")
    if not generic.checked and not placed.checked:
        verdict.say("FAIL the algorithm declined every case: it builds no schedule this project could run", True)
    if verdict.failed:
        return verdict
    progress(f"{name}: predictions")
    _predictions(verdict, options)
    if agents:
        progress(f"{name}: real agents on loopback")
        _loopback(verdict, options, generic.checked > 0, labs)
    return verdict


def _predictions(verdict: Verdict, options: dict) -> None:
    from orchestrator.agent import transports
    from orchestrator.cost.report import predict_lab
    from orchestrator.spec import lab_from_argument

    tcp = transports.get("tcp")  # as the agents would run it by default
    for label in PREDICTED:
        lab = lab_from_argument(label, **{"links.bandwidth": PREDICT_RATE})
        try:
            report = predict_lab(lab, verdict.name, PREDICT_BYTES, options=options,
                                 send_buffer_bytes=tcp.send_buffer, rendezvous=tcp.rendezvous)
        except TestbedError as exc:
            verdict.say(f"--   prediction on {label}: declined ({exc})")
            continue
        seconds = report.prediction.per_run
        form = report.form_seconds
        beside = "no closed form given" if form is None else \
            f"closed form {form * 1e3:.1f} ms ({seconds / form:.3f} × it): {report.form.source}"
        verdict.say(f"ok   prediction on {label} at {PREDICT_RATE}, 4 MiB: {seconds * 1e3:.1f} ms; {beside}")


def _loopback(verdict: Verdict, options: dict, generic: bool, labs: dict) -> None:
    """The algorithm over real agent processes on 127.0.0.1: schedules compiled to plans,
    streamed over the default transport, each worker's result checked by the agent."""
    from orchestrator.collectives.partition import partitions
    from orchestrator.control import driver, workloads
    from orchestrator.control.local import local_agents

    contexts = [(Context(n, options=options), "") for n in (4, 3, 5, 2)] if generic else [
        (Context(len(t.servers), t, tuple(s.name for s in t.servers), options), f" standing in for {label}")
        for label, t in labs.items()]
    for ctx, where in contexts:
        try:
            built = registry.schedules(verdict.name, ctx, sum(AGENT_TENSORS), partitions(AGENT_TENSORS, None))
        except ValueError:
            continue
        ranks = built[0][1].ranks if built else ctx.workers
        if ranks > MAX_LOOPBACK_AGENTS:
            continue
        started = time.monotonic()
        try:
            with local_agents(ctx.workers, ranks - ctx.workers) as endpoints:
                result = driver.run(endpoints, verdict.name, AGENT_TENSORS, workloads.emulated(AGENT_TENSORS),
                                    iterations=AGENT_ITERATIONS, ctx=ctx, timeout=120)
        except TestbedError as exc:
            verdict.say(f"FAIL real agents on loopback{where} ({ctx.workers} workers): {exc}", failed=True)
            return
        records = result.records()
        wrong = [r for r in records if not r["verified"] and r["rank"] < ctx.workers]
        if wrong:
            verdict.say(f"FAIL real agents on loopback{where}: rank {wrong[0]['rank']} iteration "
                        f"{wrong[0]['iteration']} ended with a gradient that is not the exact sum", failed=True)
            return
        extra = f" and {ranks - ctx.workers} parameter servers" if ranks > ctx.workers else ""
        verdict.say(f"ok   real agents on loopback{where}: {ctx.workers} workers{extra}, {AGENT_ITERATIONS} "
                    f"iterations of {sum(AGENT_TENSORS) * 4:,} B, every result exact "
                    f"({time.monotonic() - started:.1f} s)")
        return
    verdict.say(f"--   real agents on loopback: no case of at most {MAX_LOOPBACK_AGENTS} agents the algorithm builds")
