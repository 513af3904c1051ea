"""Faults on a live lab: link down/up/flap/degrade, switch down, server crash/restart/pause,
partitions; each with its undo, journalled before it acts, recorded for the results.

    injector = Injector(lab)
    done = injector.inject("link-down", "p0a0-c0")
    injector.undo(done.fault.id)        # or injector.heal(): everything

The actions live in one table (`actions.ACTIONS`); targets are parsed and checked against
the lab first (`targets`), so a refused fault changes nothing. A timeline of faults (at
times or iterations, random choices seeded) is planned purely and run by `timeline`.
"""

from orchestrator.faults.actions import ACTIONS, Action, Fault
from orchestrator.faults.injector import Applied, Injector, set_link_status
from orchestrator.faults.timeline import CHOICES, PlannedFault, Record, TimelineRunner, plan

__all__ = ["ACTIONS", "CHOICES", "Action", "Applied", "Fault", "Injector", "PlannedFault", "Record",
           "TimelineRunner", "plan", "set_link_status"]
