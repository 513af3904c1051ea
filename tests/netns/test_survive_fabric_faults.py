"""Fabric faults during a running job on a multi-path Fat-Tree (fattree,4, 16 workers, ring
surviving): a flapping aggregation-core link, a degraded edge-aggregation link and a core
switch down each slow the run and fail nothing — nobody is dropped (at most a retry over
fresh connections, which take the rerouted paths) — and the history checker finds nothing
lost or counted twice."""

from __future__ import annotations

import time

import pytest

from orchestrator.emulation import cleanup
from orchestrator.faults import Injector
from tests.netns import test_survive as survive
from tests.netns.test_survive import Job, agents, clean, make_lab

# the fault starts at iteration 3 and is over within ~8 s (the flap's three periods): 40
# iterations of ~0.5 s hold it mid-run, where test_survive's 90 ran on ~30 s after it
ITERATIONS = 40


@pytest.fixture(autouse=True)
def iterations(monkeypatch):
    """Job and clean() read test_survive.ITERATIONS: this file's runs are shorter."""
    monkeypatch.setattr(survive, "ITERATIONS", ITERATIONS)


@pytest.fixture(scope="module")
def fattree():
    lab = make_lab("fattree,4", "sv-fat")
    try:
        yield lab
    finally:
        Injector(lab).heal()
        cleanup.clean_lab(lab.name)


FAULTS = [
    ("link-flap", "p0a0-c0", {"period": "1s", "count": "3"}),
    ("link-degrade", "p1e0-p1a0", {"rate": "20Mbit"}),
    ("switch-down", "c1", {}),
]


@pytest.mark.parametrize("action,target,options", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_fabric_fault_mid_run_fails_nothing(fattree, action, target, options):
    eps = agents(fattree)
    job = Job(fattree, eps, "ring")
    job.until_iteration(3)
    injector = Injector(fattree)
    fault = injector.inject(action, target, options).fault
    time.sleep(4)
    if fault.id in {f.id for f in injector.active()}:
        injector.undo(fault.id)
    result = job.result()
    workers = tuple(range(len(eps)))
    assert all(e.members == workers for e in result.history), result.history
    assert all(e.reason == "start" or e.reason.startswith("retried") for e in result.history), result.history
    clean(result)
