"""Agents onto a live lab's servers: Ansible (playbooks/) through ansible-runner.

    from orchestrator.deploy import deploy, undeploy
    deployment = deploy(lab)                    # every server, through nsenter; waits for health
    driver.run(deployment.endpoints, "ring", …)
    undeploy(lab)

`via` picks a deployer of deployers.DEPLOYERS: "nsenter" (default), "ssh" (the same playbook
over SSH, as on real machines), "exec" (no Ansible: the baseline). Deployed agents run under
daemontools' supervise (restarted if they die); a netns lab's supervisors are journalled, a
Docker lab's live in its containers, so `testbed down` and `testbed clean` stop them all. On
a lab split over hosts (hosts/split.py), each host runs the same playbook into its own
servers, a task of its worker, with the lab's secret; its journal keeps what it started.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.deploy.agents import endpoints, record_deployed
from orchestrator.deploy.answering import refuse_unanswering
from orchestrator.deploy.playbook import FORKS, PlaybookResult, Progress
from orchestrator.errors import BadUsage, DeployError, RunError
from orchestrator.control.endpoints import Endpoint, wait_healthy

VIA = ("nsenter", "ssh", "exec")


def _quiet(stage: str, done: int, total: int) -> None:
    pass


@dataclass
class Deployment:
    endpoints: list[Endpoint]
    result: PlaybookResult | None  # None for the exec deployer


def _deployer(via: str):
    from orchestrator.deploy.deployers import DEPLOYERS

    try:
        return DEPLOYERS[via]
    except KeyError:
        raise BadUsage(f"--via {via}: choose one of {', '.join(DEPLOYERS)}") from None


def _servers(lab, servers: list[str] | None) -> list[str]:
    names = servers or [s.name for s in lab.topology.servers]
    for name in names:
        lab.check_node(name)
        if not lab.topology.nodes[name].is_server:
            raise BadUsage(f"{name} is a switch of lab {lab.name}: agents run on servers")
    return names


def deploy(
    lab, servers: list[str] | None = None, roles: dict[str, str] | None = None, via: str = "nsenter",
    progress: Progress = _quiet, extravars: dict | None = None, timeout: float = 60.0, forks: int = FORKS,
    faults_checked: bool = False,
) -> Deployment:
    """Deploy agents on `servers` (default: all) and wait until each answers the standard
    health check and accepts its token; their endpoints in rank order. DeployError names the
    first host and task that failed, or at once a server that cannot answer (paused, crashed,
    its agents stopped: deploy.answering). `extravars` go to the playbook (agent_health_timeout,
    agent_install=wheel with agent_wheel, testbed_strategy …); `forks`: Ansible's.
    `faults_checked`: the lab's faults were checked already (a split lab's host deploying its
    share: the orchestrator holds the fault log); its processes are still looked at."""
    names = _servers(lab, servers)
    deployer = _deployer(via)
    refuse_unanswering(lab, names, faults=not faults_checked)  # a paused server's fresh agent would answer
    on_hosts = getattr(lab, "deploy_on_hosts", None) if hasattr(deployer, "access") else None
    try:
        if on_hosts is not None:  # a lab split over hosts: each host's Ansible into its own servers
            progress("Ansible on each host", 0, len(names))
            on_hosts(names, roles, via, extravars, timeout, forks)
            progress("Ansible on each host", len(names), len(names))
            result = None
        else:
            result = deployer.start(lab, names, progress, extravars, forks)
        eps = endpoints(lab, names, roles)
        record_deployed(lab, {ep.node: ep.role for ep in eps})  # before waiting: a sick agent is a down target
        wait_healthy(eps, timeout=timeout)
    except (DeployError, RunError) as exc:
        refuse_unanswering(lab, names, faults=not faults_checked)  # paused while deploying: say that, not which wait ran out
        if isinstance(exc, RunError):  # the health wait's: an agent not answering, or another lab's
            raise DeployError(f"lab {lab.name}: {exc}") from None
        raise
    return Deployment(eps, result)


def undeploy(lab, servers: list[str] | None = None, via: str = "nsenter", progress: Progress = _quiet) -> PlaybookResult | None:
    """Stop and remove the agents of `servers` (default: all). Idempotent."""
    names = _servers(lab, servers)
    deployer = _deployer(via)
    on_hosts = getattr(lab, "undeploy_on_hosts", None) if hasattr(deployer, "access") else None
    if on_hosts is not None:  # a lab split over hosts: each host's playbook on its own servers
        on_hosts(names, via)
        result = None
    else:
        result = deployer.stop(lab, names, progress)
    record_deployed(lab, {}, removed=names)
    return result


def inventory_text(lab, fmt: str = "yaml", via: str = "nsenter", roles: dict[str, str] | None = None) -> str:
    """The lab's inventory as `testbed inventory` prints it (no token in it)."""
    from orchestrator.deploy import inventory
    from orchestrator.deploy.deployers import document

    deployer = _deployer(via)
    if not hasattr(deployer, "access"):
        raise BadUsage(f"--via {via} deploys without Ansible and has no inventory: use nsenter or ssh")
    return inventory.render(document(lab, deployer.access, roles), fmt)
