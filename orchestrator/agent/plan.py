"""One rank's share of a collective: what it sends and how much it receives, step by step.

The orchestrator builds the schedules once (orchestrator.collectives) and gives every agent
only its own part, as JSON, so agents need no topology or algorithm code:

    {"partitions": [{"index": 0, "offset": 0, "length": 1000, "priority": 0,
                     "steps": [{"step": 3, "send": [[dst, offset, count, copy, nic, share?]],
                                "recv": [[src, offset, count]]}]}],
     "link_bytes_per_second": 12_380_000}   # only when the run is paced

`step` is the step's number in the partition's schedule; a rank lists only the steps it
takes part in. `recv` lists the ranges it receives in that step (the agent orders each
chunk after the earlier steps' work on the same range); `nic` is -1 when the schedule
leaves the choice to routing; `share`, when present, is the transfer's fair share of a link
(cost/shares.py), which the agent paces its connection at (pacing.py) against
`link_bytes_per_second`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Bytes per streamed message of a transfer. Every message costs the agent fixed Python and
# gRPC work, and every message in flight is held several times over by gRPC and the agent
# (encoded, in gRPC's buffers, received, waiting to be applied), once per stream. So a rank
# that streams to and from few peers takes big messages, one with many peers small ones: a
# budget of MESSAGE_BUDGET bytes over its streams, between the two bounds.
MESSAGE_BUDGET = 2 * 2**20
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 64 * 1024, 2**20
DEFAULT_CHUNK_BYTES = 512 * 1024  # when a run names none (a driver always does)


def chunk_bytes(schedules, credit_bytes: int = 0, itemsize: int = 4, transport: str = "") -> int:
    """Message size for a run of [(Partition, Schedule)] over `transport` (default: the
    default transport) with a credit window of `credit_bytes` (0: every partition at once).

    A transport that reads chunks straight into the buffer (tcp) holds none in flight: its
    chunks are MAX_CHUNK_BYTES, as every chunk costs the agent fixed work (a pipelined ring
    of 4 on loopback: 2.74 core-s per GB sent with 256 KiB chunks, 1.78 with 1 MiB; 1.77
    unpipelined). gRPC's are MESSAGE_BUDGET over the most streams a rank
    can have coming in at a time, as a power of two within [MIN_CHUNK_BYTES,
    MAX_CHUNK_BYTES]. Streams at a time are a rank's distinct sources over the whole run
    (agents order transfers per range, so receives of successive steps overlap) times the
    partitions in flight.

    Measured, peak memory beyond the gradient and time per allreduce / the model's: in a
    CPU-bound ring (8 agents, 1 Gbit, 2 cores) 1 MiB messages were ~7 % faster than 512 KiB;
    a mesh of 16 on bcube,4,1 at 100 Mbit (15 streams each way) took 97 MiB and 1.20 × with
    512 KiB messages, 80 MiB and 1.15 × with 128 KiB; a binomial tree's root (3 children)
    peaked at 76.6 MiB with 1 MiB messages, 68 with 512 KiB."""
    from orchestrator.agent import transports  # the agent's own table

    if not transports.get(transport).holds_messages:
        return MAX_CHUNK_BYTES
    sources: dict[int, set[int]] = {}
    for _, schedule in schedules:
        for _, transfer in schedule.transfers():
            sources.setdefault(transfer.dst, set()).add(transfer.src)
    in_flight = len(schedules)
    if credit_bytes and schedules:
        smallest = min(part.length for part, _ in schedules) * itemsize
        in_flight = min(in_flight, max(1, credit_bytes // max(1, smallest)))
    streams = max((len(peers) for peers in sources.values()), default=1) * in_flight
    size = MAX_CHUNK_BYTES
    while size > MIN_CHUNK_BYTES and size * streams > MESSAGE_BUDGET:
        size //= 2
    return size


@dataclass(frozen=True)
class Send:
    dst: int
    offset: int
    count: int
    copy: bool
    nic: int  # -1: any
    share: float = 1.0  # of the link this transfer's connection may use (agent/pacing.py); 1: unpaced


@dataclass(frozen=True)
class Recv:
    src: int
    offset: int
    count: int


@dataclass
class Step:
    step: int
    sends: list[Send]
    recvs: list[Recv]
    # rendezvous (Schedule.rendezvous): the ranks whose READY this step's sends to them wait
    # for, and those this rank says READY to once it has entered the step
    wait: frozenset = frozenset()
    say: frozenset = frozenset()


@dataclass
class PartitionPlan:
    index: int
    offset: int
    length: int
    priority: int
    steps: list[Step]


def chunk_bytes_for(transport: str):
    """chunk_bytes as a function of (schedules, credit_bytes) for `transport`: what the cost
    model's compile_run takes."""
    return lambda schedules, credit_bytes: chunk_bytes(schedules, credit_bytes, transport=transport)


