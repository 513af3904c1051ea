"""BML (Wang et al., NeurIPS 2018): gradient synchronisation on BCube by explicit sets.

Notation: BML's BCube(n, k) has k levels; ours (Guo et al.) is `bcube n k` with h = k+1
levels and N = n^h servers, so BML's k is our h and BML's BCube(4, 2) is our `bcube 4 1`.

Sets and ownership (`owners`). The range is cut into h set groups (`chunks(offset, length,
h)`); group g is cut into one set per live server. Group g visits the levels g, g+1, …,
g+h−1 (mod h); order the live servers by their digits read in that order, a_g most
significant (the key a_g, a_(g+1), …): set j of group g belongs to the j-th server in that
order. The cut is nested (`_nested`): equal parts for the values of the key's first digit,
each part cut equally for the next digit's values, and so on. With no failure that is an
equal cut: server a owns set Σ_s a_((g+s) mod h)·n^(h−1−s) of group g, h·N sets in all
(BCube(4,2) in BML notation: 2·16 = 32 sets of length/32). With a failed server its set
goes to its siblings of the last level, so every switch group still aggregates equal
chunks at every stage, the detoured chunk included (equal sets, N−f per group, left the
failed server's chunk one set short and every other one a set long).

Schedule. Aggregation step s of group g works at level L = (g+s) mod h: in each level-L
switch group the members share the digits of the levels already visited, hence the same
segment (the sets of the live servers with those digits); member v receives from every
other member the sets of the servers whose level-L digit is v (mesh, nic = L), so the held
data shrinks ×1/n per step. All h groups move at once, each on a different level, so every
NIC works in every step: h aggregation steps, then h broadcast steps that reverse them
(owners copy their segment to the rest of their switch group). Every NIC sends
2(N−1)/(h·N)·w (w = length·itemsize, length divisible by h·N): GST = 2(N−1)/N · P/(h·B).

Failures (option `failed`: server names). Failed servers neither contribute nor receive:
no transfer touches them and they own no set. A failed server d would have aggregated, at
each stage s < h−1 of each group, the chunk of its own digit in its level-L_s switch group
and passed it on; each block B of that chunk that d would pass on at a later level L_j with
digit w is detoured to y = d with digit L_j set to w through a same-switch peer
(REFERENCE's 2→6→5), in one of two ways:
- fold (h ≥ 3, or n = 2): before stage s, every live L_s peer x of d sends its share of B
  to x'' = x with L_j = w (nic L_j), which adds it into what it sends to y in stage s. One
  step more per stage below the last, and in the broadcast x'' copies B back to x after
  the regular step.
- aggregate (h = 2, n ≥ 3): within stage s the peers send their shares of B to one of
  them, a (nic L_s: the NIC a fold leaves idle while the other group's stage-s mesh fills
  the fold's); with stage s+1, a sends the sum to r = a with L_j = w (nic L_j); after it, r
  sends it on to y (nic L_s), r having held its own share of B back from its stage-s send
  to y so that it counts once. Block i of d's chunk goes to peer i+g, so the two groups'
  relays differ. One step more in each phase.
The broadcast is the aggregation reversed, transfer by transfer.
Measured in the model (`testbed predict`, 100 Mbit, the slowest over every failed server
and 10-12.5 MB), time per allreduce in w/B (w = length·itemsize): bcube 4 1 (BML's
BCube(4,2); healthy 0.9375, REFERENCE's figure with one failure 16/15) 1.200 with folds and
equal sets, 1.188 folds and nested sets, 1.135 aggregate and nested sets; bcube 3 1 1.250 →
1.123; bcube 5 1 1.167 → 1.125; bcube 2 1 (fold) 1.262 → 1.210; bcube 3 2 (fold) 0.872 →
0.864 (aggregating there: 0.874-0.932). The fold steps sit between the regular ones, which
is what aggregating within them avoids; bcube 4 1's busiest NIC sends 47/48·w (folds: 1.0).
This is our own reconstruction, not the paper's exact scheme: a tested approximation with
exact sums and one-switch transfers. Supported: on one switch (k = 0) any failures that
leave a server alive; otherwise failed servers must differ in at least 3 digits from each
other, so that no detour's source, relay or target is itself dead and detours of different
failures never meet (with h ≤ 2 this means one failure). Other failure sets raise
ValueError.
"""

from __future__ import annotations

from itertools import combinations

from orchestrator.collectives.algorithms.levels import (Coords, FailedOptions, level_coords, stage_groups, stage_transfers,
                                                         topology_ranks, with_coord)
from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks


class _Sets:
    """The sets of one group: which live server owns which range, and the contiguous range
    of the sets owned by the servers that share a key prefix (digits in visiting order)."""

    def __init__(self, start: int, count: int, order: list[tuple[Coords, int]]) -> None:
        # order: (key, rank) of the live servers, sorted by key
        self.owners = [rank for _, rank in order]
        self.ranges = _nested(start, count, [key for key, _ in order], 0)
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


