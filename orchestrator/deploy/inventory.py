"""An Ansible inventory made from a live lab, as containerlab makes one from each of its labs.

    all:
      vars:     the lab's name, its secret's path (for the token lookup), the connection's vars
      hosts:    every server: testbed_node, rank, mgmt_address, data_addresses, nics,
                nic_addresses (NIC index → the address a sender on that NIC reaches), and how
                to reach it (testbed_container | testbed_netns, or ansible_host for SSH)
      children: workers, ps, and the topology's own groups (registered per kind below):
                BCube levels (level0 → one group per level-0 switch, l0s0, l0s1, …),
                Fat-Tree pods (pod0, …), BiGraph halves (upper, lower) and their switches,
                torus rings (dim0 → dim0_ring0, …), leaf-spine leaves, star: none
                (each kind's registered groups: topology/groups.py).

Rendered as YAML, JSON (the YAML inventory plugin reads both) or INI; `ansible-inventory -i
FILE --list` lists every server with its vars. The token is never in it: the playbooks derive
it on the controller from the secret file (playbooks/lookup_plugins/testbed_token.py).
"""

from __future__ import annotations

import json
import re
from typing import Callable

import yaml

from orchestrator.deploy.agents import CONTROL_PORT, DATA_PORT, METRICS_PORT, data_addresses, nic_addresses
from orchestrator.errors import BadUsage
from orchestrator.topology import kinds

def group_name(name: str) -> str:
    """A valid Ansible group name (letters, digits, underscores; not starting with a digit)."""
    name = re.sub(r"\W", "_", name)
    return f"g_{name}" if name[:1].isdigit() else name


def host_vars(lab, server: str, rank: int) -> dict:
    topology = lab.topology
    return {
        "testbed_node": server,
        "rank": rank,
        "mgmt_address": str(lab.mgmt_address(server)),
        "data_addresses": data_addresses(topology, server),
        "nics": [
            {"name": nic.name, "address": str(nic.address), **({"level": nic.level} if nic.level is not None else {})}
            for nic in topology.node(server).data_nics()
        ],
        "nic_addresses": {str(index): address for index, address in nic_addresses(topology, server).items()},
    }


def build(lab, access_vars: Callable[[str], dict], common: dict, roles: dict[str, str] | None = None) -> dict:
    """The inventory of every server of `lab`: `access_vars(server)` says how to reach it,
    `common` goes to all.vars; `roles` maps servers to "ps" (the rest are workers)."""
    from orchestrator.deploy.agents import secret_file

    topology = lab.topology
    roles = roles or {}
    servers = [s.name for s in topology.servers]
    unknown = sorted(set(roles) - set(servers))
    if unknown:
        raise BadUsage(f"lab {lab.name} has no server {unknown[0]!r} (its servers: {servers[0]} … {servers[-1]})")
    hosts = {name: host_vars(lab, name, rank) | access_vars(name) for rank, name in enumerate(servers)}
    children: dict = {
        "workers": {"hosts": {name: None for name in servers if roles.get(name, "worker") == "worker"}},
        "ps": {"hosts": {name: None for name in servers if roles.get(name) == "ps"}},
    }
    for name, members in kinds.groups(topology).items():
        if name.endswith("/"):
            children[group_name(name[:-1])] = {"children": {group_name(child): None for child in members}}
        else:
            children.setdefault(group_name(name), {})["hosts"] = {member: None for member in members}
    for group in children.values():  # an empty group is {} (YAML's null reads as no group)
        for key in ("hosts", "children"):
            if key in group and not group[key]:
                del group[key]
    variables = {
        "testbed_lab": lab.name,
        "testbed_runtime": lab.plan.runtime,
        "testbed_topology": topology.kind,
        "testbed_secret_file": str(secret_file(lab.state.dir)),
        "agent_control_port": CONTROL_PORT,
        "agent_data_port": DATA_PORT,
        "agent_metrics_port": METRICS_PORT,
    } | common
    return {"all": {"vars": variables, "hosts": hosts, "children": children}}


# -- rendering ------------------------------------------------------------------------------
def to_yaml(inventory: dict) -> str:
    return yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False, width=120)


def to_json(inventory: dict) -> str:
    return json.dumps(inventory, indent=1)


def to_ini(inventory: dict) -> str:
    """INI: one line per host with its vars (lists and dicts as Python literals, which INI
    reads back as such), then [all:vars] and the groups."""
    root = inventory["all"]
    lines = [
        f"{name} " + " ".join(f"{key}={_ini_value(value, quoted=True)}" for key, value in variables.items())
        for name, variables in root["hosts"].items()
    ]
    lines += ["", "[all:vars]"] + [f"{key}={_ini_value(value, quoted=False)}" for key, value in root["vars"].items()]
    for name, group in root["children"].items():
        lines += ["", f"[{name}]", *group.get("hosts", {})]
        if group.get("children"):
            lines += ["", f"[{name}:children]", *group["children"]]
    return "\n".join(lines) + "\n"


def _ini_value(value, quoted: bool) -> str:
    """A host line is split like a shell line (quoted: a literal in single quotes); a
    [group:vars] line is taken whole after '='."""
    if isinstance(value, str):
        return json.dumps(value) if quoted and (" " in value or not value) else value
    literal = json.dumps(value, separators=(",", ":"))
    return f"'{literal}'" if quoted and not isinstance(value, (int, float)) else literal


FORMATS: dict[str, Callable[[dict], str]] = {"yaml": to_yaml, "json": to_json, "ini": to_ini}


def render(inventory: dict, fmt: str) -> str:
    try:
        return FORMATS[fmt](inventory)
    except KeyError:
        raise BadUsage(f"--format {fmt}: choose one of {', '.join(FORMATS)}") from None
