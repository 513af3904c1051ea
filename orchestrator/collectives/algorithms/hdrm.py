"""HDRM (EFLOPS, HPCA 2020): recursive halving-doubling on a BiGraph with a rank mapping
that keeps every step free of switch-link contention.

BiGraph: q = n/2 upper and q lower switches, every upper wired to every lower, m servers
per switch, N = m·n. Halving-doubling runs over virtual ranks v = 0..N−1 (reduce-scatter
step t: partner v XOR 2^t, t = 0, 1, …, halving the held segment; allgather reversed), and
the mapping below places virtual ranks on servers.

Mapping (N a power of two, so m = 2^a and q = 2^b): write v = 2i + e (e = bit 0) and
i = g·q + s with g < m ("virtual group", the high bits) and s < q. Then
  half(v)  = upper if e XOR popcount(i) is even, else lower;
  lower:   switch sl{s},              node g;
  upper:   switch su{(s − g) mod q},  node g   (upper ranks rotated by (q − g) mod q).
So the pair (2i, 2i+1) sits on an upper/lower pair and group g holds node g of every switch
(REFERENCE's recollection, with the orientation flipped by popcount(i) parity).
Why it works: flipping any one bit of v flips e or the parity of i, so every partner is in
the other half and every flow crosses exactly one upper–lower link (no same-half flow, which
would need two switch hops). Fix a step (the flipped bit) and a direction; a flow's link
(su{U}, sl{L}) names its source: the lower end's s is L, the upper end's s is L or L XOR the
flipped bit (known from the step), the upper end's g ≡ s − U (mod q) is unique because
g < m ≤ q, the other end's i follows from the step, and e from which end is upper. So the
N/2 flows of one direction use N/2 distinct links of the q² available: one flow per link
and direction per step, whenever m ≤ q = n/2 (for m > q, N/2 > q² flows cannot fit).
Fallbacks: m > n/2 with N a power of two keeps the same mapping (well defined for any m) and
runs plain halving-doubling over it: flows still cross halves directly but links are shared.
N not a power of two: generic halving-doubling (the first 2r = 2(N − 2^⌊log2 N⌋) ranks pair
up, odd into even, before and after) over servers interleaved upper/lower switch by switch;
no link property is claimed.
Cost: 2·log2 N steps (+2 when N is not a power of two); each rank sends 2(N−1)/N·S when N is
a power of two. One NIC per server, so `nic` stays None.
"""

from __future__ import annotations

from orchestrator.collectives.algorithms.halving_doubling import transfers as hd_transfers
from orchestrator.collectives.algorithms.levels import topology_ranks
from orchestrator.collectives.context import Context
from orchestrator.collectives.schedule import Schedule, Transfer, chunks
from orchestrator.topology import Topology


def is_power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def virtual_servers(topology: Topology) -> list[str]:
    """Server name of each virtual rank (the mapping of the module docstring)."""
    upper, lower = topology.facts["upper"], topology.facts["lower"]
    q, m = len(upper), topology.facts["servers_per_switch"]
    total = 2 * q * m
    if not is_power_of_two(total):
        # generic HD: no structure to exploit; alternate the halves switch by switch
        return [f"{side[i]}h{j}" for i in range(q) for j in range(m) for side in (upper, lower)]
    names = []
    for v in range(total):
        e, i = v & 1, v >> 1
        g, s = divmod(i, q)
        if (e + bin(i).count("1")) % 2 == 0:
            names.append(f"{upper[(s - g) % q]}h{g}")
        else:
            names.append(f"{lower[s]}h{g}")
    return names


def _halving_doubling(ranks: list[int], offset: int, length: int) -> list[list[Transfer]]:
    """Recursive halving-doubling among `ranks` (a power of two of them): reduce-scatter with
    partner v XOR 2^t for t = 0, 1, … (the lower of the two keeps the first half), then the
    allgather in reverse."""
    p = len(ranks)
    segment = [(offset, length)] * p
    scatter, history = [], []
    t = 1
    while t < p:
        history.append(list(segment))
        step = []
        for v in range(p):
            first, second = chunks(*segment[v], 2)
            keep, give = (first, second) if v & t == 0 else (second, first)
            step.append(Transfer(ranks[v], ranks[v ^ t], *give, "reduce"))
            segment[v] = keep
        scatter.append(step)
        t <<= 1
    gather = []
    for before in reversed(history):
        t >>= 1
        gather.append([Transfer(ranks[v], ranks[v ^ t], *segment[v], "copy") for v in range(p)])
        segment = before
    return scatter + gather


transfers = hd_transfers  # halving-doubling over a rank mapping: the same count


def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
    length = size - offset if length is None else length
    topology, ranks = topology_ranks(ctx, "hdrm", ("bigraph",))
    order = [ranks[name] for name in virtual_servers(topology)]
    total = len(order)
    q, m = len(topology.facts["upper"]), topology.facts["servers_per_switch"]
    exact = is_power_of_two(total) and m <= q
    schedule = Schedule("hdrm", ctx.workers, size, meta={"order": order, "contention_free": exact})
    if total < 2:
        return schedule
    p = 1 << (total.bit_length() - 1)
    extra = total - p
    # non-powers of two: rank 2i+1 (i < extra) folds into 2i before HD and is served after
    core = [order[2 * i] for i in range(extra)] + order[2 * extra :]
    fold = [Transfer(order[2 * i + 1], order[2 * i], offset, length, "reduce") for i in range(extra)]
    unfold = [Transfer(order[2 * i], order[2 * i + 1], offset, length, "copy") for i in range(extra)]
    schedule.add_step(fold)
    for step in _halving_doubling(core, offset, length):
        schedule.add_step(step)
    schedule.add_step(unfold)
    return schedule
