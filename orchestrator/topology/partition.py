"""Which host each node lives on when a lab spans several hosts (issue 31): pure, from the
topology and the hosts alone, shown by `testbed topology LAB --hosts FILE`.

- Kinds that register blocks (topology/blocks.py: a BCube level-0 group, a Fat-Tree pod, a
  torus slab, a switch with its servers) are placed block by block: blocks in their order,
  cut into contiguous runs of about the same number of servers, one run per host (unless a
  host would get more than BALANCE × its share: then as any other graph). Nodes in
  no block (upper BCube levels, cores, spines) then go, one by one, to the host they have
  the most link weight to, ties to the host holding fewest of them: each host its share.
- Any other graph (or more hosts than blocks) is cut by recursive Kernighan–Lin bisection
  (networkx) on link weights, then evened out so that hosts run as many servers as they can
  equally.

Link weights default to each link's rate; callers may pass the model's predicted bytes per
link direction instead, so the cut falls where an algorithm sends least. A link whose ends
are on two hosts is carried by a VXLAN wire over the underlay: `check_underlay` refuses, in
one line, hosts whose NIC or MTU cannot carry what crosses.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Mapping

from orchestrator.errors import TopologyError
from orchestrator.topology.kinds import kind_of
from orchestrator.topology.model import Link, Topology

# a host may run this many times its even share of servers when whole blocks are kept together
# (bcube,4,1's four groups over three hosts would be 4/4/8: cut as a graph instead)
BALANCE = 1.25
VXLAN_OVERHEAD = 50  # bytes a VXLAN wire adds to each packet: outer Ethernet, IPv4, UDP, VXLAN


@dataclass(frozen=True)
class Host:
    name: str
    nic_bps: float | None = None  # the underlay NIC's rate, when known
    mtu: int = 1500  # the underlay's


@dataclass(frozen=True)
class HostShare:
    """What one host carries under a placement."""

    host: str
    servers: int
    switches: int
    crossing: int  # links from its nodes to other hosts'
    out_bps: float  # at most, the lab's rates on those links, with VXLAN's overhead
    in_bps: float


@dataclass(frozen=True)
class Underlay:
    """What the cost model needs of a split lab: where each node is, and the rate of each host's
    NIC where it is known. Every link that crosses hosts also crosses the sender's NIC out and
    the receiver's NIC in, whose payload is the lab's packets less VXLAN's 50 bytes each."""

    host_of: Mapping[str, str]
    nic_bps: Mapping[str, float]  # only hosts whose NIC rate is known
    mtu: int  # the lab's

    @property
    def payload_share(self) -> float:
        return self.mtu / (self.mtu + VXLAN_OVERHEAD)


@dataclass(frozen=True)
class Placement:
    hosts: tuple[Host, ...]
    host_of: Mapping[str, str]  # every node → its host's name
    method: str  # how it was made: "blocks" or "kernighan-lin"

    def underlay(self, mtu: int) -> Underlay:
        return Underlay(self.host_of, {h.name: h.nic_bps for h in self.hosts if h.nic_bps is not None}, mtu)

    def crossing(self, topology: Topology) -> list[Link]:
        """Links whose two ends are on different hosts: each one VXLAN wire."""
        return [link for link in topology.links if self.host_of[link.a.node] != self.host_of[link.b.node]]

    def shares(self, topology: Topology, default_bps: float, mtu: int) -> list[HostShare]:
        overhead = (mtu + VXLAN_OVERHEAD) / mtu
        out = {host.name: [0, 0, 0, 0.0, 0.0] for host in self.hosts}
        for node in topology.nodes.values():
            out[self.host_of[node.name]][0 if node.is_server else 1] += 1
        for link in self.crossing(topology):
            a, b = link.nodes()
            for here, there in ((a, b), (b, a)):
                share = out[self.host_of[here]]
                share[2] += 1
                share[3] += topology.rate_of(here, there, default_bps) * overhead
                share[4] += topology.rate_of(there, here, default_bps) * overhead
        return [HostShare(name, *values) for name, values in out.items()]


