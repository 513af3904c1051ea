"""Collectives as schedules: pure functions from ranks, topology facts and a tensor layout
to ordered steps of transfers. The same schedule is executed by the agents, checked
in-process by `schedule.simulate`, and costed by the model.

A user's algorithm is registered the way the built-ins are (README "Your own algorithm"):

    from orchestrator.collectives import Context, Schedule, Transfer, register
    register("my-ring", build, closed_form=..., reform=..., options=..., transfers=...)
"""

from orchestrator.collectives.context import Context
from orchestrator.collectives.forms import Case, Form
from orchestrator.collectives.membership import Membership, keep_ranks, renumber
from orchestrator.collectives.options import AlgorithmOptions, NoOptions
from orchestrator.collectives.registry import ALGORITHMS, get, register
from orchestrator.collectives.schedule import Schedule, Transfer, chunks

__all__ = ["ALGORITHMS", "AlgorithmOptions", "Case", "Context", "Form", "Membership", "NoOptions", "Schedule",
           "Transfer", "chunks", "get", "keep_ranks", "register", "renumber"]
