"""BCube(n, k), Guo et al., SIGCOMM 2009 — server-centric, in the paper's own notation.

BCube_k has k+1 levels and n^(k+1) servers; a server's address is the digits a_k…a_0 in base
n and it has one NIC per level. The level-l switch <l, a_k…a_(l+1) a_(l-1)…a_0> joins the n
servers that differ only in digit l; server NIC l plugs into its port a_l. (The HiPS and BML
papers write BCube(n, k) for k levels: their BCube(4, 2) is our `bcube n=4 k=1`.)

Switches are dumb crossbars (l2 bridges); servers relay. Routing is digit correction: a
server sends towards the neighbour that fixes the first differing digit in the order
k, k-1, …, 0, so a path crosses exactly Hamming-distance switches. `parallel_paths` gives
the k+1 edge-disjoint paths of BuildPathSet for detours around failures.

Names: server `h` + digits (each zero-padded to the width of n-1), switch `l{level}s` +
the digits of its index. Addresses: NIC l of server a sits in the subnet of its level-l
switch; in a 10.0.0.0/8 pool that is 10.l.<switch index>.<a_l + 1>.
"""

from __future__ import annotations

from itertools import product

from orchestrator.topology.addressing import StructuredPool, lan_host_bits
from orchestrator.topology.builder import TopologyBuilder
from orchestrator.topology.model import NextHop, Topology

Digits = tuple[int, ...]  # most significant first: (a_k, ..., a_0)


def digit(address: Digits, level: int) -> int:
    """a_level of an address written most significant first."""
    return address[len(address) - 1 - level]


def with_digit(address: Digits, level: int, value: int) -> Digits:
    position = len(address) - 1 - level
    return address[:position] + (value,) + address[position + 1 :]


def switch_index(address: Digits, level: int, n: int) -> int:
    """Index of the level-`level` switch of a server: its digits without a_level, in base n."""
    index = 0
    for position, value in enumerate(address):
        if len(address) - 1 - position != level:
            index = index * n + value
    return index


def _label(values: Digits, n: int) -> str:
    width = len(str(n - 1))
    return "".join(f"{value:0{width}d}" for value in values)


def server_name(address: Digits, n: int) -> str:
    return "h" + _label(address, n)


def switch_name(level: int, index: int, n: int, k: int) -> str:
    values = tuple((index // n**p) % n for p in reversed(range(k)))
    return f"l{level}s" + (_label(values, n) if k else "0")


def route_order(k: int) -> list[int]:
    """The digit-correction order used for the static routes: highest level first."""
    return list(range(k, -1, -1))


def dc_path(src: Digits, dst: Digits, order: list[int]) -> list[Digits]:
    """Servers visited correcting digits of `src` towards `dst` in `order`."""
    path, here = [src], src
    for level in order:
        if digit(here, level) != digit(dst, level):
            here = with_digit(here, level, digit(dst, level))
            path.append(here)
    return path


def parallel_paths(src: Digits, dst: Digits, n: int) -> list[list[Digits]]:
    """BuildPathSet: k+1 edge-disjoint server paths from src to dst (Guo et al., Fig. 4).

    Path i starts correcting at digit i and goes down cyclically; where src and dst agree
    on digit i, it first steps to a neighbour differing there (length Hamming + 2).
    """
    k = len(src) - 1
    paths = []
    for i in range(k, -1, -1):
        order = [(i - step) % (k + 1) for step in range(k + 1)]
        if digit(src, i) != digit(dst, i):
            paths.append(dc_path(src, dst, order))
        else:
            detour = with_digit(src, i, (digit(src, i) + 1) % n)
            rest = order[1:] + [i]
            paths.append([src] + dc_path(detour, dst, rest))
    return paths


def build(n: int, k: int, data_pool, links_pool=None) -> Topology:
    levels = k + 1
    builder = TopologyBuilder("bcube", {"n": n, "k": k})
    builder.check_size(n**levels)
    preferred, minimal = lan_host_bits(n)
    pool = StructuredPool(
        data_pool, [levels, n**k], preferred, "addressing.data", f"bcube n={n} k={k}", minimal
    )
    servers: list[Digits] = list(product(range(n), repeat=levels))
    for address in servers:
        builder.server(server_name(address, n), forwards=k > 0, digits=address)
    groups: dict[int, list[list[str]]] = {}
    for level in range(levels):
        members: dict[int, list[Digits]] = {}
        for address in servers:  # servers come in numeric order, so members in port order
            members.setdefault(switch_index(address, level, n), []).append(address)
        groups[level] = []
        for index in range(n**k):
            name = switch_name(level, index, n, k)
            builder.switch(name, "l2", level=level, index=index)
            subnet = pool.subnet(level, index)
            for address in members[index]:
                builder.link(
                    server_name(address, n),
                    name,
                    a_address=StructuredPool.host(subnet, digit(address, level) + 1),
                    a_ifname=f"{server_name(address, n)}-eth{level}",
                    level=level,
                )
            groups[level].append([server_name(a, n) for a in members[index]])

    by_name = {server_name(a, n): a for a in servers}
    order = route_order(k)

    def first_hop(src_name: str, dst_name: str) -> NextHop:
        """Digit correction: to the relay fixing the first digit that differs (in `order`); a
        /32 per destination address not on the server's own LANs (HostRouting)."""
        src, dst = by_name[src_name], by_name[dst_name]
        level = next(lv for lv in order if digit(src, lv) != digit(dst, lv))
        relay = server_name(with_digit(src, level, digit(dst, level)), n)
        return NextHop(f"{src_name}-eth{level}", builder.nodes[relay].interfaces[f"{relay}-eth{level}"].address.ip)

    facts = {
        "n": n,
        "k": k,
        "levels": levels,
        "groups": groups,  # per level: the servers on each switch, in port order
        "route_order": order,
    }
    return builder.build(facts, lazy_routes=builder.host_routing(by_name, first_hop))


def nic_addresses(topology: Topology, server: str) -> dict:
    """A sender's level-l NIC reaches `server` on its own level-l NIC (same switch)."""
    return {i.level: i.address.ip for i in topology.node(server).data_nics() if i.level is not None}