def _nested(start: int, count: int, keys: list[Coords], depth: int) -> list[tuple[int, int]]:
    """Ranges of the sets of `keys` (sorted): the range is cut equally among the values of
    digit `depth` present, each part among the next digit's, and so on. With every server
    alive that is an equal cut; with one dead, its set goes to its last-level siblings, so
    that every switch group still aggregates equal chunks at every stage (the detoured
    chunk included), which is what keeps the busiest NICs balanced step by step."""
    if not keys:
        return []
    if depth == len(keys[0]) or len(keys) == 1:
        return chunks(start, count, len(keys))
    values = sorted({key[depth] for key in keys})
    out = []
    for value, (offset, length) in zip(values, chunks(start, count, len(values))):
        out += _nested(offset, length, [key for key in keys if key[depth] == value], depth + 1)
    return out


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


Options = FailedOptions
transfers = stage_transfers


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
        meta={"owners": [sets.owners for sets in groups], "sets": [sets.ranges for sets in groups],
              "failed": tuple(dead), "aggregation_steps": 0},
    )
    if len(live) < 2:
        return schedule

    # Detours around each failed server d (the module docstring's two kinds), by slot: slot
    # 2s runs before stage s's mesh, slot 2s+1 with it; slots past the last stage's follow.
    detours: dict[int, list[Transfer]] = {}
    held: dict[tuple[int, int, int], list[tuple[int, int]]] = {}  # (stage, r, y) → blocks r holds back
    aggregate = h == 2 and n >= 3
    for g, sets in enumerate(groups):
        levels = [(g + s) % h for s in range(h)]
        for d in dead:
            key = _key(coords[d], g, h)
            for stage in range(h - 1):
                level = levels[stage]
                peers = [with_coord(coords[d], level, u) for u in range(n) if u != coords[d][level]]
                blocks = [(j, w) for j in range(stage + 1, h) for w in range(n) if w != key[j]]
                for i, (j, w) in enumerate(blocks):
                    offset, count = sets.range(key[:j] + (w,))
                    if not aggregate:  # fold: x → x'' before the stage, x'' → y within it
                        for x in peers:
                            relay = index[with_coord(x, levels[j], w)]
                            detours.setdefault(2 * stage, []).append(
                                Transfer(index[x], relay, offset, count, "reduce", levels[j]))
                        continue
                    # aggregate: x → a with the stage, a → r with the next, r → y after it.
                    # Block i goes to peer i + g: the two groups' relays differ.
                    a = peers[(i + g) % len(peers)]
                    r = index[with_coord(a, levels[j], w)]
                    y = index[with_coord(coords[d], levels[j], w)]
                    detours.setdefault(2 * stage + 1, []).extend(
                        Transfer(index[x], index[a], offset, count, "reduce", level) for x in peers if x != a)
                    detours.setdefault(2 * stage + 3, []).append(Transfer(index[a], r, offset, count, "reduce", levels[j]))
                    detours.setdefault(2 * stage + 5, []).append(Transfer(r, y, offset, count, "reduce", level))
                    held.setdefault((stage, r, y), []).append((offset, count))

    def mesh(stage: int) -> list[Transfer]:
        """Aggregation (reduce to owners) of one stage, less the blocks relays hold back."""
        out = []
        for g, sets in enumerate(groups):
            level = (g + stage) % h
            for members in stage_groups(coords, n, level):  # one pass per switch group
                c = coords[members[0]]
                prefix = _key(c, g, h)[:stage]
                for v, owner in enumerate(members):
                    if owner not in alive:
                        continue  # its chunk is detoured
                    chunk = sets.range(prefix + (v,))
                    for other in members:
                        if other != owner and other in alive:
                            for offset, count in _without(chunk, held.get((stage, other, owner), [])):
                                out.append(Transfer(other, owner, offset, count, "reduce", level))
        return out

    # The broadcast is the aggregation reversed: the same transfers, copies from the owners,
    # in the opposite order (empty slots vanish).
    slots = max(2 * h, max(detours, default=0) + 1)
    steps = [(mesh(slot // 2) if slot % 2 and slot // 2 < h else []) + detours.get(slot, []) for slot in range(slots)]
    for step in steps:
        schedule.add_step(step)
    schedule.meta["aggregation_steps"] = len(schedule.steps)
    for step in reversed(steps):
        schedule.add_step(Transfer(t.dst, t.src, t.offset, t.length, "copy", t.nic) for t in step)
    return schedule


def _without(chunk: tuple[int, int], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) pieces of `chunk` outside the `holes` (ranges inside it)."""
    pieces, at = [], chunk[0]
    for offset, count in sorted(holes):
        if offset > at:
            pieces.append((at, offset - at))
        at = max(at, offset + count)
    end = chunk[0] + chunk[1]
    if end > at:
        pieces.append((at, end - at))
    return pieces
