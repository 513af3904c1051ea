"""Torus: the k-ary d-cube, server-centric as in HiPS — servers wired to servers, no switches.

Node (x_0 … x_(d-1)) links to x_i ± 1 mod k in every dimension i, so it has 2d NICs (d when
k = 2, where both neighbours coincide): d·N links (d·N/2 for k = 2), diameter d·⌊k/2⌋.
NIC `eth{2i}` faces +1 in dimension i, `eth{2i+1}` faces −1 (for k = 2, `eth{i}` faces both). Routing is dimension order:
correct x_0 first, then x_1, …, each the short way round (ties go +1), so a path is as long
as the wrap-around Manhattan distance.

Names: `t` + the coordinates, each zero-padded to the width of k-1 (`t13` is (1, 3)). The link leaving node i in the + direction
of dimension i is the /30 10.dim.i.0 in a 10.0.0.0/8 pool: .1 on node i, .2 on its neighbour.
"""

from __future__ import annotations

from itertools import product

from orchestrator.topology.addressing import StructuredPool
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology

Coords = tuple[int, ...]


def node_name(coords: Coords, k: int) -> str:
    """`t` + each coordinate zero-padded to the width of k-1: `t13` is (1, 3) in a 4-ary torus."""
    width = len(str(k - 1))
    return "t" + "".join(f"{c:0{width}d}" for c in coords)


def step(coords: Coords, dim: int, delta: int, k: int) -> Coords:
    moved = list(coords)
    moved[dim] = (moved[dim] + delta) % k
    return tuple(moved)


def direction(src: int, dst: int, k: int) -> int:
    """+1 or −1: the short way round a ring of k from src to dst (ties go +1)."""
    forward = (dst - src) % k
    return 1 if forward <= k - forward else -1


def build(k: int, d: int, data_pool, links_pool=None) -> Topology:
    builder = TopologyBuilder("torus", {"k": k, "d": d})
    builder.check_size(k**d)
    nodes: list[Coords] = list(product(range(k), repeat=d))
    index = {c: i for i, c in enumerate(nodes)}
    pool = StructuredPool(data_pool, [d, len(nodes)], 2, "addressing.data", f"torus k={k} d={d}")
    for coords in nodes:
        builder.server(node_name(coords, k), forwards=len(nodes) > 2, coords=coords)

    def ifname(coords: Coords, dim: int, delta: int) -> str:
        if k == 2:  # one neighbour per dimension, one NIC
            return f"{node_name(coords, k)}-eth{dim}"
        return f"{node_name(coords, k)}-eth{2 * dim + (0 if delta > 0 else 1)}"

    for dim in range(d):
        for coords in nodes:
            if k == 2 and coords[dim] == 1:
                continue  # both neighbours are the same node: one link per pair
            nxt = step(coords, dim, 1, k)
            subnet = pool.subnet(dim, index[coords])
            builder.link(
                node_name(coords, k),
                node_name(nxt, k),
                a_address=StructuredPool.host(subnet, 1),
                b_address=StructuredPool.host(subnet, 2),
                a_ifname=ifname(coords, dim, 1),
                b_ifname=ifname(nxt, dim, -1),
                level=dim,
            )

    def hop(coords: Coords, dim: int, delta: int) -> NextHop:
        neighbour = step(coords, dim, delta, k)
        far = builder.nodes[node_name(neighbour, k)].interfaces[ifname(neighbour, dim, -delta)]
        return NextHop(ifname(coords, dim, delta), far.address.ip)

    by_name = {node_name(c, k): c for c in nodes}

    def first_hop(src_name: str, dst_name: str) -> NextHop:
        """Dimension order: towards the neighbour that corrects the first differing
        coordinate the short way round (a /32 per remote address, HostRouting)."""
        src, dst = by_name[src_name], by_name[dst_name]
        dim = next(i for i in range(d) if src[i] != dst[i])
        return hop(src, dim, direction(src[dim], dst[dim], k))

    rings = {
        dim: [
            [node_name(c[:dim] + (x,) + c[dim + 1 :], k) for x in range(k)]
            for c in nodes
            if c[dim] == 0
        ]
        for dim in range(d)
    }
    facts = {"k": k, "d": d, "rings": rings}  # rings: per dimension, each ring in + order
    return builder.build(facts, lazy_routes=builder.host_routing(by_name, first_hop))


def nic_addresses(topology: Topology, server: str) -> dict:
    """A sender's +1 NIC (eth2d) lands on the neighbour's −1 NIC (eth2d+1) and back; for
    k = 2 one NIC per dimension faces both ways."""
    out = {}
    for iface in topology.node(server).data_nics():
        index = int(iface.name.rsplit("eth", 1)[1])
        out[index if topology.params["k"] == 2 else index ^ 1] = iface.address.ip
    return out
