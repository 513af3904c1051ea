"""A user's algorithm as a plugin: the bidirectional ring.

Half of the gradient goes round the ring one way, the other half the other way, in the same
2(N−1) steps: on a torus or any lab whose servers have a link each way, both directions of
every link carry bytes; on a star the NIC carries the same bytes as one ring.

Load it as Mininet loads --custom topologies:
    testbed check-algorithm examples/bidirectional_ring.py
    testbed predict torus,4,2 -a bidir-ring --plugin examples/bidirectional_ring.py
    testbed run examples/bidirectional-ring.yaml          # `plugins: [bidirectional_ring.py]`
"""

from __future__ import annotations

from orchestrator.collectives import Case, Context, Form, Schedule, Transfer, chunks, register


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    """The schedule over elements [offset, offset + length) of a `size`-element buffer."""
    length = size - offset if length is None else length
    n = ctx.workers
    schedule = Schedule("bidir-ring", n, size)
    if n < 2:
        return schedule
    half = length // 2
    forward = chunks(offset, half, n)  # goes to rank + 1
    backward = chunks(offset + half, length - half, n)  # goes to rank − 1
    # reduce-scatter: after n−1 steps rank r owns forward chunk r+1 and backward chunk r−1
    for s in range(n - 1):
        schedule.add_step(
            [Transfer(r, (r + 1) % n, *forward[(r - s) % n], "reduce") for r in range(n)]
            + [Transfer(r, (r - 1) % n, *backward[(r + s) % n], "reduce") for r in range(n)])
    # allgather: the finished chunks go on round the same way
    for s in range(n - 1):
        schedule.add_step(
            [Transfer(r, (r + 1) % n, *forward[(r + 1 - s) % n], "copy") for r in range(n)]
            + [Transfer(r, (r - 1) % n, *backward[(r - 1 + s) % n], "copy") for r in range(n)])
    return schedule


def transfers(ctx: Context, length: int) -> int:
    """An upper bound of one schedule's transfers, checked before anything is built."""
    return 4 * ctx.workers * (ctx.workers - 1)


def closed_form(case: Case) -> Form | None:
    """Every rank sends 2(N−1)/N·S bytes; with one NIC (a star) they share it."""
    n = case.workers
    if case.topology.kind != "star":
        return None
    return Form(2 * (n - 1) / n, 2 * (n - 1), "2(N−1)/N·S/B, 2(N−1)α: both directions share one NIC")


register("bidir-ring", build, transfers=transfers, closed_form=closed_form)
