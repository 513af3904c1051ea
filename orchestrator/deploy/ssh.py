"""SSH keys of a lab, made once per lab in its state directory (private keys 0600), never a
password: a client key the servers authorise for root, one host key per server, and a
known_hosts file naming each server's management address with its host key, so the
orchestrator's SSH checks every host key strictly (StrictHostKeyChecking=yes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import HostError


@dataclass(frozen=True)
class LabKeys:
    root: Path

    @property
    def client(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def host_key(self, server: str) -> Path:
        return self.root / "hosts" / f"{server}_ed25519"


def _keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{path.name}.partial")
    for stale in (partial, partial.with_name(partial.name + ".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(partial)],
                   check=True, capture_output=True)
    os.chmod(partial, 0o600)
    partial.with_name(partial.name + ".pub").rename(path.with_name(path.name + ".pub"))
    partial.rename(path)  # last: a key that exists is whole, with its public half


def ensure(lab, servers: list[str]) -> LabKeys:
    """The lab's keys (made where missing) and a known_hosts for `servers`."""
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        raise HostError("deploying over SSH needs the OpenSSH client: apt-get install openssh-client (or ./setup.sh)")
    keys = LabKeys(lab.state.dir / "deploy" / "ssh")
    _keygen(keys.client, f"testbed-{lab.name}")
    lines = []
    for server in servers:
        _keygen(keys.host_key(server), f"{server}.{lab.name}")
        public = keys.host_key(server).with_name(keys.host_key(server).name + ".pub").read_text().split()
        lines.append(f"{lab.mgmt_address(server)} {public[0]} {public[1]}")
    keys.known_hosts.write_text("\n".join(lines) + "\n")
    return keys
