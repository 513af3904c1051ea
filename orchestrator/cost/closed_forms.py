"""The closed form that applies to a schedule on a topology: REFERENCE.md §2's formulas, each
registered with its algorithm (collectives/forms.py holds the built-ins'; a plugin gives
its own through `register(..., closed_form=)`), to set beside a prediction."""

from __future__ import annotations

from orchestrator.collectives.forms import Case, Form
from orchestrator.collectives.registry import ALGORITHMS
from orchestrator.collectives.schedule import Schedule
from orchestrator.topology import Topology

__all__ = ["Case", "Form", "closed_form"]


def closed_form(schedule: Schedule, topology: Topology) -> Form | None:
    """The closed form for `schedule` (the whole range's) on `topology`, if one applies."""
    algorithm = ALGORITHMS.get(schedule.algorithm)
    if algorithm is None or algorithm.closed_form is None or len(schedule.workers) < 2:
        return None
    try:
        form = algorithm.closed_form(Case(schedule, topology))
    except Exception as exc:  # a plugin's formula: said in one line, not a traceback
        raise ValueError(f"algorithm {schedule.algorithm} ({algorithm.origin}): its closed form raised "
                         f"{type(exc).__name__}: {exc}") from None
    if form is not None and not isinstance(form, Form):
        raise ValueError(f"algorithm {schedule.algorithm}: its closed form gave {type(form).__name__}, not a Form "
                         "(orchestrator.collectives.Form) or None")
    return form
