"""Switch-centric two-tier fabrics: BiGraph (EFLOPS), leaf-spine, and the star.

BiGraph (Dong et al., HPCA 2020): n switches in an upper and a lower half, every upper
switch wired to every lower one and none within a half; m servers per switch. Counts: m·n
servers, n switches, n²/4 switch links. A path crosses 1 switch (same switch), 2 (across
halves) or 3 (same half: ECMP over every switch of the other half).
Names: upper switches `su{i}`, lower `sl{i}`, servers `su{i}h{j}` / `sl{i}h{j}`.

Leaf-spine: leaves `l{i}` with servers `l{i}h{j}`, each leaf wired to every spine `s{i}`;
leaves spread traffic to other leaves over all spines (ECMP).

Star: servers `h{i}` on one l2 switch `sw` — the control case.

Routed switches hold their servers on an access LAN (gateway .1, servers .2 up).
"""

from __future__ import annotations

from orchestrator.topology.addressing import LinkPool, StructuredPool, lan_host_bits
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology


def _access_lan(
    builder: TopologyBuilder, switch: str, servers: list[str], subnet, **attrs
) -> None:
    """An l3 switch with its servers on one access LAN whose gateway is the switch's bridge."""
    attrs["switch"] = switch
    gateway = StructuredPool.host(subnet, 1)
    builder.bridge(switch, gateway)
    for j, server in enumerate(servers):
        builder.server(server, index=j, **attrs)
        link = builder.link(server, switch, a_address=StructuredPool.host(subnet, j + 2))
        builder.enslave(switch, link.b.interface)


def _uplink_routes(builder: TopologyBuilder, switch: str, servers: list[str], data_pool) -> None:
    """Servers send the whole data pool to their switch's gateway."""
    gateway = builder.nodes[switch].interfaces["br0"].address.ip
    for server in servers:
        builder.route(server, data_pool, [NextHop(builder.hop(server, switch).dev, gateway)])


def build_bigraph(switches: int, servers_per_switch: int, data_pool, links_pool) -> Topology:
    half, m = switches // 2, servers_per_switch
    builder = TopologyBuilder("bigraph", {"switches": switches, "servers_per_switch": m})
    builder.check_size(switches * m)
    preferred, minimal = lan_host_bits(m + 1)
    what = f"bigraph switches={switches} servers_per_switch={m}"
    pool = StructuredPool(data_pool, [2, half], preferred, "addressing.data", what, minimal)
    p2p = LinkPool(links_pool, half * half, "addressing.links")
    halves = {"upper": [f"su{i}" for i in range(half)], "lower": [f"sl{i}" for i in range(half)]}
    hosted: dict[str, list[str]] = {}
    for side, (label, names) in enumerate(halves.items()):
        for i, switch in enumerate(names):
            builder.switch(switch, "l3", half=label, index=i)
            hosted[switch] = [f"{switch}h{j}" for j in range(m)]
            _access_lan(builder, switch, hosted[switch], pool.subnet(side, i), half=label)
    for upper in halves["upper"]:
        for lower in halves["lower"]:
            builder.link(upper, lower, *p2p.allocate())
    for side, (label, names) in enumerate(halves.items()):
        others = halves["lower" if label == "upper" else "upper"]
        for i, switch in enumerate(names):
            _uplink_routes(builder, switch, hosted[switch], data_pool)
            for j, other in enumerate(others):
                builder.route(switch, pool.subnet(1 - side, j), [builder.hop(switch, other)])
            for j, peer in enumerate(names):
                if peer != switch:
                    across = [builder.hop(switch, other) for other in others]
                    builder.route(switch, pool.subnet(side, j), across)
    facts = {
        "switches": switches,
        "servers_per_switch": m,
        "upper": halves["upper"],
        "lower": halves["lower"],
        "groups": [hosted[s] for s in halves["upper"] + halves["lower"]],
    }
    return builder.build(facts)


def build_leafspine(leaves: int, spines: int, servers_per_leaf: int, data_pool, links_pool) -> Topology:
    params = {"leaves": leaves, "spines": spines, "servers_per_leaf": servers_per_leaf}
    builder = TopologyBuilder("leafspine", params)
    builder.check_size(leaves * servers_per_leaf)
    preferred, minimal = lan_host_bits(servers_per_leaf + 1)
    what = f"leafspine leaves={leaves} servers_per_leaf={servers_per_leaf}"
    pool = StructuredPool(data_pool, [leaves], preferred, "addressing.data", what, minimal)
    p2p = LinkPool(links_pool, leaves * spines, "addressing.links")
    spine_names = [f"s{i}" for i in range(spines)]
    groups = []
    for i in range(leaves):
        leaf = f"l{i}"
        builder.switch(leaf, "l3", layer="leaf", index=i)
        groups.append([f"{leaf}h{j}" for j in range(servers_per_leaf)])
        _access_lan(builder, leaf, groups[-1], pool.subnet(i))
    for i, spine in enumerate(spine_names):
        builder.switch(spine, "l3", layer="spine", index=i)
    for i in range(leaves):
        for spine in spine_names:
            builder.link(f"l{i}", spine, *p2p.allocate())
    for i in range(leaves):
        leaf = f"l{i}"
        _uplink_routes(builder, leaf, groups[i], data_pool)
        builder.route(leaf, data_pool, [builder.hop(leaf, spine) for spine in spine_names])
        for spine in spine_names:
            builder.route(spine, pool.subnet(i), [builder.hop(spine, leaf)])
    return builder.build({**params, "groups": groups})


def build_star(servers: int, data_pool, links_pool=None) -> Topology:
    builder = TopologyBuilder("star", {"servers": servers})
    builder.check_size(servers)
    preferred, minimal = lan_host_bits(servers)
    pool = StructuredPool(data_pool, [], preferred, "addressing.data", f"star servers={servers}", minimal)
    subnet = pool.subnet()
    builder.switch("sw", "l2")
    names = [f"h{i}" for i in range(servers)]
    for i, name in enumerate(names):
        builder.server(name, index=i, switch="sw")
        builder.link(name, "sw", a_address=StructuredPool.host(subnet, i + 1))
    return builder.build({"servers": servers, "groups": [names]})
