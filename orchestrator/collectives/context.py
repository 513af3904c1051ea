"""What an algorithm may know when it builds a schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.topology import Topology


@dataclass(frozen=True)
class Context:
    """Input of every schedule function.

    workers:  number of ranks holding a gradient (ranks 0..workers-1).
    topology: the lab's topology, for topology-aware algorithms (HiPS, BML, HDRM,
              hierarchical by switch); None on loopback for topology-oblivious ones.
    nodes:    rank → server name in `topology` (workers first), when there is one.
    options:  algorithm options, e.g. {"shards": 4, "colocated": False} for ps,
              {"widths": [3, 4]} for flextree, {"group": 4} for hierarchical.
    """

    workers: int
    topology: Topology | None = None
    nodes: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)

    def option(self, name: str, default=None):
        return self.options.get(name, default)

    def rank_of(self, node: str) -> int:
        return self.nodes.index(node)
