"""Injecting and undoing faults on a live lab: journalled before they act, so `testbed
clean` (or `testbed fault NAME heal`) can undo them after the injecting process died, and
every phase (planned, applied, undone) is appended to the lab's faults.jsonl timeline.

Faults of concurrent commands are serialised by the lab's fault lock (held while a fault
changes the lab, not while it lasts); each reroute accounts for the links that other
active faults hold down, read from the journal.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from orchestrator.emulation import Lab
from orchestrator.emulation.journal import Entry
from orchestrator.errors import FaultError
from orchestrator.faults import targets
from orchestrator.faults.actions import ACTIONS, Action, Fault, action, parse_params
from orchestrator.topology import Link


@dataclass
class Applied:
    fault: Fault
    seconds: float  # from the command to the lab changed (apply's own time)
    at: float = 0.0  # Unix time the lab changed
    steps: threading.Thread | None = None  # the action's later steps, when not waited for


class Injector:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.state = lab.state

    # -- reading --------------------------------------------------------------------------
    def target(self, act: Action, text: str) -> targets.Target:
        return targets.KINDS[act.target](self.lab, text, act.name)

    def active(self) -> list[Fault]:
        """Active faults, oldest first, rebuilt from the journal (what undo needs is there)."""
        live = {f["id"] for f in self.state.active_faults()}
        found = []
        for entry in self.state.journal():
            if entry.kind == "fault" and entry.name in live and entry.extra.get("action") in ACTIONS:
                act = ACTIONS[entry.extra["action"]]
                found.append(Fault(entry.name, act.name, self.target(act, entry.extra["target"]),
                                   entry.extra.get("params", {}), entry.extra.get("saved", {})))
        return found

    def held(self, besides: str | None = None, active: list[Fault] | None = None) -> set[Link]:
        """Links held down by active faults other than `besides`."""
        return {link for fault in (self.active() if active is None else active)
                if fault.id != besides and ACTIONS[fault.action].holds_links for link in fault.target.links}

    # -- acting ---------------------------------------------------------------------------
    def inject(self, name: str, target_text: str, options: dict[str, str | None] | None = None,
               duration: float | None = None, planned: float | None = None, wait: bool = True,
               then: Callable[[], None] | None = None) -> Applied:
        """Check, journal, apply. A fault that is refused leaves nothing behind. `duration`
        only sets how long an action's later steps go on (a flap's); the caller undoes a
        lasting fault when its time is up. With `wait` False the later steps run in a
        thread, which calls `then` when they are over."""
        act = action(name)
        params = parse_params(act, options or {})
        if duration is not None and act.later is not None:
            params["duration"] = duration
        target = self.target(act, target_text)
        planned = time.time() if planned is None else planned
        with self.state.fault_lock():
            active = self.active()
            for old in active:  # a one-shot that heals: undo what it names on its target
                if old.action in act.heals and old.target.text == target.text:
                    self._undo(old, active)
            if act.heals:
                active = self.active()
            fault = Fault(self._new_id(), act.name, target, params)
            if act.save is not None:
                fault.saved = act.save(self.lab, target)
            self.state.record([Entry("fault", fault.id, {"action": act.name, "target": target.text,
                                                        "params": params, "saved": fault.saved})])
            self.state.record_fault_event(fault.id, "planned", act.name, target.text, params, at=planned)
            started = time.perf_counter()
            try:
                act.apply(self.lab, fault, self.held(fault.id, active))
            except BaseException:
                self._undo(fault, active + [fault])  # best effort: put back what it changed
                raise
            seconds = time.perf_counter() - started
            self.state.record_fault_event(fault.id, "applied", act.name, target.text, params)
            if not act.lasting and act.later is None:
                self.state.record_fault_event(fault.id, "undone", act.name, target.text, params)
        done = Applied(fault, seconds, time.time())
        if act.later is not None and wait:
            self._go_on(act, fault)
        elif act.later is not None:
            def steps() -> None:
                try:
                    self._go_on(act, fault)
                finally:
                    if then is not None:
                        then()

            done.steps = threading.Thread(target=steps, name=f"fault-{fault.id}", daemon=True)
            done.steps.start()
        return done

    def _go_on(self, act: Action, fault: Fault) -> None:
        """The action's later steps, each under the lock; stops when the fault was undone
        meanwhile (a heal). A one-shot is done (undone) after its last step."""
        try:
            for wait, step in act.later(fault.params):
                time.sleep(wait)
                with self.state.fault_lock():
                    active = self.active()
                    if fault.id not in {f.id for f in active}:
                        return
                    step(self.lab, fault, self.held(fault.id, active))
        except BaseException:  # Ctrl-C mid-flap: the links come back, as after the last step
            with self.state.fault_lock():
                active = self.active()
                if fault.id in {f.id for f in active}:
                    self._undo(fault, active)
            raise
        if not act.lasting:
            with self.state.fault_lock():
                if fault.id in {f.id for f in self.active()}:
                    self.state.record_fault_event(fault.id, "undone", act.name, fault.target.text, fault.params)

    def undo(self, fault_id: str) -> Fault:
        with self.state.fault_lock():
            active = self.active()
            for fault in active:
                if fault.id == fault_id:
                    self._undo(fault, active)
                    return fault
        known = ", ".join(f.id for f in active) or "none"
        raise FaultError(f"lab {self.lab.name} has no active fault {fault_id!r} (active: {known}; "
                         f"`testbed fault {self.lab.name} list` shows them)")

    def heal(self) -> list[Fault]:
        """Undo every active fault, newest first."""
        undone: list[Fault] = []
        with self.state.fault_lock():
            active = self.active()
            for fault in reversed(list(active)):
                self._undo(fault, active)
                active = [f for f in active if f.id != fault.id]
                undone.append(fault)
        return undone

    def _undo(self, fault: Fault, active: list[Fault]) -> None:
        act = ACTIONS[fault.action]
        act.undo(self.lab, fault, self.held(fault.id, active))
        self.state.record_fault_event(fault.id, "undone", act.name, fault.target.text, fault.params)

    def _new_id(self) -> str:
        taken = {f["id"] for f in self.state.fault_events()}
        while (fault_id := secrets.token_hex(3)) in taken:
            pass
        return fault_id


def set_link_status(lab: Lab, a: str, b: str, up: bool) -> None:
    """Mininet's `link A B up|down` through the fault path: journalled, rerouted."""
    Injector(lab).inject("link-up" if up else "link-down", f"{a}-{b}")
