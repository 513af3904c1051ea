"""Why a run stalled, in one line: pure functions of what the driver last heard from each
rank (its status, with the transfers it waits for) and, in a lab, the paths between ranks
and whether a link is up. driver.run calls a run stalled when no rank has moved data for
the stall timeout, and raises RunError with `stall_message`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.cost import Prediction

LONG_POLL_SECONDS = 1.0  # an agent answers the driver's long poll at least this often
STALL_SECONDS = 5.0  # the least stall timeout: longer than any hiccup of a busy host
SILENT_SECONDS = LONG_POLL_SECONDS + 2.0  # an agent silent this long is frozen or cut off


def default_stall_timeout(predicted: Prediction | None) -> float:
    """`STALL_SECONDS`, or twice the predicted allreduce when longer (a lab's slow links).
    A stall is no data moved by any rank, computing ranks counting as moving: even the
    slowest step of a plan moves some chunk well within a whole allreduce's time."""
    return max(STALL_SECONDS, 2 * predicted.seconds) if predicted is not None else STALL_SECONDS


@dataclass
class RankView:
    """What the driver knows of one rank while it waits: its last status and how old it is."""

    rank: int
    node: str
    status: pb.AgentStatus | None  # None: it has not answered since the run started
    silent: float  # seconds since its last answer
    stalled: float  # seconds since it last moved data, by its last answer and the time since


@dataclass
class Stall:
    """When a run has stalled, and one line on why (`message`)."""

    algorithm: str
    timeout: float
    path_of: Callable[[str, str], list[str]] | None = None
    link_state: Callable[[str, str], bool | None] | None = None

    def stalled(self, views: list[RankView]) -> bool:
        """No rank has moved data (or computed, or answered) for `timeout` seconds."""
        return bool(views) and min(v.stalled for v in views) >= self.timeout

    def message(self, views: list[RankView]) -> str:
        return stall_message(self.algorithm, views, self.timeout, self.path_of, self.link_state)

    @staticmethod
    def cut(views: list[RankView], least: float = 0.0) -> frozenset[frozenset[str]]:
        """The pairs of servers (by node) between which data does not arrive: the dead edges
        among the ranks that still answer, whose receiver has waited `least` seconds at least
        (what a surviving run finds a server cut off from the others' data with, though its
        agent answers: driver._Survivor)."""
        by_rank = {v.rank: v for v in views}
        silent = {v.rank for v in views if v.silent >= SILENT_SECONDS}
        return frozenset(frozenset((by_rank[src].node, by_rank[dst].node)) for src, dst, _ in _dead_edges(views, silent)
                         if by_rank[dst].stalled >= least)


def stall_message(algorithm: str, views: list[RankView], timeout: float,
                  path_of: Callable[[str, str], list[str]] | None = None,
                  link_state: Callable[[str, str], bool | None] | None = None) -> str:
    """One line on a stalled run: ranks that stopped answering, else the ranks that wait for
    a peer that has sent them data (or is sending it) that does not arrive — the path
    between them is dead — with that path and, known or guessed, its dead link."""
    by_rank = {v.rank: v for v in views}
    silent = [v for v in views if v.silent >= SILENT_SECONDS]
    edges = _dead_edges(views, {v.rank for v in silent})
    steps = [step for _, _, step in edges] or [p.step for v in views if v.status for p in v.status.pending]
    iterations = [v.status.iteration for v in views if v.status and v.status.state == "running"]
    where = f" at iteration {min(iterations)}" if iterations else ""
    where += f" step {min(steps)}" if steps else ""
    head = f"{algorithm} stalled{where}: "
    if silent:
        parts = [f"rank {v.rank} ({v.node}) has not answered for {v.silent:.1f} s" + _waited_by(v.rank, views)
                 for v in silent]
        return head + "; ".join(parts) + " (frozen, or its management path down?): thaw or restart it and run again"
    if not edges:
        waits = [f"rank {v.rank} ({v.node}) waits for {_peers(v, by_rank)}" for v in views if v.status]
        return (head + f"no data moved for {timeout:.1f} s; " + "; ".join(waits[:4] or ["no rank says why"])
                + _down_between(views, by_rank, path_of, link_state))
    paths = {}
    parts = []
    for src, dst, _ in edges[:4]:
        s, d = by_rank[src], by_rank[dst]
        part = f"rank {d.rank} ({d.node}) waits for rank {s.rank} ({s.node}) since {d.stalled:.1f} s"
        path = path_of(s.node, d.node) if path_of else []
        if path:
            paths[(src, dst)] = path
            part += f"; path {'→'.join(path)}"
        parts.append(part)
    return head + "; ".join(parts) + _link_verdict(list(paths.values()), link_state)


def _dead_edges(views: list[RankView], silent: set[int]) -> list[tuple[int, int, int]]:
    """(sender, receiver, step) of transfers a receiver is ready for while the sender has
    written that data already, or is blocked writing it: nothing else holds it back."""
    statuses = {v.rank: v.status for v in views if v.status is not None and v.rank not in silent}
    edges = []
    for rank, status in statuses.items():
        for wait in status.pending:
            if wait.kind != "receive" or not wait.ready or wait.peer not in statuses:
                continue
            if statuses[wait.peer].iteration < status.iteration:
                # the sender has not reached this iteration (held up in the last one: ranks
                # that finished it wait in the next): its pending sends are the last one's, so
                # no send listed would read as written in full, a dead edge that is not
                continue
            sends = [q for q in statuses[wait.peer].pending
                     if q.kind == "send" and q.peer == rank and q.step == wait.step and q.partition == wait.partition
                     and q.offset <= wait.done < q.end]
            # no such send left: written in full; else written past what arrived, or ready to write
            if all(q.done > wait.done or q.ready for q in sends):
                edges.append((wait.peer, rank, wait.step))
    first: dict[tuple[int, int], int] = {}
    for src, dst, step in edges:  # one per pair: its earliest step
        first[(src, dst)] = min(step, first.get((src, dst), step))
    return sorted(((src, dst, step) for (src, dst), step in first.items()), key=lambda e: (e[2], e[1], e[0]))


def _waited_by(rank: int, views: list[RankView]) -> str:
    waiting = sorted({v.rank for v in views if v.status and any(p.peer == rank for p in v.status.pending)})
    if not waiting:
        return ""
    return f" (rank {waiting[0]} waits for it)" if len(waiting) == 1 else \
        f" (ranks {', '.join(map(str, waiting))} wait for it)"


def _peers(view: RankView, by_rank: dict[int, RankView]) -> str:
    ranks = sorted({p.peer for p in view.status.pending if p.ready})
    named = [f"rank {r} ({by_rank[r].node})" if r in by_rank else f"rank {r}" for r in ranks]
    return ", ".join(named[:3]) or "nothing it can name"


def _down_between(views: list[RankView], by_rank: dict[int, RankView],
                  path_of: Callable[[str, str], list[str]] | None,
                  link_state: Callable[[str, str], bool | None] | None) -> str:
    """Where the statuses blame no path (a rendezvous' word lost on its way, ranks caught
    between two polls in different iterations): a link the lab says is down on a path between
    a rank and a peer it waits for (a ring on star,4 with h1-sw cut, once in ~10 runs:
    "rank 1 (h1) waits for rank 2 (h2); rank 2 (h2) waits for rank 1 (h1)" and no path)."""
    if path_of is None or link_state is None:
        return ""
    paths = []
    for v in views:
        for wait in (v.status.pending if v.status else ()):
            peer = by_rank.get(wait.peer)
            if wait.ready and peer is not None:
                paths.append(path_of(v.node, peer.node) if wait.kind == "send" else path_of(peer.node, v.node))
    down = _down_links(paths, link_state)
    return f" (link {', '.join(down)} down between ranks that wait for each other): heal it and run again" \
        if down else ""


def _down_links(paths: list[list[str]], link_state: Callable[[str, str], bool | None]) -> list[str]:
    """The links of these paths that `link_state` says are down, named "a-b", sorted."""
    return sorted({"-".join(sorted((a, b))) for path in paths for a, b in zip(path, path[1:])
                   if link_state(a, b) is False})


def _link_verdict(paths: list[list[str]], link_state: Callable[[str, str], bool | None] | None) -> str:
    """The link of these paths that is down (asked of `link_state`), else the one link all of
    them share, which would explain them all."""
    links = [list(zip(path, path[1:])) for path in paths]
    if not links:
        return ""
    if link_state is not None:
        down = _down_links(paths, link_state)
        if down:
            return f" (link {', '.join(down)} down): heal it and run again"
    shared = set.intersection(*({frozenset(link) for link in path} for path in links))
    if len(shared) == 1 and (len(links) > 1 or len(links[0]) == 1):
        a, b = sorted(next(iter(shared)))
        return f" (link {a}-{b} down?): check it and run again"
    return " (a link of it down?): check them and run again"
