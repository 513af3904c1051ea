"""The structure groups of a topology: its servers grouped the way its papers group them
(BCube levels and switches, Fat-Tree pods, torus rings, BiGraph halves). A kind registers
its grouping (topology/kinds.py); inventories make Ansible groups of them.

A group name ending in "/" holds the names of child groups instead of servers.
"""

from __future__ import annotations

from typing import Callable

from orchestrator.topology.model import Endpoint, Topology

Groups = dict[str, list[str]]


def by_attr(attr: str, prefix: str = "") -> Callable[[Topology], Groups]:
    """One group per value of a server attribute (`pod` → pod0, pod1, …)."""
    def groups(topology: Topology) -> Groups:
        out: Groups = {}
        for server in topology.servers:
            if attr in server.attrs:
                out.setdefault(f"{prefix}{server.attrs[attr]}", []).append(server.name)
        return out

    return groups


def bcube(topology: Topology) -> Groups:
    """level<l>/: children, one group per level-l switch, named after it."""
    out: Groups = {}
    for server in topology.servers:
        for nic in server.data_nics():
            switch = topology.peer(Endpoint(server.name, nic.name))
            if switch is not None and nic.level is not None:
                out.setdefault(f"level{nic.level}/", [])
                if switch.node not in out[f"level{nic.level}/"]:
                    out[f"level{nic.level}/"].append(switch.node)
                out.setdefault(switch.node, []).append(server.name)
    return out


def torus(topology: Topology) -> Groups:
    """dim<d>/: children, one group per ring along dimension d."""
    out: Groups = {}
    for dim, rings in topology.facts.get("rings", {}).items():
        out[f"dim{dim}/"] = [f"dim{dim}_ring{i}" for i in range(len(rings))]
        out.update({f"dim{dim}_ring{i}": list(ring) for i, ring in enumerate(rings)})
    return out


def bigraph(topology: Topology) -> Groups:
    return by_attr("half")(topology) | by_attr("switch")(topology)


def none(topology: Topology) -> Groups:
    return {}
