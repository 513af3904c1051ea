"""The fault actions, registered in one table: name → what it targets, the parameters it
takes, how it acts and how it is undone. Every action changes the lab through `Lab`
methods, so routes, shaping and firewall stay consistent with the lab's own model.

An action that `holds_links` keeps its target's links down while it is active: the
injector counts them when another fault reroutes, and a link comes back up only when no
active fault holds it any more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from orchestrator.emulation import features
from orchestrator.errors import FaultError, MissingFeature
from orchestrator.faults.targets import Target
from orchestrator.topology import Link
from orchestrator.units import parse_duration, parse_interval, parse_percent, parse_rate


@dataclass
class Fault:
    id: str
    action: str
    target: Target
    params: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)  # what undo needs, journalled before acting (pids…)


Held = set[Link]  # links other active faults hold down
Step = Callable[["object", Fault, Held], None]  # (lab, fault, held elsewhere)


@dataclass(frozen=True)
class Action:
    name: str
    target: str  # a key of targets.KINDS
    help: str
    apply: Step
    undo: Step
    params: dict[str, Callable[[str], object]] = field(default_factory=dict)  # name → parser
    holds_links: bool = False
    lasting: bool = True  # False: done when apply returns (a flap, an explicit link-up)
    save: Callable[["object", Target], dict] | None = None  # state undo needs, read before acting
    required: tuple[str, ...] = ()  # parameters it cannot do without
    heals: tuple[str, ...] = ()  # a one-shot that undoes active faults of these actions on its target
    # (wait seconds, step) to run after apply, each under the fault lock but not held in
    # between, so that heal, undo and other faults act meanwhile; `--for` sets how long
    later: Callable[[dict], list[tuple[float, Step]]] | None = None

    @property
    def takes_duration(self) -> bool:
        """Whether `for` means something: how long it lasts, or how long its steps go on."""
        return self.lasting or self.later is not None


# -- links ------------------------------------------------------------------------------------
def _cut(lab, fault: Fault, held: Held) -> None:
    lab.set_links([(link, False) for link in fault.target.links], held)


def _restore(lab, fault: Fault, held: Held) -> None:
    """Bring back the target's links no other active fault holds down."""
    back = [(link, True) for link in fault.target.links if link not in held]
    if back:
        lab.set_links(back, held)


def _flap_steps(params: dict) -> list[tuple[float, Step]]:
    """After the first cut: up after half a period, down after the other half, … `count`
    cycles (or as many as `duration` holds), ending up."""
    period = params.get("period", 1.0)
    count = params.get("count") or max(1, round(params.get("duration", 3 * period) / period))
    steps: list[tuple[float, Step]] = [(period / 2, _restore)]
    for _ in range(count - 1):
        steps += [(period / 2, _cut), (period / 2, _restore)]
    return steps


def _nothing(lab, fault: Fault, held: Held) -> None:
    pass


def _degrade(lab, fault: Fault, held: Held) -> None:
    p = fault.params
    shaped_queue = any(p.get(k) for k in ("delay", "jitter", "loss"))
    for link in fault.target.links:
        lab.set_link_shape(link, p.get("rate"), p.get("delay", 0.0), p.get("jitter", 0.0), p.get("loss", 0.0),
                           queue_too=shaped_queue)


def _undegrade(lab, fault: Fault, held: Held) -> None:
    links = lab.spec.links
    for link in fault.target.links:  # back to the link's own rate and delay (links.overrides) or the lab's
        a, b = link.nodes()
        lab.set_link_shape(link, int(lab.topology.rate_of(a, b, links.bandwidth)), lab.topology.delay_of(a, b, links.delay),
                           links.jitter, links.loss, queue_too=any(fault.params.get(k) for k in ("delay", "jitter", "loss")))


def _check_netem(params: dict) -> None:
    if any(params.get(k) for k in ("delay", "jitter", "loss")) and not features.kernel_features()["netem"]:
        raise MissingFeature("link-degrade --delay/--jitter/--loss needs sch_netem, which this kernel lacks: "
                             "--rate works here (the vm test tier's kernel has netem)")


# -- servers ----------------------------------------------------------------------------------
def _processes(lab, target: Target) -> dict:
    return {"processes": lab.server_processes(target.nodes[0])}


def _pause(lab, fault: Fault, held: Held) -> None:
    lab.signal_server(fault.target.nodes[0], fault.saved.get("processes", []), "stop")


def _resume(lab, fault: Fault, held: Held) -> None:
    lab.signal_server(fault.target.nodes[0], fault.saved.get("processes", []), "cont")


def _slow(lab, fault: Fault, held: Held) -> None:
    lab.throttle_server(fault.target.nodes[0], fault.saved.get("processes", []), fault.params["cpus"], fault.id)


def _unslow(lab, fault: Fault, held: Held) -> None:
    lab.throttle_server(fault.target.nodes[0], fault.saved.get("processes", []), None, fault.id)


def _cpus(value: str) -> float:
    cpus = float(value)
    if not 0.01 <= cpus <= 1024:
        raise ValueError(f"cpus is a share of one core from 0.01 (1 %) up, e.g. 0.25, not {value}")
    return cpus


def _crash(lab, fault: Fault, held: Held) -> None:
    """Kill what runs on the server and cut its links: a dead machine relays nothing."""
    lab.signal_server(fault.target.nodes[0], fault.saved.get("processes", []), "kill")
    _cut(lab, fault, held)


