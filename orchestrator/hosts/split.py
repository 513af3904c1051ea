"""One lab over several hosts: each host's worker builds its share (emulation's own bring-up,
restricted to the nodes placed there, `emulation.lab.Part`), the links between hosts are
VXLAN wires (wires.py), and every host keeps its own journal, so `clean` on a host works
without the engine.

    lab = split.up(spec, engine, hosts, underlay)     # hosts: topology.partition.Host
    split.down(spec.name, engine, [h.name for h in hosts])

The management network is still each host's own (its servers reach their host only).
"""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

from orchestrator.hosts import wires as wires_lib
from orchestrator.hosts.engine import HostEngine
from orchestrator.spec import LabSpec
from orchestrator.topology import Topology, from_lab
from orchestrator.topology.partition import Host, Placement, check_underlay, place


@dataclass(frozen=True)
class SplitLab:
    spec: LabSpec
    topology: Topology
    placement: Placement
    wires: tuple[wires_lib.Wire, ...]


def up(spec: LabSpec, engine: HostEngine, hosts: list[Host],
       underlay: Mapping[str, ipaddress.IPv4Address]) -> SplitLab:
    """Build `spec` over `hosts` (each with a worker in `engine`), every host's share at once;
    on any failure every host cleans what it built, and the first error is raised."""
    topology = from_lab(spec)
    placement = place(topology, hosts, default_bps=spec.links.bandwidth)
    check_underlay(topology, placement, spec.links.bandwidth, spec.links.mtu)
    wires = tuple(wires_lib.plan(topology, placement))
    document = spec.model_dump(mode="json")
    names = [host.name for host in hosts]
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {name: pool.submit(engine.run_on, name, build_part, document, name, dict(placement.host_of), wires,
                                     dict(underlay)) for name in names}
        errors = [future.exception() for future in futures.values()]
    if any(errors):
        down(spec.name, engine, names)
        raise next(error for error in errors if error)
    return SplitLab(spec, topology, placement, wires)


def down(name: str, engine: HostEngine, hosts: list[str]) -> dict[str, dict]:
    """Every host's share of lab `name` removed (what each cleaned); hosts the engine has
    lost are named in the result and left for `testbed clean` there."""
    out = {}
    for host in hosts:
        if engine.missing([host]):
            out[host] = {"lost": True}
            continue
        out[host] = engine.run_on(host, clean_part, name)
    return out


def build_part(document: dict, host: str, host_of: dict, wires: tuple, underlay: dict) -> dict:
    """On a host (a task of its worker): its share of the lab, journalled here."""
    from orchestrator.emulation.lab import Lab, Part

    spec = LabSpec.model_validate(document)
    lab = Lab.up(spec, part=Part(host, host_of, tuple(wires), underlay))
    return {"host": host, "nodes": sum(1 for node in host_of.values() if node == host), "state": str(lab.state.dir)}


def clean_part(name: str) -> dict:
    from orchestrator.emulation import cleanup

    return cleanup.clean_lab(name)
