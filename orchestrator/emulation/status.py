"""What a live lab looks like right now, read from the kernel and Docker."""

from __future__ import annotations

import json
import shutil
import subprocess

from orchestrator.emulation import docker_engine, kernel, runtimes
from orchestrator.emulation.plan import namespace_name


def lab_status(lab) -> dict:
    plan, topology = lab.plan, lab.topology
    namespaces = set(kernel.list_namespaces(namespace_name(lab.name, "")))
    containers = {}
    if runtimes.server_runtime(plan).containerised:
        containers = {c["name"]: c["state"] for c in docker_engine.lab_containers(lab.name)}
    interfaces: dict[str, dict] = {}
    rates: dict[tuple[str, str], int | None] = {}
    with kernel.Netlink() as nl:
        live = [ns for ns in plan.namespaces.values() if ns in namespaces]
        nl.open(live)
        for node, ns in plan.namespaces.items():
            if ns in namespaces:
                interfaces[node] = kernel.links_in(nl, ns)
        for link in topology.links:
            ns = plan.namespaces[link.a.node]
            if link.a.node in interfaces and link.a.interface in interfaces[link.a.node]:
                rates[(link.a.node, link.a.interface)] = kernel.read_rate(nl, ns, link.a.interface)
    nodes = []
    for node in topology.nodes.values():
        ns, runtime = plan.namespaces[node.name], runtimes.runtime_of(plan, node.name)
        entry = {
            "name": node.name,
            "role": node.role,
            "kind": node.kind,
            "runtime": runtime.name,
            "namespace": ns,
            "alive": ns in namespaces,
        }
        if runtime.containerised:
            entry["container"] = plan.container_name(node.name)
            entry["alive"] = entry["alive"] and containers.get(entry["container"]) == "running"
        if node.is_server:
            entry["mgmt_address"] = str(plan.mgmt[node.name][1].ip)
            entry["addresses"] = [str(a) for a in node.addresses()]
        nodes.append(entry)
    links = []
    for link in topology.links:
        # of a lab split over hosts, this host sees its own ends (the other host reports the rest)
        ends = [interfaces.get(e.node, {}).get(e.interface) for e in (link.a, link.b) if lab.here(e.node)]
        up = all(e is not None and e["up"] and e["carrier"] for e in ends)
        first = interfaces.get(link.a.node, {}).get(link.a.interface)
        rate = rates.get((link.a.node, link.a.interface))
        links.append(
            {
                "a": link.a.node, "a_interface": link.a.interface,
                "b": link.b.node, "b_interface": link.b.interface,
                "state": "up" if up else "down",
                "rate_bps": rate,
                "mtu": first["mtu"] if first else None,
                "tx_bytes": first["tx_bytes"] if first else None,
                "rx_bytes": first["rx_bytes"] if first else None,
            }
        )
    return {
        "name": lab.name,
        "status": lab.status_word,
        "runtime": plan.runtime,
        "topology": topology.kind,
        "params": topology.params,
        "management": {"subnet": str(plan.mgmt_subnet), "bridge": plan.mgmt_bridge,
                       "orchestrator": str(plan.mgmt_gateway.ip)},
        "nodes": nodes,
        "links": links,
        "rxe": rxe_devices(lab),
    }


def rxe_devices(lab) -> list[dict]:
    """soft-RoCE devices of this lab's servers, from `rdma -j link show` in each server's
    namespace: the kernel names a device's netdev only inside that netdev's namespace."""
    if lab.spec.rdma != "softroce" or shutil.which("rdma") is None:
        return []
    prefix = f"rxe_{lab.plan.id}_"
    live = set(kernel.list_namespaces(namespace_name(lab.name, "")))
    devices = []
    for server in lab.topology.servers:
        ns = lab.plan.namespaces[server.name]
        if ns not in live:
            continue
        result = subprocess.run(
            [*kernel.in_netns(ns), "rdma", "-j", "link", "show"],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            continue
        for entry in json.loads(result.stdout or "[]"):
            name = entry.get("ifname", "")
            if name.startswith(prefix) and entry.get("netdev"):
                devices.append(
                    {"device": name, "state": entry.get("state"), "netdev": entry["netdev"], "server": server.name}
                )
    return devices