def _revive(lab, fault: Fault, held: Held) -> None:
    """Start a crashed server again (a container restarts on its own network; a namespace
    outlived its processes) and bring back its links no other fault holds down. What ran
    on it does not come back: its agents are deployed again (and rejoin a surviving run)."""
    server = fault.target.nodes[0]
    if lab.revive_server(server):
        _restore(lab, fault, held)
        lab.settle({server} | {end.node for link in fault.target.links for end in (link.a, link.b)})
    else:
        _restore(lab, fault, held)


# -- partitions -------------------------------------------------------------------------------
DIRECTIONS = ("both", "in", "out")


def table_name(fault_id: str) -> str:
    return f"testbed_fault_{fault_id}"


def partition_ruleset(fault_id: str, others: list[str], direction: str) -> str:
    """The set's side of a partition: drop what it receives from (in) or sends to (out) the
    rest's data addresses. Relayed packets (the forward hook) are not the set's own."""
    addresses = ", ".join(others)
    chains = ""
    if direction in ("both", "in"):
        chains += (f"    chain input {{ type filter hook input priority filter - 2; policy accept; "
                   f"ip saddr {{ {addresses} }} counter drop; }}\n")
    if direction in ("both", "out"):
        chains += (f"    chain output {{ type filter hook output priority filter - 2; policy accept; "
                   f"ip daddr {{ {addresses} }} counter drop; }}\n")
    name = table_name(fault_id)
    return f"table inet {name}\ndelete table inet {name}\ntable inet {name} {{\n{chains}}}\n"


def _partition(lab, fault: Fault, held: Held) -> None:
    inside = set(fault.target.nodes)
    others = [str(nic.address.ip) for s in lab.topology.servers if s.name not in inside for nic in s.data_nics()]
    ruleset = partition_ruleset(fault.id, others, fault.params.get("direction", "both"))
    lab.run_nft({node: ruleset for node in fault.target.nodes})


def _unpartition(lab, fault: Fault, held: Held) -> None:
    name = table_name(fault.id)  # declaring first makes the delete safe when it is gone
    lab.run_nft({node: f"table inet {name}\ndelete table inet {name}\n" for node in fault.target.nodes})


def _direction(value: str) -> str:
    if value not in DIRECTIONS:
        raise ValueError(f"direction is one of {', '.join(DIRECTIONS)}, not {value!r}")
    return value


def _count(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("count must be at least 1")
    return number


ACTIONS: dict[str, Action] = {a.name: a for a in [
    Action("link-down", "link", "cut a link (both ends down); routes detour", _cut, _restore, holds_links=True),
    Action("link-up", "link", "bring a link back (undoes link-down and link-flap on it)", _restore, _nothing,
           lasting=False, heals=("link-down", "link-flap")),
    Action("link-flap", "link", "cut and restore a link every --period, --count times (or for --for)", _cut,
           _restore, params={"period": parse_interval, "count": _count}, holds_links=True, lasting=False,
           later=_flap_steps),
    Action("link-degrade", "link", "lower a link's --rate (and --delay/--jitter/--loss where netem exists)",
           _degrade, _undegrade, params={"rate": parse_rate, "delay": parse_duration, "jitter": parse_duration,
                                         "loss": parse_percent}),
    Action("switch-down", "switch", "cut every link of a switch", _cut, _restore, holds_links=True),
    Action("server-crash", "server", "kill what runs on a server (SIGKILL / docker kill) and cut its links",
           _crash, _revive, holds_links=True, save=_processes),
    Action("server-restart", "server", "start a crashed server again (its container too) and bring its links "
           "back; deploy its agents again after", _revive, _nothing, lasting=False, heals=("server-crash",)),
    Action("server-pause", "server", "freeze what runs on a server (SIGSTOP / docker pause)", _pause, _resume,
           save=_processes),
    Action("server-slow", "server", "throttle what runs on a server to --cpus of one core (a cgroup CPU quota / "
           "docker update --cpus): a straggler", _slow, _unslow, params={"cpus": _cpus}, required=("cpus",), save=_processes),
    Action("partition", "servers", "cut a set of servers off from the rest (--direction both|in|out), by nftables "
           "inside their namespaces", _partition, _unpartition, params={"direction": _direction}),
]}


def action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise FaultError(f"no fault action {name!r}: one of {', '.join(ACTIONS)} (or list, heal)") from None


def parse_params(act: Action, given: dict[str, str | None]) -> dict:
    """The action's parameters from their command-line text; FaultError for one it does
    not take or cannot read."""
    params = {}
    for name, text in given.items():
        if text is None:
            continue
        if name not in act.params:
            takes = ", ".join(f"--{p}" for p in act.params) or "no options"
            raise FaultError(f"{act.name} does not take --{name} (it takes {takes})")
        try:
            params[name] = act.params[name](text)
        except ValueError as exc:
            raise FaultError(f"{act.name} --{name}: {exc}") from None
    missing = [name for name in act.required if name not in params]
    if missing:
        raise FaultError(f"{act.name} needs --{missing[0]} ({act.help})")
    if act.name == "link-degrade":
        if not params:
            raise FaultError("link-degrade needs --rate (and/or --delay, --jitter, --loss), e.g. --rate 10Mbit")
        _check_netem(params)
    return params
