"""BML (Wang et al., NeurIPS 2018): gradient synchronisation on BCube by explicit sets.

Notation: BML's BCube(n, k) has k levels; ours (Guo et al.) is `bcube n k` with h = k+1
levels and N = n^h servers, so BML's k is our h and BML's BCube(4, 2) is our `bcube 4 1`.

Sets and ownership (`owners`). The range is cut into h set groups (`chunks(offset, length,
h)`); group g is cut into one set per live server (`chunks(group, N_live)`). Group g visits
the levels g, g+1, …, g+h−1 (mod h); order the live servers by their digits read in that
order, a_g most significant (the key a_g, a_(g+1), …): set j of group g belongs to the j-th
server in that order. With no failure, server a owns set Σ_s a_((g+s) mod h)·n^(h−1−s) of
group g: h·N sets in all (BCube(4,2) in BML notation: 2·16 = 32 sets of length/32).

Schedule. Aggregation step s of group g works at level L = (g+s) mod h: in each level-L
switch group the members share the digits of the levels already visited, hence the same
segment (the sets of the live servers with those digits); member v receives from every
other member the sets of the servers whose level-L digit is v (mesh, nic = L), so the held
data shrinks ×1/n per step. All h groups move at once, each on a different level, so every
NIC works in every step: h aggregation steps, then h broadcast steps that reverse them
(owners copy their segment to the rest of their switch group). Every NIC sends
2(N−1)/(h·N)·w (w = length·itemsize, length divisible by h·N): GST = 2(N−1)/N · P/(h·B).

Failures (option `failed`: server names). Failed servers neither contribute nor receive:
no transfer touches them and they own no set (the live servers share each group in
N−f sets). A failed server d would have aggregated, at each step s < h−1 of each group, the
chunk of its own digit in its level-L_s switch group and relayed it onward. Instead, before
that step, every live switch peer x of d (x = d with digit L_s changed) folds its share of
that chunk away: the sets whose owners first differ from d at a later level L_j with digit w
go to x'' = x with digit L_j set to w (one hop, nic L_j), which adds them into what it sends
in the regular step to y = d with digit L_j set to w — the detour x → x'' → y around the dead
relay through a same-switch peer (REFERENCE's 2→6→5). The broadcast unfolds the same way in
reverse (x'' copies the blocks back to x after the regular step). This costs one extra step
per stage below the last (2h + 2(h−1) steps) and moves each folded block one more hop.
Measured with one failure (w = P, any failed server): our bcube 4 1 (BML's BCube(4,2)) has
its busiest NIC send 1.000·w (healthy 0.9375·w; REFERENCE's paper figure 16/15·T), but the
fold steps sit between the regular ones, so summing each step's busiest NIC gives 1.2·w/B;
bcube 4 2: 0.730·w busiest NIC, 0.825·w/B step by step (healthy 0.656). This is our own
reconstruction, not the paper's exact scheme: a tested approximation with exact sums and
one-switch transfers. Supported: on one switch (k = 0) any failures that leave a server
alive; otherwise failed servers must differ in at least 3 digits from each other, so that
no fold source, relay or target is itself dead and folds of different failures never meet
(with h ≤ 2 this means one failure). Other failure sets raise ValueError.
"""

from __future__ import annotations

from itertools import combinations

from orchestrator.collectives.algorithms.levels import Coords, level_coords, stage_groups, topology_ranks, with_coord
from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


class _Sets:
    """The sets of one group: which live server owns which range, and the contiguous range
    of the sets owned by the servers that share a key prefix (digits in visiting order)."""

    def __init__(self, start: int, count: int, order: list[tuple[Coords, int]]) -> None:
        # order: (key, rank) of the live servers, sorted by key
        self.owners = [rank for _, rank in order]
        self.ranges = chunks(start, count, len(order)) if order else []
        self.span: dict[Coords, tuple[int, int]] = {}
        for j, (key, _) in enumerate(order):
            for depth in range(len(key) + 1):
                first = self.span.get(key[:depth], (j, j))[0]
                self.span[key[:depth]] = (first, j + 1)

    def range(self, prefix: Coords) -> tuple[int, int]:
        """(offset, length) of the sets whose owners' keys start with `prefix`."""
        if prefix not in self.span:
            return (0, 0)
        first, last = self.span[prefix]
        offset = self.ranges[first][0]
        return offset, self.ranges[last - 1][0] + self.ranges[last - 1][1] - offset


