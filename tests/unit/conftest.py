"""Shared helpers for the pure unit tests: build topologies from the lab spec's own models."""

from __future__ import annotations

import functools
import ipaddress

import pytest
from pydantic import TypeAdapter

from orchestrator.spec.lab import AddressingSpec, TopologySpec

_SPEC = TypeAdapter(TopologySpec)


@functools.lru_cache(maxsize=None)
def _build(kind: str, params: tuple, data: str | None, links: str | None):
    from orchestrator.topology import build

    spec = _SPEC.validate_python({"kind": kind, **dict(params)})
    addressing = None
    if data is not None or links is not None:
        kwargs = {}
        if data is not None:
            kwargs["data"] = ipaddress.IPv4Network(data)
        if links is not None:
            kwargs["links"] = ipaddress.IPv4Network(links)
        addressing = AddressingSpec(**kwargs)
    return build(spec, addressing)


def make_topology(kind: str, data: str | None = None, links: str | None = None, **params):
    """The topology of `{kind: ..., **params}` (validated like a lab file), cached by size.

    Topologies are only read by the tests (their lazily computed route tables are the only
    state they keep), so sharing one object between examples is safe and keeps the suite fast.
    """
    return _build(kind, tuple(sorted(params.items())), data, links)


@pytest.fixture(scope="session")
def topo():
    """`topo("bcube", n=4, k=1)` -> Topology; optional data=/links= pools as CIDR strings."""
    return make_topology


@pytest.fixture(autouse=True, scope="session")
def _own_state_directory(tmp_path_factory):
    """Pure tests read no state this machine kept (its calibration, the α measured on its
    labs): a prediction here is the same on every machine."""
    import os

    before = os.environ.get("TESTBED_STATE")
    os.environ["TESTBED_STATE"] = str(tmp_path_factory.mktemp("state"))
    yield
    if before is None:
        os.environ.pop("TESTBED_STATE", None)
    else:
        os.environ["TESTBED_STATE"] = before
