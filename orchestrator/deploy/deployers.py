"""Ways to put agents on a lab's servers, registered in DEPLOYERS:

    nsenter   Ansible (playbooks/deploy.yml) through playbooks/connection_plugins/testbed_nsenter:
              into each server's container or namespace, no SSH
    ssh       the same playbook over SSH through the management network, as on real machines:
              sshd is first set up on every server (playbooks/sshd.yml, through nsenter) with
              the lab's keys
    exec      no Ansible and no supervision: `docker exec -d` / a forked process (the baseline)

An Ansible deployer is an Access (how Ansible reaches a server: inventory vars, and what must
be ready first) under one AnsibleDeployer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Protocol

from orchestrator.deploy import inventory, playbook, ssh, supervision
from orchestrator.deploy.agents import flow_window
from orchestrator.deploy.direct import DirectDeployer
from orchestrator.deploy.playbook import PlaybookResult, Progress
from orchestrator.emulation.journal import Entry
from orchestrator.errors import DeployError

IMAGE_PYTHON = "/opt/testbed/bin/python"  # the image's venv: grpc for the health wait


def deploy_dir(lab) -> Path:
    return lab.state.dir / "deploy"


class Access(Protocol):
    name: str

    def host_vars(self, lab, server: str) -> dict: ...

    def common_vars(self, lab) -> dict: ...

    def prepare(self, lab, servers: list[str], progress: Progress) -> None: ...


class NsenterAccess:
    """Into the server's namespaces on this host (playbooks/connection_plugins/testbed_nsenter.py)."""

    name = "nsenter"

    def host_vars(self, lab, server: str) -> dict:
        if lab.runtime_of(server).containerised:
            return {"testbed_container": lab.plan.container_name(server)}
        home = supervision.server_dir(lab, server)
        return {"testbed_netns": lab.plan.namespaces[server], "agent_home": str(home / "agent"),
                "agent_service_dir": str(supervision.scan_dir(lab, server))}

    def common_vars(self, lab) -> dict:
        common = {"ansible_connection": "testbed_nsenter"}
        if lab.server_runtime.containerised:
            return common | {"ansible_python_interpreter": "/usr/bin/python3", "agent_python": IMAGE_PYTHON}
        # a netns server has the host's files: this venv's agent and python, temporary files
        # under the lab (not root's home)
        bin_dir = Path(sys.executable).parent
        return common | {"ansible_python_interpreter": sys.executable, "agent_python": sys.executable,
                         "agent_bin": str(bin_dir / "testbed-agent"),
                         "ansible_remote_tmp": str(deploy_dir(lab) / "remote-tmp")}

    def prepare(self, lab, servers: list[str], progress: Progress) -> None:
        netns = [s for s in servers if not lab.runtime_of(s).containerised]
        if netns:
            supervision.ensure(lab, netns)


class SshAccess:
    """Over SSH to each server's management address, with the lab's keys (orchestrator/deploy/ssh.py)."""

    name = "ssh"

    def host_vars(self, lab, server: str) -> dict:
        return {"ansible_host": str(lab.mgmt_address(server))}

    def common_vars(self, lab) -> dict:
        keys = ssh.LabKeys(deploy_dir(lab) / "ssh")
        options = (f"-o UserKnownHostsFile={keys.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes "
                   "-o PasswordAuthentication=no -o ControlMaster=auto -o ControlPersist=15s")
        return {"ansible_connection": "ssh", "ansible_user": "root", "ansible_ssh_private_key_file": str(keys.client),
                "ansible_ssh_args": options, "ansible_python_interpreter": "/usr/bin/python3",
                "agent_python": IMAGE_PYTHON}

    def prepare(self, lab, servers: list[str], progress: Progress) -> None:
        """The lab's keys, then sshd on every server (through nsenter: how a real machine's
        provisioning would put a key on it)."""
        if not lab.server_runtime.containerised:
            raise DeployError(f"lab {lab.name}: deploying over SSH needs Docker servers (a netns server shares the "
                              "host's files, sshd included): deploy it with --via nsenter")
        keys = ssh.ensure(lab, [s.name for s in lab.topology.servers])
        access = NsenterAccess()
        sshd_vars = {"sshd_authorized_key": str(keys.client) + ".pub"}
        _run(lab, "sshd.yml", access, servers, progress,
             host_extra=lambda server: {"sshd_host_key": str(keys.host_key(server))}, extravars=sshd_vars)


def document(lab, access: Access, roles: dict[str, str] | None = None,
             host_extra: Callable[[str], dict] | None = None) -> dict:
    """The lab's inventory as `access` reaches its servers."""
    common = access.common_vars(lab) | {"agent_window": flow_window(lab.spec, lab.topology)}
    return inventory.build(lab, lambda s: access.host_vars(lab, s) | (host_extra(s) if host_extra else {}),
                           common, roles)


def write_inventory(lab, access: Access, host_extra: Callable[[str], dict] | None = None) -> Path:
    path = deploy_dir(lab) / f"inventory-{access.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(inventory.to_yaml(document(lab, access, host_extra=host_extra)))
    return path


def _run(lab, name: str, access: Access, servers: list[str], progress: Progress,
         host_extra: Callable[[str], dict] | None = None, extravars: dict | None = None,
         forks: int = playbook.FORKS) -> PlaybookResult:
    path = write_inventory(lab, access, host_extra=host_extra)
    every = len(servers) == len(lab.topology.servers)
    result = playbook.run(deploy_dir(lab) / "ansible", name, path, len(servers), progress, extravars=extravars,
                          limit=None if every else ",".join(servers), forks=forks)
    if result.failures or result.status != "successful":
        raise result.error()
    return result


class AnsibleDeployer:
    def __init__(self, access: Access) -> None:
        self.access = access
        self.name = access.name

    def start(self, lab, servers: list[str], progress: Progress, extravars: dict | None = None,
              forks: int = playbook.FORKS) -> PlaybookResult:
        lab.state.record([Entry("deployment", self.name, {"servers": len(servers)})])  # agents live in servers
        self.access.prepare(lab, servers, progress)
        return _run(lab, "deploy.yml", self.access, servers, progress, extravars=extravars, forks=forks)

    def stop(self, lab, servers: list[str], progress: Progress) -> PlaybookResult:
        result = _run(lab, "undeploy.yml", NsenterAccess(), servers, progress)  # removal needs no SSH
        supervision.stop(lab, [s for s in servers if not lab.runtime_of(s).containerised])
        return result


DEPLOYERS: dict[str, AnsibleDeployer | DirectDeployer] = {
    "nsenter": AnsibleDeployer(NsenterAccess()),
    "ssh": AnsibleDeployer(SshAccess()),
    "exec": DirectDeployer(),
}
