"""A topology kind of your own: `routers` l3 switches in a ring, `servers_per_router` servers
on each (a toy of the ring fabrics some papers draw). Load it like Mininet's `--custom`:

    testbed topology ringnet,4,2 --plugin examples/ringnet.py --png ring.png
    testbed up ringnet,4,2 --plugin examples/ringnet.py --runtime netns
    testbed run my-experiment.yaml            # with `plugins: [ringnet.py]` beside it

`orchestrator.spec.register_topology` takes the lab-file model (what `topology:` may say,
checked by pydantic) and a builder; the kind's drawing, NIC facts and inventory groups are
optional. Here the builder describes the network as a `graph` (servers, l2 and l3 switches,
links) and lets that kind address and route it: shortest paths with ECMP between routers.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.spec import register_topology
from orchestrator.topology import graph


class RingNetSpec(BaseModel):
    """`topology: {kind: ringnet, routers: 4, servers_per_router: 2}` in a lab file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["ringnet"]
    routers: int = Field(strict=True, ge=3, le=32, description="l3 switches in the ring")
    servers_per_router: int = Field(strict=True, ge=1, le=16)


def _names(spec):
    routers = [f"r{i}" for i in range(spec.routers)]
    servers = {router: [f"h{i}_{j}" for j in range(spec.servers_per_router)] for i, router in enumerate(routers)}
    return routers, servers


def build(spec, data, links):
    routers, servers = _names(spec)
    wires = [(routers[i], routers[(i + 1) % len(routers)], None) for i in range(len(routers))]
    wires += [(router, server, None) for router in routers for server in servers[router]]
    every_server = [server for router in routers for server in servers[router]]
    topology = graph.build(every_server, [], routers, wires, data, links)
    topology.kind, topology.params = "ringnet", {"routers": spec.routers, "servers_per_router": spec.servers_per_router}
    return topology


def groups(topology):
    """One inventory group per router: its servers."""
    out = {}
    for link in topology.links:
        a, b = sorted(link.nodes(), key=lambda node: topology.nodes[node].is_server)  # router first
        if topology.nodes[b].is_server:
            out.setdefault(a, []).append(b)
    return out


register_topology(RingNetSpec, build, title="Router ring", groups=groups)