def _key(c: Coords, g: int, h: int) -> Coords:
    return tuple(c[(g + s) % h] for s in range(h))


def _check_failures(failed: list[int], coords: list[Coords], h: int) -> None:
    if h == 1:
        return
    for a, b in combinations(failed, 2):
        if sum(x != y for x, y in zip(coords[a], coords[b])) < 3:
            raise ValueError(
                "bml: failed servers must differ in at least 3 address digits from each other "
                "(at most one failure when bcube k <= 1); this failure set is not supported"
            )


def owners(ctx: Context) -> list[list[str]]:
    """Per set group, the server owning each set in set order (see the module docstring)."""
    topology, ranks = topology_ranks(ctx, "bml", ("bcube",))
    schedule = build(ctx, 0, 0, 0)
    names = {rank: name for name, rank in ranks.items()}
    return [[names[r] for r in group] for group in schedule.meta["owners"]]


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    topology, ranks = topology_ranks(ctx, "bml", ("bcube",))
    coords, n, h = level_coords(topology, ranks)
    failed_names = ctx.option("failed", []) or []
    if isinstance(failed_names, str):  # `-o failed=h11,h22`: names, not a string's letters
        failed_names = [name.strip() for name in failed_names.split(",") if name.strip()]
    failed_names = list(failed_names)
    unknown = [name for name in failed_names if name not in ranks]
    if unknown:
        raise ValueError(f"bml: failed servers {', '.join(map(str, unknown))} are not in this bcube")
    dead = sorted({ranks[name] for name in failed_names})
    live = sorted(set(range(len(coords))) - set(dead))
    if not live:
        raise ValueError("bml: every server has failed")
    _check_failures(dead, coords, h)
    alive = set(live)
    index = {c: r for r, c in enumerate(coords)}

    groups = [
        _Sets(start, count, sorted((_key(coords[r], g, h), r) for r in live))
        for g, (start, count) in enumerate(chunks(offset, length, h))
    ]
    schedule = Schedule(
        "bml", ctx.workers, size, workers=tuple(live),
        meta={"owners": [sets.owners for sets in groups], "failed": tuple(dead), "aggregation_steps": 0},
    )
    if len(live) < 2:
        return schedule

    def mesh(stage: int, op: str) -> list[Transfer]:
        """Aggregation (reduce to owners) or broadcast (copy from owners) of one stage."""
        out = []
        for g, sets in enumerate(groups):
            level = (g + stage) % h
            for members in stage_groups(coords, n, level):  # one pass per switch group
                c = coords[members[0]]
                prefix = _key(c, g, h)[:stage]
                for v, owner in enumerate(members):
                    if owner not in alive:
                        continue  # its chunk was folded away
                    chunk = sets.range(prefix + (v,))
                    for other in members:
                        if other != owner and other in alive:
                            src, dst = (other, owner) if op == "reduce" else (owner, other)
                            out.append(Transfer(src, dst, *chunk, op, level))
        return out

    def folds(stage: int, op: str) -> list[Transfer]:
        """Detours around each failed server's chunk at `stage`: x → x'' (reduce) before the
        aggregation step, x'' → x (copy) after the broadcast step."""
        out = []
        for g, sets in enumerate(groups):
            levels = [(g + s) % h for s in range(h)]
            for d in dead:
                key = _key(coords[d], g, h)
                for u in range(n):
                    if u == coords[d][levels[stage]]:
                        continue
                    x = with_coord(coords[d], levels[stage], u)
                    for j in range(stage + 1, h):
                        for w in range(n):
                            if w == key[j]:
                                continue
                            block = sets.range(key[:j] + (w,))
                            relay = index[with_coord(x, levels[j], w)]
                            src, dst = (index[x], relay) if op == "reduce" else (relay, index[x])
                            out.append(Transfer(src, dst, *block, op, levels[j]))
        return out

    for stage in range(h):
        schedule.add_step(folds(stage, "reduce"))
        schedule.add_step(mesh(stage, "reduce"))
    schedule.meta["aggregation_steps"] = len(schedule.steps)
    for stage in reversed(range(h)):
        schedule.add_step(mesh(stage, "copy"))
        schedule.add_step(folds(stage, "copy"))
    return schedule
