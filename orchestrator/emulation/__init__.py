"""Emulation: makes a topology live on this machine (namespaces, containers, veths, tc, routes).

`Lab.up(spec)` builds, `Lab.attach(name)` finds a live lab, `cleanup.clean_all()` removes
every trace. Only `kernel` talks to the kernel and only `docker_engine` to Docker.
"""

from orchestrator.emulation.lab import ExecResult, Lab

__all__ = ["ExecResult", "Lab"]