def place(topology: Topology, hosts: list[Host], weights: Mapping[tuple[str, str], float] | None = None,
          default_bps: float = 1e9) -> Placement:
    """Every node of `topology` on one of `hosts`; `weights`: per link direction (a, b), e.g.
    predicted bytes (default: the link's rate). TopologyError for more hosts than servers."""
    if not hosts:
        raise TopologyError("no hosts to place the lab on: list at least one")
    servers = len(topology.servers)
    if len(hosts) > servers:
        raise TopologyError(f"{len(hosts)} hosts for {servers} servers: every host runs servers; list at most "
                            f"{servers} hosts")
    weight = _weights(topology, weights, default_bps)
    if len(hosts) == 1:
        return Placement(tuple(hosts), {name: hosts[0].name for name in topology.nodes}, "one host")
    facet = kind_of(topology.kind).blocks
    blocks = facet(topology) if facet is not None else []
    if len(blocks) >= len(hosts):
        host_of = _by_blocks(topology, blocks, hosts, weight)
        most = max(Counter(host_of[s.name] for s in topology.servers).values())
        if most <= BALANCE * -(-servers // len(hosts)):  # whole blocks balance well enough
            return Placement(tuple(hosts), host_of, "blocks")
    return Placement(tuple(hosts), _kernighan_lin(topology, hosts, weight), "kernighan-lin")


def check_mtu(placement: Placement, mtu: int) -> None:
    """TopologyError (one line) when a host's underlay MTU cannot carry the lab's packets in VXLAN."""
    for host in placement.hosts:
        if host.mtu < mtu + VXLAN_OVERHEAD:
            raise TopologyError(f"host {host.name}: mtu {host.mtu} (the underlay's) is below the lab's links.mtu "
                                f"{mtu} + {VXLAN_OVERHEAD} bytes of VXLAN: give the underlay's real MTU (e.g. 9000) "
                                f"or lower links.mtu to {host.mtu - VXLAN_OVERHEAD}")


def check_underlay(topology: Topology, placement: Placement, default_bps: float, mtu: int) -> list[HostShare]:
    """Each host's share; TopologyError (one line) when a host's underlay MTU cannot carry the
    lab's packets in VXLAN, or what may cross to other hosts at the lab's rates exceeds its NIC."""
    check_mtu(placement, mtu)
    shares = placement.shares(topology, default_bps, mtu)
    nic = {host.name: host.nic_bps for host in placement.hosts}
    for share in shares:
        most = max(share.out_bps, share.in_bps)
        if nic[share.host] is not None and most > nic[share.host]:
            raise TopologyError(f"host {share.host}: its {share.crossing} links to other hosts may carry "
                                f"{most / 1e9:.3g} Gbit/s each way with VXLAN's overhead, more than its NIC's "
                                f"{nic[share.host] / 1e9:.3g} Gbit/s: give it a faster NIC, spread the lab over "
                                "fewer hosts, or lower the links' rates")
    return shares


def _weights(topology: Topology, weights, default_bps: float) -> dict[frozenset, float]:
    """Weight of each link (both directions summed): given, or its rates."""
    out: dict[frozenset, float] = {}
    for link in topology.links:
        a, b = link.nodes()
        if weights is None:
            value = topology.rate_of(a, b, default_bps) + topology.rate_of(b, a, default_bps)
        else:
            value = float(weights.get((a, b), 0.0)) + float(weights.get((b, a), 0.0))
        out[frozenset((a, b))] = out.get(frozenset((a, b)), 0.0) + value
    return out


def _by_blocks(topology: Topology, blocks: list[list[str]], hosts: list[Host],
               weight: dict[frozenset, float]) -> dict[str, str]:
    """Contiguous runs of blocks with about equal servers per host; the rest by link weight."""
    is_server = {name: node.is_server for name, node in topology.nodes.items()}
    total = sum(is_server[n] for block in blocks for n in block)
    host_of: dict[str, str] = {}
    before = 0
    for block in blocks:
        count = sum(is_server[n] for n in block)
        index = min(len(hosts) - 1, int((before + count / 2) * len(hosts) / max(total, 1)))
        for name in block:
            host_of[name] = hosts[index].name
        before += count
    loose = [name for name in topology.nodes if name not in host_of]
    held = {host.name: 0 for host in hosts}
    neighbours = _neighbours(topology, weight)
    pending = deque(loose)
    stalled = 0
    while pending:
        name = pending.popleft()
        pull = {host.name: 0.0 for host in hosts}
        for there, value in neighbours[name]:
            if there in host_of:
                pull[host_of[there]] += value
        if not any(pull.values()) and stalled < len(pending) + 1:  # only loose neighbours so far: later
            pending.append(name)
            stalled += 1
            continue
        stalled = 0
        best = max(hosts, key=lambda host: (pull[host.name], -held[host.name]))
        host_of[name] = best.name
        held[best.name] += 1
    return host_of


def _neighbours(topology: Topology, weight: dict[frozenset, float]) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {name: [] for name in topology.nodes}
    for link in topology.links:
        a, b = link.nodes()
        out[a].append((b, weight[frozenset((a, b))]))
        out[b].append((a, weight[frozenset((a, b))]))
    return out


def _kernighan_lin(topology: Topology, hosts: list[Host], weight: dict[frozenset, float]) -> dict[str, str]:
    """Recursive bisection: each half of the hosts gets its share of the servers."""
    import networkx as nx
    from networkx.algorithms.community import kernighan_lin_bisection

    graph = nx.Graph()
    graph.add_nodes_from(topology.nodes)
    for pair, value in weight.items():
        a, b = tuple(pair)
        graph.add_edge(a, b, weight=value)
    is_server = {name: node.is_server for name, node in topology.nodes.items()}
    host_of: dict[str, str] = {}

    def split(nodes: list[str], among: list[Host]) -> None:
        if len(among) == 1:
            host_of.update(dict.fromkeys(nodes, among[0].name))
            return
        left_hosts, right_hosts = among[: len(among) // 2], among[len(among) // 2:]
        sub = graph.subgraph(nodes)
        servers = [n for n in nodes if is_server[n]]
        want = round(len(servers) * len(left_hosts) / len(among))
        order = _bfs_order(sub, nodes)
        left, taken = set(), 0
        for name in order:
            if taken >= want:
                break
            left.add(name)
            taken += is_server[name]
        right = set(nodes) - left
        if left and right:
            left, right = (set(half) for half in kernighan_lin_bisection(sub, (left, right), weight="weight", seed=0))
        _even_out(sub, left, right, want, is_server)
        split([n for n in nodes if n in left], left_hosts)
        split([n for n in nodes if n in right], right_hosts)

    split(list(topology.nodes), list(hosts))
    return host_of


def _bfs_order(graph, nodes: list[str]) -> list[str]:
    """Breadth first from a least-connected node, component by component."""
    order, seen = [], set()
    for start in sorted(nodes, key=lambda n: (graph.degree(n), nodes.index(n))):
        if start in seen:
            continue
        seen.add(start)
        queue = deque([start])
        while queue:
            here = queue.popleft()
            order.append(here)
            for there in graph.neighbors(here):
                if there not in seen:
                    seen.add(there)
                    queue.append(there)
    return order


def _even_out(graph, left: set[str], right: set[str], want: int, is_server: dict[str, bool]) -> None:
    """Move servers across until `left` holds `want` of them: each time the one that costs
    least cut weight (most pulled by the other side)."""
    def gain(name: str, there: set[str]) -> float:
        return sum(d["weight"] * (1 if other in there else -1) for other, d in graph[name].items())

    while sum(is_server[n] for n in left) != want:
        source, target = (left, right) if sum(is_server[n] for n in left) > want else (right, left)
        mover = max((n for n in source if is_server[n]), key=lambda n: (gain(n, target), n))
        source.remove(mover)
        target.add(mover)
