"""One compiled run per point (issue 30, item 5): the plan keeps each point's schedules,
routes and prediction within KEEP_TRANSFERS, the runner hands them to the driver, whose
attempt runs them as they are when it is the attempt they were compiled for, and a
degrade's prediction reuses them. Nothing here compiles twice."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.agent import transports
from orchestrator.agent.plan import chunk_bytes_for
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.control import driver
from orchestrator.cost.compiled import compile_run
from orchestrator.experiment import plan as plan_lib
from orchestrator.experiment.plan import compiled_point, make_plan, predict_with_rates
from orchestrator.spec.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]


def _refuse_compiling(monkeypatch) -> None:
    def compile_again(*args, **kwargs):
        raise AssertionError("compiled a second time")
    monkeypatch.setattr(plan_lib, "compile_run", compile_again)


def test_the_plan_keeps_each_points_compiled_run_and_its_prediction_is_the_points():
    plan = make_plan(load_experiment(ROOT / "experiments" / "smoke.yaml"))
    assert plan.points
    for p in plan.points:
        assert p.compiled is not None and p.compiled.prediction is p.prediction
        assert p.compiled.nodes == tuple(p.layout.nodes) and p.compiled.transfer_count > 0


def test_a_degrade_is_priced_from_the_kept_run_without_compiling_it_again(monkeypatch):
    plan = make_plan(load_experiment(ROOT / "experiments" / "smoke.yaml"))
    ring = next(p for p in plan.points if p.point.algorithm.name == "ring")
    _refuse_compiling(monkeypatch)
    assert compiled_point(plan.spec, ring) is ring.compiled
    slow = predict_with_rates(plan.spec, ring, {("h0", "sw"): 50e6, ("sw", "h0"): 50e6})
    assert slow.per_run == pytest.approx(2 * ring.prediction.per_run, rel=0.05)


def test_past_the_budget_a_plan_keeps_predictions_only_and_the_run_compiles_the_same(monkeypatch):
    monkeypatch.setattr(plan_lib, "KEEP_TRANSFERS", 0)
    plan = make_plan(load_experiment(ROOT / "experiments" / "smoke.yaml"))
    assert all(p.compiled is None for p in plan.points)
    monkeypatch.setattr(plan_lib, "KEEP_TRANSFERS", 10**9)
    again = make_plan(plan.spec)
    for lean, full in zip(plan.points, again.points):
        built = compiled_point(plan.spec, lean)
        assert built.schedules == full.compiled.schedules and built.nodes == full.compiled.nodes
        assert built.prediction.per_run == pytest.approx(full.prediction.per_run)


def _endpoints(n: int, workers: int) -> list[driver.Endpoint]:
    return [driver.Endpoint(i, f"n{i}", f"127.0.0.1:{7000 + i}", f"127.0.0.1:{8000 + i}",
                            role="worker" if i < workers else "ps") for i in range(n)]


def _how(compiled, **changes) -> driver._How:
    how = driver._How("ring", [4096, 4096], None, 0, None, None, True, None, None, None, transports.DEFAULT, False,
                      compiled)
    return dataclasses.replace(how, **changes)


def test_the_driver_runs_the_given_compiled_run_only_on_the_attempt_it_was_compiled_for():
    endpoints = _endpoints(4, 4)
    ctx = Context(4)
    parts = partitions([4096, 4096], None)
    given = compile_run("ring", ctx, 8192, parts, nodes=lambda ranks: driver._rank_nodes(ctx, endpoints, ranks)[0],
                        given={0, 1, 2, 3}, chunk_bytes=chunk_bytes_for(transports.DEFAULT),
                        send_buffer_bytes=transports.get(transports.DEFAULT).send_buffer,
                        rendezvous=transports.get(transports.DEFAULT).rendezvous)
    assert driver._as_planned(_how(given), ctx, endpoints, parts) is given
    # compiled for a transport that sends eagerly, it is not this one's (nor its prediction)
    eager = dataclasses.replace(given, rendezvous=not given.rendezvous)
    assert driver._as_planned(_how(eager), ctx, endpoints, parts) is None
    assert driver._as_planned(_how(None), ctx, endpoints, parts) is None
    # another attempt: a rank without its agent, other servers, other partitions, another
    # algorithm, message size, credit or transport
    assert driver._as_planned(_how(given), ctx, endpoints[:3], parts) is None
    moved = [dataclasses.replace(e, node=f"m{e.rank}") for e in endpoints]
    assert driver._as_planned(_how(given), ctx, moved, parts) is None
    assert driver._as_planned(_how(given), ctx, endpoints, partitions([4096, 4096], 4096)) is None
    assert driver._as_planned(_how(given, algorithm="mesh"), ctx, endpoints, parts) is None
    assert driver._as_planned(_how(given, chunk_bytes=given.chunk_bytes + 1), ctx, endpoints, parts) is None
    assert driver._as_planned(_how(given, credit_bytes=1 << 20), ctx, endpoints, parts) is None
    other = next((t for t in transports.names()
                  if transports.get(t).send_buffer != given.send_buffer_bytes), None)
    if other is not None:
        assert driver._as_planned(_how(given, transport=other), ctx, endpoints, parts) is None
