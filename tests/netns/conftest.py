"""Fixtures for tiers that build real labs: each lab is removed after its test, and the
tier ends with a check that nothing of any lab is left on the host."""

from __future__ import annotations

import pytest

from orchestrator.emulation import Lab, cleanup
from orchestrator.spec import lab_from_argument
from tests.conftest import host_snapshot


@pytest.fixture(scope="session", autouse=True)
def leaves_no_trace():
    before = host_snapshot()
    yield
    after = host_snapshot()
    assert after == before, f"labs left objects on the host: {diff(before, after)}"


def diff(before: dict, after: dict) -> dict:
    return {k: sorted(set(after[k]) ^ set(before[k])) for k in before if after[k] != before[k]}


@pytest.fixture
def make_lab():
    """make_lab("topologies/x.yaml" | "bcube,4,1", **overrides) → a live Lab, removed after."""
    made: list[Lab] = []

    def make(argument: str, **overrides) -> Lab:
        spec = lab_from_argument(argument, **overrides)
        lab = Lab.up(spec)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        cleanup.clean_lab(lab.name)
