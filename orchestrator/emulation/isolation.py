"""The management network carries the host's conversations with each server, nothing else.

Servers hold NET_ADMIN in their own namespace, so they can add any route; what they cannot
touch is another namespace. Each filter therefore lives on the side it protects:

- in every server's namespace, table `inet testbed_isolation`: its management address is
  reachable only through `mgmt0` (a route via a peer's fabric address, or an on-link route
  out of a fabric NIC, would otherwise reach it: Linux accepts a packet for any local address
  on any interface), only from the management gateway (the host), and the server never
  forwards to or from `mgmt0`. A server may rewrite its own table; that exposes only itself.
- in the root namespace, one table `inet testbed_<lab id>` per lab: what arrives from the
  lab's management links (`tb<id>-*`, every bridge and veth end of the lab, however many
  bridges) is accepted only as a reply to a connection the host opened (the orchestrator's
  Control calls, Prometheus's scrapes), in input (host services bound to 0.0.0.0) and in
  forward (dockerd turns on ip_forward: other host networks behind the gateway).

The chains run at priority filter - 1, before Docker's iptables-nft chains, and count what
they drop (`nft list table inet testbed_<id>` shows it). Nothing else of the host's
firewall is read or changed. Root tables are journalled (kind `nft_table`) before they are
made; server tables go with their namespaces.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Collection

from orchestrator.emulation import kernel, nft
from orchestrator.emulation.journal import Entry
from orchestrator.emulation.plan import MGMT_IF, LabPlan

SERVER_TABLE = "testbed_isolation"
ROOT_TABLE = re.compile(r"^testbed_[0-9a-f]{6}$")
PRIORITY = "filter - 1"


def root_table(lab_id: str) -> str:
    return f"testbed_{lab_id}"


def server_ruleset(mgmt: ipaddress.IPv4Address, gateway: ipaddress.IPv4Address) -> str:
    # no "delete table" first: a server's namespace is new, and a deletion costs an RCU grace
    # period per namespace (measured: ~13 ms against ~0.35 ms for the whole table)
    return f"""
table inet {SERVER_TABLE} {{
    chain input {{
        type filter hook input priority {PRIORITY}; policy accept;
        iifname "{MGMT_IF}" ip saddr {gateway} accept
        iifname "{MGMT_IF}" counter drop
        iifname != "lo" ip daddr {mgmt} counter drop
    }}
    chain forward {{
        type filter hook forward priority {PRIORITY}; policy accept;
        iifname "{MGMT_IF}" counter drop
        oifname "{MGMT_IF}" counter drop
    }}
}}
"""


def root_ruleset(lab_id: str, across_hosts: bool = False, wires: "WirePeers | None" = None) -> str:
    """`across_hosts` (a host's share of a split lab): the orchestrator calls from another
    machine, so what this host forwards onto the lab's management links leaves with the
    gateway's address, the one source the servers answer. `wires`: the lab's VXLAN wires
    ending here take packets of their VNIs from the lab's hosts only."""
    table, links = root_table(lab_id), f"tb{lab_id}-*"
    nat = f"""
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname "{links}" masquerade
    }}""" if across_hosts else ""
    # the VNI: the 24 bits after the VXLAN header's flags and reserved bytes (UDP's 8 + 4)
    vxlan = (f"\n        udp dport {wires.port} @th,96,24 {{ {', '.join(map(str, wires.vnis))} }} "
             f"ip saddr != {{ {', '.join(map(str, wires.hosts))} }} counter drop") if wires and wires.vnis else ""
    chains = nat + "".join(
        f"""
    chain {hook} {{
        type filter hook {hook} priority {PRIORITY}; policy accept;{vxlan if hook == "input" else ""}
        iifname "{links}" ct state established,related accept
        iifname "{links}" counter drop
    }}"""
        for hook in ("input", "forward")
    )
    return f"table inet {table}\ndelete table inet {table}\ntable inet {table} {{{chains}\n}}\n"


@dataclass(frozen=True)
class WirePeers:
    """A split lab's wires as a host's firewall sees them: their VNIs, the hosts they may
    come from, the UDP port."""

    vnis: tuple[int, ...]
    hosts: tuple[ipaddress.IPv4Address, ...]
    port: int = kernel.VXLAN_PORT


def journal_entry(plan: LabPlan) -> Entry:
    return Entry("nft_table", root_table(plan.id), {"family": "inet"})


def apply(plan: LabPlan, servers: Collection[str] | None = None, wires: WirePeers | None = None) -> None:
    """The lab's root table (replacing a stale one of its name), then every server's table
    (of `servers` only: a host's share of a split lab, reached from the orchestrator's machine,
    whose `wires` end here)."""
    nft.run(root_ruleset(plan.id, across_hosts=servers is not None, wires=wires))
    gateway = plan.mgmt_gateway.ip
    rulesets = {plan.namespaces[server]: server_ruleset(address.ip, gateway) for server, (_, address) in plan.mgmt.items()
                if servers is None or server in servers}
    kernel.in_namespaces(rulesets, lambda ns: nft.run(rulesets[ns], ns))


def root_tables() -> list[str]:
    """Names of the labs' tables in this thread's namespace (none without libnftables)."""
    if not nft.available():
        return []
    names = []
    for line in nft.run("list tables").splitlines():
        family, _, name = line.removeprefix("table ").partition(" ")
        if family == "inet" and ROOT_TABLE.match(name):
            names.append(name)
    return names


def delete_root_table(name: str) -> bool:
    """Delete one lab's table if it exists (never another name); whether it existed."""
    if not ROOT_TABLE.match(name) or name not in root_tables():
        return False
    nft.run(f"table inet {name}\ndelete table inet {name}\n")  # no error if it went meanwhile
    return True


def delete_root_tables(keep: set[str] = frozenset()) -> int:
    """Delete every lab table except those named in `keep`; how many went."""
    return sum(delete_root_table(name) for name in root_tables() if name not in keep)
