"""Double binary tree (NCCL): two complementary binary trees, each reducing then
broadcasting half of the range, pipelined in chunks; both trees share the steps.

Tree 1 is NCCL's `ncclGetBtree`, rooted at rank 0: a rank r > 0 with lowest set bit b has
parent (r XOR b) | 2b, or r XOR b when that is ≥ N. Its leaves are the odd ranks, every
even rank is interior (rank 0 has one child). Tree 2 (`ncclGetDtree`) is the mirror image
r ↦ N−1−r for even N, so its leaves are the even ranks: each rank is a leaf in one tree
and interior in the other. For odd N it is tree 1 shifted by one (r ↦ r+1 mod N): then
rank 0 is interior in both (tree 1 has (N+1)/2 interior ranks, so two such trees cannot be
disjoint there) and every other rank is a leaf in exactly one tree.

Tree 1 carries the first half of the range, tree 2 the second. Option `pipeline` (P,
default 1) cuts each half into P chunks. With h(v) the height of v (leaves 0), d(v) its
depth (root 0) and H the root's height, chunk c goes
    up:   v → parent at step h(v) + c  (reduce), after all its children's chunk c arrived,
    down: v → children at step H + d(v) + c  (copy), after it got chunk c from its parent.
At one step a rank sends up chunk s−h(v) and receives chunks s−h(child) > s−h(v) from its
children, sends down chunk s−H−d(v) and receives chunk s−H−d(v)+1 from its parent; as
h(v) + d(v) ≤ H these never coincide, so no rank sends and receives one range at once.
That is 2H + P − 1 steps (H ≈ log2 N). Each tree moves S/2 over each of its N−1 edges both
ways; an interior rank sends S/2 up and S/2 to each child, a leaf S/2 up: ≈ 2S per rank
over the two trees, and with large P the time approaches 2Sβ + 2 log2 N·(α + cβ) for
chunk size c.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import Field

from orchestrator.collectives.context import Context
from orchestrator.collectives.options import AlgorithmOptions
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


def btree_parents(n: int) -> list[int]:
    """NCCL's binary tree over ranks 0..n−1: the parent of every rank, −1 for the root 0."""
    parents = [-1] * n
    for r in range(1, n):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parents[r] = up if up < n else r ^ bit
    return parents


def dtree_parents(n: int) -> tuple[list[int], list[int]]:
    """Parents in both trees: tree 2 mirrors tree 1 for even n and shifts it by one for odd n."""
    first = btree_parents(n)
    if n % 2 == 0:
        image = [n - 1 - r for r in range(n)]
    else:
        image = [(r + 1) % n for r in range(n)]
    second = [-1] * n
    for r, parent in enumerate(first):
        second[image[r]] = -1 if parent < 0 else image[parent]
    return first, second


def _tree_steps(parents: list[int], pieces: list[tuple[int, int]]) -> dict[int, list[Transfer]]:
    """Transfers of one tree by step index, as timed in the module docstring."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for r, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(r)
    root = parents.index(-1)
    depth = {root: 0}
    order = [root]  # top-down (breadth first), so heights can be filled bottom-up
    for v in order:
        for c in children[v]:
            depth[c] = depth[v] + 1
            order.append(c)
    height = [0] * n
    for v in reversed(order):
        height[v] = max((height[c] + 1 for c in children[v]), default=0)
    top = height[root]
    steps: dict[int, list[Transfer]] = defaultdict(list)
    for c, piece in enumerate(pieces):
        for v in order:
            if v != root:
                steps[height[v] + c].append(Transfer(v, parents[v], *piece, "reduce"))
            for child in children[v]:
                steps[top + depth[v] + c].append(Transfer(v, child, *piece, "copy"))
    return steps


# pieces per half: beyond this a pipeline is messages of a few bytes, and a plan that size
MAX_PIPELINE = 1024


class Options(AlgorithmOptions):
    pipeline: int = Field(1, strict=True, ge=1, le=MAX_PIPELINE, description="pieces each half is cut into")


def transfers(ctx: Context, length: int) -> int:
    return 4 * max(0, ctx.workers - 1) * int(ctx.option("pipeline", 1))


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    n = ctx.workers
    pipeline = int(ctx.option("pipeline", 1))
    if pipeline < 1:
        raise ValueError(f"double-tree: pipeline must be at least 1, got {pipeline}")
    schedule = Schedule("double-tree", n, size)
    schedule.meta["pipeline"] = pipeline
    if n < 2:
        return schedule
    merged: dict[int, list[Transfer]] = defaultdict(list)
    # the trees work on disjoint halves, so their transfers can share any step
    for parents, half in zip(dtree_parents(n), chunks(offset, length, 2)):
        for index, transfers in _tree_steps(parents, chunks(*half, pipeline)).items():
            merged[index].extend(transfers)
    for index in sorted(merged):
        schedule.add_step(merged[index])
    return schedule
