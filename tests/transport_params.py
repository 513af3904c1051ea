"""Every registered agent transport as a pytest parameter, for the tiers that run agents.

A transport that needs what these tiers' labs lack (rdma: an RDMA device on every data NIC,
which only soft-RoCE labs on a kernel with per-namespace rdma_rxe have) is skipped, saying
where it runs instead."""

from __future__ import annotations

import pytest

from orchestrator.agent import transports

ELSEWHERE = {
    "rdma": "rdma needs soft-RoCE on every data NIC (loopback and these labs have none): the vm tier runs "
            "it on a kernel with per-namespace rdma_rxe (tests/vm/guest/test_softroce.py)",
}


def transport_params() -> list:
    return [pytest.param(name, marks=pytest.mark.skip(reason=ELSEWHERE[name])) if name in ELSEWHERE else name
            for name in transports.names()]
