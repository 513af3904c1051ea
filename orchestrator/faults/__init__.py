"""Faults on a live lab: link down/up/flap/degrade, switch down, server crash/restart/pause,
partitions; each with its undo, journalled before it acts, recorded for the results.

    injector = Injector(lab)
    done = injector.inject("link-down", "p0a0-c0")
    injector.undo(done.fault.id)        # or injector.heal(): everything

The actions live in one table (`actions.ACTIONS`); targets are parsed and checked against
the lab first (`targets`), so a refused fault changes nothing.
"""

from orchestrator.faults.actions import ACTIONS, Action, Fault
from orchestrator.faults.injector import Applied, Injector, set_link_status

__all__ = ["ACTIONS", "Action", "Applied", "Fault", "Injector", "set_link_status"]
