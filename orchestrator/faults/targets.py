"""What a fault acts on, parsed from the command line's TARGET and checked against the lab
before anything changes: a link `a-b`, a switch, a server, or a set of servers `a,b,c`.
(Node names never hold '-' or ',', so both separators are unambiguous.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orchestrator.errors import FaultError
from orchestrator.topology import Link


@dataclass(frozen=True)
class Target:
    text: str  # normalised, as recorded: "h00-l0s0", "l0s0", "h00,h01"
    nodes: tuple[str, ...]
    links: tuple[Link, ...]  # the links the fault cuts, if it cuts any


def _node(lab, name: str, action: str) -> str:
    if name not in lab.topology.nodes:
        servers = ", ".join(s.name for s in lab.topology.servers[:4])
        switches = ", ".join(s.name for s in lab.topology.switches[:3])
        raise FaultError(f"{action}: lab {lab.name} has no node {name!r} (servers {servers}…; switches "
                         f"{switches}…; `testbed status {lab.name}` lists them)")
    return name


def _kind_word(lab, name: str) -> str:
    return "a server" if lab.topology.nodes[name].is_server else "a switch"


def link(lab, text: str, action: str) -> Target:
    ends = text.split("-")
    if len(ends) != 2 or not all(ends):
        raise FaultError(f"{action} takes a link as NODE-NODE, e.g. h00-l0s0; got {text!r}")
    a, b = (_node(lab, name, action) for name in ends)
    links = lab.links_between(a, b)
    if not links:
        raise FaultError(f"{action}: lab {lab.name} has no link between {a} and {b} "
                         f"(`testbed status {lab.name}` lists its links)")
    return Target(f"{a}-{b}", (a, b), tuple(links))


def switch(lab, text: str, action: str) -> Target:
    name = _node(lab, text, action)
    if lab.topology.nodes[name].is_server:
        raise FaultError(f"{action} acts on a switch; {name} is a server (server-crash, server-pause act on servers)")
    return Target(name, (name,), tuple(lab.topology.links_of(name)))


def server(lab, text: str, action: str) -> Target:
    name = _node(lab, text, action)
    if not lab.topology.nodes[name].is_server:
        raise FaultError(f"{action} acts on a server; {name} is a switch (switch-down takes switches)")
    return Target(name, (name,), tuple(lab.topology.links_of(name)))


def servers(lab, text: str, action: str) -> Target:
    names = [n for n in text.split(",") if n]
    if not names:
        raise FaultError(f"{action} takes servers as NAME,NAME,…, e.g. h00,h01; got {text!r}")
    for name in names:
        if not lab.topology.nodes.get(_node(lab, name, action)).is_server:
            raise FaultError(f"{action} takes servers; {name} is {_kind_word(lab, name)} "
                             "(to cut a switch off, use switch-down)")
    unique = tuple(dict.fromkeys(names))
    if len(unique) == len(lab.topology.servers):
        raise FaultError(f"{action}: {text} is every server of lab {lab.name}: leave at least one on the other side")
    return Target(",".join(unique), unique, ())


KINDS: dict[str, Callable[[object, str, str], Target]] = {
    "link": link,
    "switch": switch,
    "server": server,
    "servers": servers,
}