def peers(plans: list[PartitionPlan]) -> int:
    """How many other ranks a rank's plan sends to or receives from."""
    return len({x.dst for p in plans for s in p.steps for x in s.sends}
               | {x.src for p in plans for s in p.steps for x in s.recvs})


def build_rank_plans(schedules, ranks: int, shares: dict | None = None, link_rate: float = 0.0,
                     rendezvous: bool = False) -> list[str]:
    """JSON plans for ranks 0..ranks-1 from [(Partition, Schedule)] in priority order.

    `shares`: {(partition index, step, Transfer): share of the link} for transfers to pace
    (cost.shares), `link_rate` the payload bytes per second of one link; a send with a
    share under 1 carries it as a sixth field. `rendezvous` (the compiled run's, as its
    transport does and the model predicts): each step names the ranks its sends wait for
    (`wait`) and those it says READY to (`say`), from Schedule.rendezvous."""
    shares = shares or {}
    plans: list[list[dict]] = [[] for _ in range(ranks)]
    for index, (part, schedule) in enumerate(schedules):
        per_rank: list[dict[int, dict]] = [{} for _ in range(ranks)]
        for step_no, src, dst in schedule.rendezvous() if rendezvous else ():
            per_rank[src].setdefault(step_no, {"step": step_no, "send": [], "recv": []}).setdefault("wait", []).append(dst)
            per_rank[dst].setdefault(step_no, {"step": step_no, "send": [], "recv": []}).setdefault("say", []).append(src)
        for step_no, transfer in schedule.transfers():
            send_step = per_rank[transfer.src].setdefault(step_no, {"step": step_no, "send": [], "recv": []})
            send = [transfer.dst, transfer.offset, transfer.length, int(transfer.op == "copy"),
                    -1 if transfer.nic is None else transfer.nic]
            share = shares.get((index, step_no, transfer), 1.0)
            send_step["send"].append(send + [round(share, 6)] if share < 1 else send)
            recv_step = per_rank[transfer.dst].setdefault(step_no, {"step": step_no, "send": [], "recv": []})
            recv_step["recv"].append([transfer.src, transfer.offset, transfer.length])
        for rank in range(ranks):
            plans[rank].append(
                {"index": index, "offset": part.offset, "length": part.length, "priority": part.priority,
                 "steps": [per_rank[rank][s] for s in sorted(per_rank[rank])]}
            )
    pacing = {"link_bytes_per_second": link_rate} if link_rate and shares else {}
    return [json.dumps({"partitions": p} | pacing, separators=(",", ":")) for p in plans]


def parse(text: str) -> list[PartitionPlan]:
    data = json.loads(text)
    return [
        PartitionPlan(
            p["index"], p["offset"], p["length"], p["priority"],
            [Step(s["step"], [Send(d, o, c, bool(cp), nic, *share) for d, o, c, cp, nic, *share in s["send"]],
                  [Recv(src, o, c) for src, o, c in s["recv"]], frozenset(s.get("wait", ())),
                  frozenset(s.get("say", ())))
             for s in p["steps"]],
        )
        for p in data["partitions"]
    ]


def link_rate(text: str) -> float:
    """The payload bytes per second of one link a plan paces against (0: no pacing)."""
    return float(json.loads(text).get("link_bytes_per_second", 0.0))
