"""The vm tier: test_vm_tier.py boots Debian's kernel under qemu and runs guest/ inside it.

guest/ is collected only inside the VM (TESTBED_VM_GUEST is set there): on the host its labs
would be refused for want of sch_netem and rdma_rxe. Figures the tier measures (boot time,
durations, RTT, loss, RDMA bandwidth) are printed in pytest's closing summary.
"""

from __future__ import annotations

import os

import pytest

collect_ignore = [] if os.environ.get("TESTBED_VM_GUEST") else ["guest"]

SUMMARY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def vm_summary(request) -> list[str]:
    """Lines for the closing summary."""
    return request.config.stash.setdefault(SUMMARY, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.section("vm tier")
        for line in lines:
            terminalreporter.write_line(line)
