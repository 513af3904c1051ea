"""Halving-doubling (Rabenseifner): recursive-halving reduce-scatter, then recursive-doubling
allgather; 2·log2 p steps for p = 2^d ranks.

Reduce-scatter step t (t = 0 … d−1): rank i exchanges with i XOR 2^t; both hold the same
segment of 2^(d−t) chunks (of p); the one with bit t clear keeps (and receives) the lower
half and sends the upper half, which the partner adds in. After d steps rank i owns the
fully reduced chunk bitreverse(i). Allgather retraces the steps in reverse (t = d−1 … 0),
each rank sending the whole segment it holds and receiving its partner's. Each rank sends
2(p−1)/p · S bytes.

Any N (MPICH's method): p = largest power of two ≤ N, r = N − p. First, each even rank
2i < 2r sends its whole range to 2i+1 (reduce) and sits out; the p ranks left (1, 3, …,
2r−1, 2r, …, N−1) run halving-doubling; last, 2i+1 copies the result back to 2i. That is
2·log2 p + 2 steps when r > 0; the ranks sitting out send and receive S.

Reusable helper (HDRM maps ranks onto it):

    hd_steps(ranks: Sequence[int], offset: int, length: int, nic: int | None = None)
        -> list[list[Transfer]]

returns the 2·log2 p steps (reduce-scatter, then allgather) of halving-doubling among
`ranks` (len(ranks) a power of two, ValueError otherwise) over [offset, offset+length);
`ranks[i]` plays index i above, so step t pairs ranks[i] with ranks[i ^ 2^t]. Steps may
contain zero-length transfers (tiny ranges): pass each to `Schedule.add_step`, which drops
them. Every transfer carries `nic`; use `dataclasses.replace` for per-step NICs.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


def hd_steps(ranks: Sequence[int], offset: int, length: int, nic: int | None = None) -> list[list[Transfer]]:
    """Reduce-scatter and allgather steps of halving-doubling among `ranks` (see module doc)."""
    p = len(ranks)
    if p < 1 or p & (p - 1):
        raise ValueError(f"halving-doubling needs a power-of-two number of ranks, got {p}")
    d = p.bit_length() - 1
    pieces = chunks(offset, length, p)

    def span(lo: int, hi: int) -> tuple[int, int]:  # element range of chunks [lo, hi)
        start = pieces[lo][0]
        return start, pieces[hi - 1][0] + pieces[hi - 1][1] - start

    # segment[i] = chunks [lo, hi) rank index i is responsible for after each step
    segments = [(0, p)] * p
    history: list[list[tuple[int, int]]] = []
    scatter: list[list[Transfer]] = []
    for t in range(d):
        history.append(segments)
        step, after = [], []
        for i in range(p):
            lo, hi = segments[i]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if not i >> t & 1 else ((mid, hi), (lo, mid))
            step.append(Transfer(ranks[i], ranks[i ^ 1 << t], *span(*give), "reduce", nic))
            after.append(keep)
        scatter.append(step)
        segments = after
    gather: list[list[Transfer]] = []
    for t in reversed(range(d)):
        # send the segment held now; afterwards hold the union, i.e. the one before step t
        gather.append([Transfer(ranks[i], ranks[i ^ 1 << t], *span(*segments[i]), "copy", nic) for i in range(p)])
        segments = history[t]
    return scatter + gather


def transfers(ctx: Context, length: int) -> int:
    n = ctx.workers
    if n < 2:
        return 0
    d = n.bit_length() - 1
    return 2 * (n - (1 << d)) + 2 * d * (1 << d)


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    n = ctx.workers
    schedule = Schedule("halving-doubling", n, size)
    if n < 2:
        return schedule
    p = 1 << (n.bit_length() - 1)
    r = n - p
    schedule.add_step(Transfer(2 * i, 2 * i + 1, offset, length, "reduce") for i in range(r))
    active = [2 * i + 1 for i in range(r)] + list(range(2 * r, n))
    for step in hd_steps(active, offset, length):
        schedule.add_step(step)
    schedule.add_step(Transfer(2 * i + 1, 2 * i, offset, length, "copy") for i in range(r))
    return schedule
