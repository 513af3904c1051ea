"""Inside the VM: the netns tier's lab fixtures and end-of-tier trace check, and `figure()`
to hand a measurement to the host (a JSON line in the job directory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.netns.conftest import leaves_no_trace, make_lab  # noqa: F401 (pytest fixtures)

FIGURES = "figures.jsonl"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    """Named on the host's command line, these tests are skipped, not failed."""
    if os.environ.get("TESTBED_VM_GUEST"):
        return
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason="runs inside the VM that tests/vm/test_vm_tier.py boots"))


@pytest.fixture(scope="session")
def figure():
    """figure(name, value): print a measurement and pass it to the host test."""
    job = os.environ.get("TESTBED_VM_JOB")

    def record(name: str, value) -> None:
        print(f"{name}: {value}")
        if job:
            with open(Path(job) / FIGURES, "a") as out:
                out.write(json.dumps({"name": name, "value": value}) + "\n")

    return record
