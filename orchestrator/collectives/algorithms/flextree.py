"""FlexTree: multi-level mesh reduce-scatter, then the allgathers in reverse; 2L steps.

Widths w_0 … w_{L−1} with ∏ w_i = N write a rank in mixed radix,
r = d_0 + w_0·(d_1 + w_1·(d_2 + …)). The level-i group of r is the w_i ranks differing
from r only in digit i. Reduce-scatter level i is a mesh (`mesh_steps`) inside every
level-i group over the segment the group shares (the range cut by digits d_0 … d_{i−1});
the member with digit d_i keeps piece d_i of it, so data shrink ×1/w_i per level and after
L levels every rank owns a fully reduced 1/N of the range. Allgather runs the levels
backwards (L−1 … 0). Every rank sends 2(N−1)/N · S bytes (the per-level terms
2(w_i−1)/w_i · S/(w_0⋯w_{i−1}) telescope), in 2L steps instead of mesh's 2.

Option `widths`: the factorization (ValueError unless its product is N; widths of 1 are
empty levels). Without it, every ordered factorization of N into factors ≥ 2 is costed
with the REFERENCE one-level model summed over levels, level i moving S_i = S/(w_0⋯w_{i−1}):
    Σ_i 2α + 2(w_i−1)·α_flow + 2(w_i−1)/w_i · S_i·β
(S in bytes of 4-byte elements; options `alpha` = 20e-6 s, `beta` = 8e-9 s/byte, i.e.
1 Gbit/s, and `flow_alpha`, a per-peer message cost, by default equal to `alpha`). The
bandwidth terms are the same for every factorization (they telescope to 2(N−1)/N·Sβ),
so the choice is decided by latency: under the plain REFERENCE model (flow_alpha = 0) the
single level [N], i.e. mesh, always wins, which is not what FlexTree is for; charging α
per peer message (what a sender pays per flow it starts) trades levels (2α each) against
wide meshes (2(w−1) messages per rank each): N = 12 picks [3, 4]. Ties go to fewer
levels, then the lexicographically smallest widths. The widths used are in
`schedule.meta["widths"]`.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Optional

from pydantic import Field

from orchestrator.collectives.algorithms.mesh import mesh_steps
from orchestrator.collectives.context import Context
from orchestrator.collectives.options import MAX_RANKS, AlgorithmOptions
from orchestrator.collectives.schedule import Schedule, Transfer, chunks

ALPHA = 20e-6  # s per level phase
BETA = 1 / (1e9 / 8)  # s per byte: 1 Gbit/s
ITEMSIZE = 4  # bytes per element in the cost model (fp32 gradients)


@functools.lru_cache(maxsize=None)
def factorizations(n: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered factorization of n into factors ≥ 2 (n = 1: the empty one)."""
    if n == 1:
        return ((),)
    return tuple((f, *rest) for f in range(2, n + 1) if n % f == 0 for rest in factorizations(n // f))


def cost(widths: tuple[int, ...], nbytes: float, alpha: float, beta: float, flow_alpha: float = 0.0) -> float:
    """Modelled time of FlexTree with these widths on nbytes (module docstring)."""
    total, data = 0.0, float(nbytes)
    for w in widths:
        total += 2 * alpha + 2 * (w - 1) * flow_alpha + 2 * (w - 1) / w * data * beta
        data /= w
    return total


def choose_widths(
    n: int, nbytes: float, alpha: float = ALPHA, beta: float = BETA, flow_alpha: float = 0.0
) -> tuple[int, ...]:
    """The factorization of n the cost model prefers (ties: fewer levels, then smallest)."""
    costs = {w: cost(w, nbytes, alpha, beta, flow_alpha) for w in factorizations(n)}
    best = min(costs.values())
    # the bandwidth terms are equal only up to rounding, so compare with a tolerance
    near = [w for w, c in costs.items() if math.isclose(c, best, rel_tol=1e-9, abs_tol=1e-15)]
    return min(near, key=lambda w: (len(w), w))


def widths_of(ctx: Context, length: int) -> tuple[int, ...]:
    n = ctx.workers
    given = ctx.option("widths")
    if given is None:
        return choose_widths(
            n,
            length * ITEMSIZE,
            float(ctx.option("alpha", ALPHA)),
            float(ctx.option("beta", BETA)),
            float(ctx.option("flow_alpha", ctx.option("alpha", ALPHA))),
        )
    widths = tuple(int(w) for w in given)
    if any(w < 1 for w in widths) or math.prod(widths) != n:
        raise ValueError(f"flextree: widths {list(widths)} must be positive with product {n} (the workers)")
    return widths


class Options(AlgorithmOptions):
    widths: Optional[list[Annotated[int, Field(strict=True, ge=1, le=MAX_RANKS)]]] = Field(
        None, min_length=1, max_length=12, description="group width per level, product = workers")
    alpha: float = Field(ALPHA, ge=0, le=10, description="s per level phase, for choosing widths")
    beta: float = Field(BETA, ge=0, le=1, description="s per byte, for choosing widths")
    flow_alpha: Optional[float] = Field(None, ge=0, le=10, description="s per flow (default alpha)")


def transfers(ctx: Context, length: int) -> int:
    return sum(2 * ctx.workers * (w - 1) for w in widths_of(ctx, length))


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    n = ctx.workers
    widths = widths_of(ctx, length)
    schedule = Schedule("flextree", n, size)
    schedule.meta["widths"] = list(widths)
    strides = [math.prod(widths[:i]) for i in range(len(widths))]
    # segment[r]: the (offset, length) rank r is still responsible for at the current level
    segment = [(offset, length)] * n
    scatters: list[list[Transfer]] = []
    gathers: list[list[Transfer]] = []
    for w, stride in zip(widths, strides):
        scatter: list[Transfer] = []
        gather: list[Transfer] = []
        after = list(segment)
        for r in range(n):
            if (r // stride) % w:
                continue  # build each group once, from its member with digit 0
            group = [r + j * stride for j in range(w)]  # ordered by digit: member j keeps piece j
            s, g = mesh_steps(group, *segment[r])
            scatter += s
            gather += g
            for j, piece in enumerate(chunks(*segment[r], w)):
                after[group[j]] = piece
        segment = after
        scatters.append(scatter)
        gathers.append(gather)
    for step in scatters + gathers[::-1]:
        schedule.add_step(step)
    return schedule
