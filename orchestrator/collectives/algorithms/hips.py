"""HiPS (Geng et al., NetAI 2018): hierarchical synchronisation over the h stages of a
server-centric topology, with the gradient cut into h parts that start at different stages
so that every NIC works in every step.

Stages. BCube (Guo et al.'s notation: `bcube n k` has h = k+1 levels, N = n^h servers; the
HiPS paper's BCube(n, h) is our `bcube n k=h-1`): stage = level l, a stage group is the n
servers on one level-l switch. Torus (k-ary d-cube, h = d): stage = dimension, a stage group
is one ring of k nodes.

Parts. The range is cut into h parts (`chunks`); part p visits the levels p, p+1, …, p+h−1
(mod h), so at every stage s the h parts use h different levels at once and a step holds the
transfers of all parts. Reduce-scatter runs the stages in that order, allgather reverses it.

BCube stage: a mesh reduce-scatter inside each switch group (`mesh_steps` with nic = l): the
member whose digit a_l is v ends up owning chunk v of the group's segment, so a server's
segment after stage s is the nested chunk selected by its digits a_(p), …, a_(p+s) and
shrinks ×1/n per stage. One step per stage: 2h steps.
Per-NIC bytes, length divisible by h·n^h (w = length·itemsize): level l serves each part
exactly once, at the stage where that part's segment is w/(h·n^s), and sends (n−1)/n of it;
summed over s = 0..h−1 that is (n^h−1)/(h·n^h)·w in reduce-scatter and again in allgather.
Every NIC of every server sends (and receives) exactly 2(n^h−1)/(h·n^h)·w, so
GST = 2(n^h−1)/(h·n^h)·w/B (n=4: 0.938, 0.656, 0.498 w/B for h = 2, 3, 4) and a server
sends 2(N−1)/N·w in total, like ring.

Torus stage: a bidirectional ring inside each ring of k nodes. Each part is cut once more
into a + half and a − half (2h sub-parts); the + half runs a (k−1)-step ring reduce-scatter
towards +1 (nic 2·dim), the − half towards −1 (nic 2·dim+1), so each stage moves half its
data each way, shrinking ×1/k per stage. k−1 steps per stage: 2h(k−1) steps.
Per-NIC bytes, length divisible by 2h·k^h: each of the 2h NICs sends exactly
(k^h−1)/(h·k^h)·w (half in reduce-scatter, half in allgather), GST = (k^h−1)/(h·k^h)·w/B.
For k = 2 both neighbours are one node behind one NIC eth{dim}, which then carries both
halves: 2(2^h−1)/(h·2^h)·w.
"""

from __future__ import annotations

from orchestrator.collectives.algorithms import bml
from orchestrator.collectives.algorithms.levels import (FailedOptions, level_coords, stage_groups, stage_transfers,
                                                         topology_ranks)
from orchestrator.collectives.algorithms.mesh import mesh_steps
from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks

def _ring_steps(
    group: list[int], offset: int, length: int, direction: int, nic: int
) -> tuple[list[list[Transfer]], list[list[Transfer]], list[tuple[int, int]]]:
    """One-directional ring reduce-scatter and allgather (k−1 steps each) over `group` in +
    order, and the piece each position owns afterwards. Towards +1, position j sends piece
    j−t at step t and ends owning j+1; towards −1 it mirrors (sends j+t, owns j−1)."""
    k = len(group)
    pieces = chunks(offset, length, k)
    scatter, gather = [], []
    for t in range(k - 1):
        rs, ag = [], []
        for j, src in enumerate(group):
            dst = group[(j + direction) % k]
            rs.append(Transfer(src, dst, *pieces[(j - direction * t) % k], "reduce", nic))
            ag.append(Transfer(src, dst, *pieces[(j + direction * (1 - t)) % k], "copy", nic))
        scatter.append(rs)
        gather.append(ag)
    owned = [pieces[(j + direction) % k] for j in range(k)]
    return scatter, gather, owned


def _without(ctx: Context, size: int, offset: int, length: int, torus: bool) -> Schedule:
    """HiPS on BCube re-formed over failed servers (option `failed`, set by a surviving run):
    its parts visiting the levels in turn are BML's set groups, and BML's scheme for failures
    (N−f sets, flows the dead relayed detoured through a same-switch peer; bml.py) is the
    way on; with no failure the two cost the same, 2(N−1)/N·P/(h·B). A torus has no such
    scheme here: its rings cannot lose a node."""
    if torus:
        raise ValueError("hips on a torus cannot go on without a server (its rings need every node)")
    schedule = bml.build(ctx, size, offset, length)
    schedule.algorithm = "hips"
    schedule.meta["as"] = "bml with failed servers"
    return schedule


Options = FailedOptions
transfers = stage_transfers


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    topology, ranks = topology_ranks(ctx, "hips", ("bcube", "torus"))
    coords, base, h = level_coords(topology, ranks)
    torus = topology.kind == "torus"
    if ctx.option("failed", []):
        return _without(ctx, size, offset, length, torus)
    schedule = Schedule("hips", ctx.workers, size, meta={"stages": h})
    if ctx.workers < 2:
        return schedule
    steps_per_stage = base - 1 if torus else 1
    scatter: list[list[list[Transfer]]] = [[[] for _ in range(steps_per_stage)] for _ in range(h)]
    gather: list[list[list[Transfer]]] = [[[] for _ in range(steps_per_stage)] for _ in range(h)]
    # sub-parts: (part, direction); BCube has one per part, the torus a + and a − half
    subparts = []
    for part, (start, count) in enumerate(chunks(offset, length, h)):
        if torus:
            (a, na), (b, nb) = chunks(start, count, 2)
            subparts += [(part, 1, a, na), (part, -1, b, nb)]
        else:
            subparts.append((part, 0, start, count))
    for part, direction, start, count in subparts:
        segment = [(start, count)] * len(coords)  # every rank starts with the whole sub-part
        for stage in range(h):
            level = (part + stage) % h
            for group in stage_groups(coords, base, level):
                seg = segment[group[0]]  # the group shares it: same coordinates so far
                if torus:
                    nic = level if base == 2 else 2 * level + (0 if direction > 0 else 1)
                    rs, ag, owned = _ring_steps(group, *seg, direction, nic)
                    for t in range(steps_per_stage):
                        scatter[stage][t] += rs[t]
                        gather[stage][t] += ag[t]
                else:
                    rs, ag = mesh_steps(group, *seg, nic=level)
                    scatter[stage][0] += rs
                    gather[stage][0] += ag
                    owned = chunks(*seg, base)  # mesh: the i-th member owns the i-th chunk
                for j, rank in enumerate(group):
                    segment[rank] = owned[j]
    for stage in range(h):
        for step in scatter[stage]:
            schedule.add_step(step)
    for stage in reversed(range(h)):
        for step in gather[stage]:
            schedule.add_step(step)
    return schedule
