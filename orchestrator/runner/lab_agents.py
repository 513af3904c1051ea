"""Agents inside a live lab, for scripts and tests: a thin call into orchestrator.deploy.

    endpoints = lab_agents.start(lab)           # Ansible through nsenter, supervised, healthy

What the orchestrator knows of the agents (ports, addresses, window, tokens) lives in
orchestrator/deploy/agents.py and is re-exported here.
"""

from __future__ import annotations

import time
from typing import Callable

from orchestrator.agent import transports
from orchestrator.deploy.agents import (
    CONTROL_PORT,
    DATA_PORT,
    METRICS_PORT,
    MIN_WINDOW,
    agent_token,
    endpoints,
    flow_window,
    lab_secret,
    nic_addresses,
)
from orchestrator.runner.driver import Endpoint, shutdown

__all__ = ["CONTROL_PORT", "DATA_PORT", "METRICS_PORT", "MIN_WINDOW", "agent_token", "endpoints", "flow_paths",
           "flow_window", "lab_secret", "nic_addresses", "start", "stop"]

def start(lab, servers: list[str] | None = None, roles: dict[str, str] | None = None, via: str = "nsenter") -> list[Endpoint]:
    """Deploy an agent on each server (default: all) and wait until all answer; their
    endpoints. `via`: nsenter (Ansible, default), ssh, or exec (no Ansible, unsupervised)."""
    from orchestrator.deploy import deploy

    return deploy(lab, servers, roles, via=via).endpoints


def flow_paths(lab, transport: str = transports.DEFAULT) -> Callable[[], dict]:
    """What driver.run's `flow_paths` reads: the paths the agents' data connections over
    `transport` took."""
    port = transports.data_port(transport, DATA_PORT)
    return lambda: lab.connection_paths(port)


def stop(eps: list[Endpoint]) -> None:
    """Stop a run's agents through Control (a supervised agent is started again: use
    orchestrator.deploy.undeploy to remove agents)."""
    shutdown(eps)
    time.sleep(0.2)
