"""Algorithms by name, and the schedules of a whole (possibly partitioned) gradient."""

from __future__ import annotations

import importlib
from typing import Callable

from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule

# name → module under orchestrator.collectives.algorithms with build(ctx, size, offset, length)
ALGORITHMS = {
    "ring": "ring",
    "mesh": "mesh",
    "ps": "ps",
    "halving-doubling": "halving_doubling",
    "tree": "tree",
    "double-tree": "double_tree",
    "hierarchical": "hierarchical",
    "flextree": "flextree",
    "hips": "hips",
    "bml": "bml",
    "hdrm": "hdrm",
}

Builder = Callable[..., Schedule]


def builder(name: str) -> Builder:
    try:
        module = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}: choose one of {', '.join(sorted(ALGORITHMS))}") from None
    return importlib.import_module(f"orchestrator.collectives.algorithms.{module}").build


def schedules(name: str, ctx: Context, size: int, parts: list[Partition]) -> list[tuple[Partition, Schedule]]:
    """One schedule per partition, in priority order."""
    build = builder(name)
    return [(part, build(ctx, size, part.offset, part.length)) for part in parts]
