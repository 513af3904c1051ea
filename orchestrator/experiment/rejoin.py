"""Bringing dead servers back into a surviving run: once no active fault holds a server any
more (its crash undone, its pause thawed, its partition lifted, its links back), its agents
are deployed again in the background and their endpoints handed to driver.run's `rejoin`,
which the run polls while it goes on: the server rejoins at the next iteration boundary
with the current parameters. Polls must not block, so deploying happens in a thread."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

from orchestrator.faults import Injector
from orchestrator.control.endpoints import Endpoint

log = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0  # how often the fault journal is read (a poll comes every ~0.1 s)
RETRY_AFTER_S = 10.0  # a deploy that failed is tried again after this
DEPLOY_TIMEOUT_S = 180.0


def held_nodes(injector: Injector) -> set[str]:
    """Nodes an active fault holds: its target's nodes and the ends of its links."""
    held: set[str] = set()
    for fault in injector.active():
        held.update(fault.target.nodes)
        held.update(end.node for link in fault.target.links for end in (link.a, link.b))
    return held


class Rejoiner:
    """`rejoin` for driver.run: dead servers no fault holds, with fresh agents."""

    def __init__(self, lab, via: str) -> None:
        self.lab, self.via = lab, via
        self.injector = Injector(lab)
        self.lock = threading.Lock()
        self.ready: dict[str, Endpoint] = {}
        self.deploying: set[str] = set()
        self.failed_at: dict[str, float] = {}
        self.looked = 0.0
        self.threads: list[threading.Thread] = []

    def __call__(self, dead: set[str]) -> list[Endpoint]:
        """Endpoints of dead servers whose agents are deployed again, each handed over once: a
        server that dies again after it rejoined needs a new deploy, not the dead agent's
        endpoint (which the run would take back, lose and take back, over and over)."""
        with self.lock:
            for node in [n for n in self.ready if n not in dead]:  # no longer dead: not needed
                del self.ready[node]
            now = time.monotonic()
            if now - self.looked >= LOOK_EVERY_S:
                self.looked = now
                waiting = dead - set(self.ready) - self.deploying
                waiting = {n for n in waiting if now - self.failed_at.get(n, -RETRY_AFTER_S) >= RETRY_AFTER_S}
                if waiting:
                    for node in sorted(waiting - held_nodes(self.injector)):
                        self.deploying.add(node)
                        thread = threading.Thread(target=self._deploy, args=(node,), name=f"rejoin-{node}",
                                                  daemon=True)
                        self.threads.append(thread)
                        thread.start()
            return [self.ready.pop(n) for n in list(self.ready) if n in dead]

    def _deploy(self, node: str) -> None:
        """`testbed deploy` in a process of its own: Ansible forks, and a fork of this process
        while its gRPC threads are busy with the run crashes before it execs (the playbook
        then ends "failed (rc None)", killed by a signal, every time under a 16-agent run)."""
        from orchestrator.deploy.agents import endpoints

        command = [sys.executable, "-m", "orchestrator.cli", "deploy", self.lab.name, "--servers", node,
                   "--via", self.via]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
            failure = None if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())[-300:]
        except subprocess.TimeoutExpired:
            failure = f"no answer in {DEPLOY_TIMEOUT_S:.0f} s"
        if failure is not None:
            log.warning("%s is back but its agents did not deploy: %s (tried again in %.0f s)", node, failure,
                        RETRY_AFTER_S)
            with self.lock:
                self.deploying.discard(node)
                self.failed_at[node] = time.monotonic()
            return
        with self.lock:
            self.deploying.discard(node)
            self.ready.update({e.node: e for e in endpoints(self.lab, [node])})

    def close(self, timeout: float = 60.0) -> None:
        """Wait for deploys still going (they end within deploy's own timeout)."""
        for thread in self.threads:
            thread.join(timeout)
