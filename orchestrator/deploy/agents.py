"""What the orchestrator knows of a lab's agents: their ports, addresses, HTTP/2 window and
tokens; the same for every way of deploying them (orchestrator/deploy).

Control answers only calls carrying the agent's token: HMAC-SHA256 of the lab's secret
(`token` in the lab's state directory, mode 0600, made on first use; it goes with the lab)
and the server's name. The orchestrator derives every token; an agent holds only its own, so
a server that reads its agent's configuration learns nothing that opens another server's
Control. (playbooks/lookup_plugins/testbed_token.py derives the same for Ansible.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path

from orchestrator.emulation.journal import write_atomically
from orchestrator.control.endpoints import Endpoint
from orchestrator.topology import Topology, kinds
from orchestrator.topology.describe import diameter

CONTROL_PORT, DATA_PORT, METRICS_PORT = 7000, 7001, 9100
# The floor covers ~8 ms of a 1 Gbit path. Measured on star,8 at 1 Gbit, 2 cores shared by 8
# agents: mesh peaks at ~75 MiB beyond its gradient (BDP probing: ~100; 4 MiB: ~86-100), and
# the CPU-bound ring is ~10% slower than with BDP probing or 4 MiB (a descheduled receiver
# stalls its sender sooner). Memory bounded per connection is what holds on any machine.
MIN_WINDOW = 2**20


def flow_window(spec, topology: Topology) -> int:
    """Bytes of HTTP/2 window a data stream needs to fill a link across the lab's longest path:
    twice the bandwidth-delay product, the delay being netem's delay + jitter on every link of
    the diameter, both ways. Queueing delay is left out on purpose (a window sized to a full
    queue only fills the queue)."""
    links, _ = diameter(topology)
    delay = max([spec.links.delay, *topology.delays.values()])  # a link's own delay may be the longest
    rtt = 2 * links * (delay + spec.links.jitter)
    rate = max([spec.links.bandwidth, *topology.rates.values()])
    return min(2**30, max(MIN_WINDOW, int(2 * rate / 8 * rtt)))  # gRPC takes an int32


def nic_addresses(topology: Topology, server: str) -> dict[int, str]:
    """For each NIC index a sender may name: this server's address directly reachable from
    a sender's NIC of that index (its kind's registered NIC facts; the cost model routes by
    the same)."""
    return {index: str(address) for index, address in kinds.nic_addresses(topology, server).items()}


def lab_secret(state_dir: Path) -> bytes:
    """The lab's secret, made on first use: written whole to a private file, then linked into
    place, so concurrent first uses agree and none reads a half-written file."""
    path = state_dir / "token"
    if not path.exists():
        descriptor, name = tempfile.mkstemp(prefix=".token.", dir=state_dir)  # mode 0600
        partial = Path(name)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another process was first: use its secret
        finally:
            partial.unlink()
    return path.read_bytes().strip()


def share_secret(state_dir: Path, secret: bytes) -> None:
    """Make `secret` this state directory's lab secret: a host of a split lab deploys with the
    orchestrator's, so the tokens it writes are those the orchestrator's calls carry. Written
    whole to a private file and renamed into place (a link there is replaced, not followed)."""
    path = state_dir / "token"
    try:
        if not path.is_symlink() and path.is_file() and path.read_bytes().strip() == secret:
            return
    except OSError:
        pass
    descriptor, name = tempfile.mkstemp(prefix=".token.", dir=state_dir)  # mode 0600
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(bytes(secret))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(name, path)
    finally:
        if os.path.exists(name):
            os.unlink(name)


def agent_token(secret: bytes, node: str) -> str:
    return hmac.new(secret, node.encode(), hashlib.sha256).hexdigest()


def endpoints(lab, servers: list[str] | None = None, roles: dict[str, str] | None = None) -> list[Endpoint]:
    """Endpoints of the agents of `servers` (default: all, in rank order), with their tokens."""
    topology = lab.topology
    secret = lab_secret(lab.state.dir)
    names = servers or [s.name for s in topology.servers]
    out = []
    for rank, name in enumerate(names):
        mgmt = str(lab.mgmt_address(name))
        data = f"{topology.address_of(name)}:{DATA_PORT}"
        by_nic = {nic: f"{address}:{DATA_PORT}" for nic, address in nic_addresses(topology, name).items()}
        role = (roles or {}).get(name, "worker")
        out.append(Endpoint(rank, name, f"{mgmt}:{CONTROL_PORT}", data, by_nic, role, agent_token(secret, name)))
    return out


def secret_file(state_dir: Path) -> Path:
    """The lab's secret, made if needed: what the playbooks' token lookup reads."""
    lab_secret(state_dir)
    return state_dir / "token"


def data_addresses(topology: Topology, server: str) -> list[str]:
    """Every fabric address of a server, in NIC order (the agent's Data listens on each)."""
    return [str(nic.address.ip) for nic in topology.node(server).data_nics()]


def _agents_file(lab) -> Path:
    return lab.state.dir / "deploy" / "agents.json"


def deployed(lab) -> dict[str, str]:
    """Servers whose agents were deployed and not removed since, with their roles."""
    try:
        return json.loads(_agents_file(lab).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def record_deployed(lab, roles: dict[str, str], removed: list[str] = ()) -> None:
    """Note servers' agents as deployed (server → role) or removed, replacing the file whole:
    the monitoring reads it at any time (its file_sd targets follow it)."""
    agents = {name: role for name, role in deployed(lab).items() if name not in removed} | roles
    write_atomically(_agents_file(lab), json.dumps(dict(sorted(agents.items()))))
