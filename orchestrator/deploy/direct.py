"""The deployer Ansible replaced, kept as the baseline bench/deploy.py measures it against:
`docker exec -d` of the image's testbed-agent in a Docker server, a forked host process in a
netns server's namespace (journalled as a `process`, so `testbed clean` kills it). Nothing
supervises these agents: one that dies stays dead.
"""

from __future__ import annotations

import sys

from orchestrator.agent.auth import TOKEN_ENV
from orchestrator.deploy.agents import DATA_PORT, METRICS_PORT, endpoints, flow_window
from orchestrator.emulation.journal import Entry
from orchestrator.control.endpoints import shutdown


class DirectDeployer:
    name = "exec"

    def start(self, lab, servers: list[str], progress, extravars: dict | None = None, forks: int = 0) -> None:
        window = flow_window(lab.spec, lab.topology)
        entries = []
        for done, endpoint in enumerate(endpoints(lab, servers), 1):
            node = lab.topology.node(endpoint.node)
            data = ",".join(f"{nic.address.ip}:{DATA_PORT}" for nic in node.data_nics())
            mgmt = endpoint.control.rsplit(":", 1)[0]
            args = ["--node", endpoint.node, "--control", endpoint.control, "--data", data,
                    "--metrics", f"{mgmt}:{METRICS_PORT}", "--window", str(window)]
            token = {TOKEN_ENV: endpoint.token}  # in the environment, off the command line (agent/auth.py)
            runtime = lab.runtime_of(endpoint.node)
            # a container has the image's agent; a netns server the host's files, this venv's
            agent = ["testbed-agent"] if runtime.containerised else [sys.executable, "-m", "orchestrator.agent.server"]
            started = runtime.spawn(lab, endpoint.node, [*agent, *args], token)
            if started is not None:  # a host process: journalled, so `testbed clean` kills it
                entries.append(Entry("process", f"agent-{endpoint.node}", started))
            progress(f"{endpoint.node}: started", done, len(servers))
        lab.state.record(entries)

    def stop(self, lab, servers: list[str], progress) -> None:
        shutdown(endpoints(lab, servers))
