"""Fat-Tree(k), Al-Fares et al., SIGCOMM 2008 — switch-centric, three layers of routers.

k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores: k^3/4 hosts, 5k^2/4
switches, 3k^3/4 links. Hosts keep the paper's addresses 10.pod.switch.ID (ID 2..k/2+1) with
the edge switch at 10.pod.switch.1, which holds them on an access LAN. Switch-to-switch
links are routed /31s. Routing is ECMP, the common stand-in for the paper's two-level
tables: edge and aggregation routers spread upward traffic over k/2 uplinks (hashed on
L4), cores route each pod's /16 down to the one aggregation switch they reach it by.

Names: core `c{i}`, aggregation `p{pod}a{i}`, edge `p{pod}e{i}`, host `p{pod}e{e}h{j}`.
Aggregation switch i of every pod links to cores i·k/2 … (i+1)·k/2 − 1.
"""

from __future__ import annotations

from orchestrator.topology.addressing import LinkPool, StructuredPool, lan_host_bits
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology


def build(k: int, data_pool, links_pool) -> Topology:
    half = k // 2
    builder = TopologyBuilder("fattree", {"k": k})
    builder.check_size(k**3 // 4)
    preferred, minimal = lan_host_bits(half + 1)
    pool = StructuredPool(
        data_pool, [k, half], preferred, "addressing.data", f"fattree k={k}", minimal
    )
    p2p = LinkPool(links_pool, k**3 // 2, "addressing.links")  # edge-agg + agg-core links
    cores = [f"c{i}" for i in range(half * half)]
    for index, name in enumerate(cores):
        builder.switch(name, "l3", layer="core", index=index)
    groups: list[list[str]] = []
    for pod in range(k):
        aggs = [f"p{pod}a{i}" for i in range(half)]
        edges = [f"p{pod}e{i}" for i in range(half)]
        for i, name in enumerate(aggs):
            builder.switch(name, "l3", layer="aggregation", pod=pod, index=i)
        for e, edge in enumerate(edges):
            subnet = pool.subnet(pod, e)
            builder.switch(edge, "l3", layer="edge", pod=pod, index=e)
            builder.bridge(edge, StructuredPool.host(subnet, 1))
            hosts = [f"{edge}h{j}" for j in range(half)]
            for j, host in enumerate(hosts):
                builder.server(host, pod=pod, edge=e, index=j)
                link = builder.link(host, edge, a_address=StructuredPool.host(subnet, j + 2))
                builder.enslave(edge, link.b.interface)
            groups.append(hosts)
        for edge in edges:
            for agg in aggs:
                builder.link(edge, agg, *p2p.allocate())
        for i, agg in enumerate(aggs):
            for j in range(half):
                builder.link(agg, cores[i * half + j], *p2p.allocate())

    everything = data_pool
    for pod in range(k):
        aggs = [f"p{pod}a{i}" for i in range(half)]
        for e in range(half):
            edge = f"p{pod}e{e}"
            gateway = StructuredPool.host(pool.subnet(pod, e), 1).ip
            for j in range(half):
                host = f"{edge}h{j}"
                builder.route(host, everything, [NextHop(builder.hop(host, edge).dev, gateway)])
            builder.route(edge, everything, [builder.hop(edge, agg) for agg in aggs])
        for i, agg in enumerate(aggs):
            for e in range(half):
                builder.route(agg, pool.subnet(pod, e), [builder.hop(agg, f"p{pod}e{e}")])
            uplinks = cores[i * half : (i + 1) * half]
            builder.route(agg, everything, [builder.hop(agg, core) for core in uplinks])
        for i in range(half):
            for core in cores[i * half : (i + 1) * half]:
                builder.route(core, pool.aggregate(pod), [builder.hop(core, aggs[i])])
    facts = {"k": k, "pods": k, "groups": groups}  # groups: the hosts under each edge switch
    return builder.build(facts)
