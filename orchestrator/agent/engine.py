"""Executing one rank's plan over gRPC: streamed transfers into and out of one buffer.

Transfers stream chunks of their range through `Data.Push` calls: one call per partition,
peer and NIC for a whole iteration, carrying that partition's transfers to that peer step
after step (a call costs the agent far more than a chunk, and partitions would otherwise
multiply the calls). The receiver adds (or copies) each chunk straight into its buffer as
it arrives — no staging copy of the model.

Ordering is per range, chunk by chunk, as NCCL pipelines a ring by slices: a chunk of a
step-s send is written once every receive of an earlier step into its range has been
applied, and a received chunk of step s is applied once every earlier step's receive into,
and send out of, its range is done (until then the sender's stream waits, held back by
HTTP/2 flow control). That is exactly the schedule's semantics (sends of step s read the
buffer after all receives of steps < s), with no barrier between steps: a ring forwards a
chunk as soon as it is reduced instead of after the whole step's range (8 servers at 1
Gbit: ~2 ms saved per step; busbw by collective time 0.91-0.92 -> 0.94-0.95). A rank
writes its sends step after step, and each stream carries its partition's steps in order,
so a stream's head never waits on anything behind it. The calls' Acks are collected when
the allreduce ends.

Partitions start in priority order, with at most `credit_bytes` of them in flight. In a
lab each connection is paced at its fair share of the link (pacing.py), and every rank
opens its connections and enters the first iteration at the instant the driver names.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import grpc
import numpy as np

from orchestrator.agent.pacing import Pacer, connected
from orchestrator.agent.plan import PartitionPlan, Send, Step
from orchestrator.agent.proto import testbed_pb2 as pb

MAX_FRAME_BYTES = 2**20
RECONNECT_WAIT = 2.0  # seconds a paced send waits for its connection before writing anyway


# HTTP/2 keepalive on every data connection, so that a dead path (a cut link, a frozen peer)
# ends its calls with UNAVAILABLE instead of leaving a send blocked until TCP gives up
# (~15 minutes): a ping every 2 s while calls are open, the connection given up when one is
# unanswered for 10 s. Generous, because a ping queues behind what the socket and the link's
# queue hold (a few MB at 10 Mbit is seconds); the driver's stall detection names a stalled
# run sooner. Both ends are agents, so the server accepts pings that often (by default it
# answers more than two pings in 5 minutes without data with GOAWAY "too_many_pings").
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 10000),
    ("grpc.http2.max_pings_without_data", 0),  # a stream blocked on a dead path sends no data
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]


def channel_options(window_bytes: int = 0) -> list[tuple[str, int]]:
    """gRPC options of the agents' servers and channels.

    One stream must be able to fill a fast link on its own, so its HTTP/2 window must cover
    the path's bandwidth-delay product. With `window_bytes` 0 gRPC grows windows by BDP
    probing — but behind a deep link queue it measures the queueing delay too and lets every
    connection buffer megabytes (a mesh agent has N−1 of them: measured ~98 MiB beyond its
    gradient at 1 Gbit). Inside a lab the orchestrator knows the BDP and fixes the window
    instead (see `runner.lab_agents.flow_window`).

    HTTP/2 frames of up to 1 MiB instead of gRPC's 16 KiB: a 1 MiB chunk then crosses as one
    or two DATA frames instead of 64, each parsed and flow-controlled on its own. In a
    CPU-bound ring (8 agents, 1 Gbit, 2 cores, back to back) busbw went from 0.90-0.93 to
    0.93-0.945 × link over eight interleaved runs each (scratch); 256 KiB and 4 MiB frames
    did no better than 16 KiB, and memory did not change."""
    options = [
        # a run's own connections: gRPC would hand a new channel the still-open connection of
        # the last run's (its pacing rate set, its path hashed before the driver looked)
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 64 * 2**20),
        ("grpc.max_send_message_length", 64 * 2**20),
        ("grpc.http2.max_frame_size", MAX_FRAME_BYTES),
        *KEEPALIVE,
    ]
    if window_bytes:
        return options + [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_bytes)]
    return options + [("grpc.http2.bdp_probe", 1)]


@dataclass
class _Range:
    """What is left of one transfer of a step: elements [lo, hi) not yet received (or
    written). Chunks of a transfer travel in order on one stream, so `lo` only grows."""

    step: int
    peer: int
    lo: int
    hi: int
    start: int = -1  # where the transfer began (lo at first); -1: lo's first value

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.lo


@dataclass
class _PartitionState:
    receiving: dict[tuple[int, int, int], _Range] = field(default_factory=dict)  # (step, src, lo) → left
    sending: dict[tuple[int, int], _Range] = field(default_factory=dict)  # (step, send index) → unwritten

    def clear_to_send(self, step: int, lo: int, hi: int) -> bool:
        """Every receive of an earlier step into [lo, hi) has been applied."""
        return not _overlaps_earlier(self.receiving.values(), step, lo, hi)

    def clear_to_apply(self, step: int, lo: int, hi: int) -> bool:
        """... and every send of an earlier step out of [lo, hi) has been written."""
        return self.clear_to_send(step, lo, hi) and not _overlaps_earlier(self.sending.values(), step, lo, hi)


def _overlaps_earlier(left: Iterable[_Range], step: int, lo: int, hi: int) -> bool:
    """Is any range left of a step before `step` overlapping [lo, hi)?"""
    return any(r.step < step and r.lo < hi and lo < r.hi for r in left)


class Engine:
    """Runs allreduce iterations for one rank."""

    def __init__(
        self,
        run_id: str,
        rank: int,
        plans: list[PartitionPlan],
        buffer: np.ndarray,
        peers: dict[int, dict],
        chunk_bytes: int,
        credit_bytes: int,
        counters,
        window_bytes: int = 0,
        link_rate: float = 0.0,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.plans = plans
        self.buffer = buffer
        self.peers = peers  # rank → {"address": host:port, "by_nic": {nic: host:port}, "node": name}
        self.chunk_elements = max(1, chunk_bytes // buffer.itemsize)
        self.credit_bytes = credit_bytes
        self.counters = counters  # callable(peer_node, sent_bytes, received_bytes, nic=-1)
        self.options = channel_options(window_bytes)
        self.pacer = Pacer(link_rate)
        self.iteration = -1
        self.states: dict[int, _PartitionState] = {}
        self.changed = asyncio.Condition()
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.stubs: dict[str, grpc.aio.StreamUnaryMultiCallable] = {}
        self.streams: dict[tuple[int, int, int], tuple[grpc.aio.StreamUnaryCall, asyncio.Lock]] = {}
        self.unacknowledged: list[tuple[grpc.aio.StreamUnaryCall, int]] = []  # (call, destination rank)
        self.sent = 0
        self.received = 0
        # monotonic time this rank last moved data inside an allreduce (None outside one):
        # the driver's stall detection reads it through Status
        self.progressed_at: float | None = None

    def replan(self, plans: list[PartitionPlan], link_rate: float) -> None:
        """New shares for the same transfers, before the first iteration (a plan whose
        transfers differ would not match the peers')."""
        if self.iteration >= 0:
            raise RuntimeError("a plan can change only before the first iteration")
        if [(p.index, [(s.step, [(x.dst, x.offset, x.count) for x in s.sends]) for s in p.steps]) for p in plans] != \
                [(p.index, [(s.step, [(x.dst, x.offset, x.count) for x in s.sends]) for s in p.steps]) for p in self.plans]:
            raise ValueError("the new plan's transfers differ from the configured ones")
        self.plans = plans
        self.pacer = Pacer(link_rate, self.pacer.stale)

    # -- receiving (called by the Data servicer) ------------------------------------------
    async def accept(self, first: tuple[pb.Chunk, memoryview], rest) -> None:
        """Apply one incoming stream, each chunk once this rank has entered the chunk's step.

        `first` and the items of `rest` are (header, payload) pairs from `decode_chunk`.
        """
        if first[0].run_id != self.run_id:
            raise ValueError(f"chunk of run {first[0].run_id!r}, this agent runs {self.run_id!r}")
        peer = self._node(first[0].src)
        await self._accept_chunk(*first)
        count = first[0].count
        async for chunk in rest:
            await self._accept_chunk(*chunk)
            count += chunk[0].count
        self.received += count * self.buffer.itemsize
        self.counters(peer, 0, count * self.buffer.itemsize)

    async def _accept_chunk(self, head: pb.Chunk, payload: memoryview) -> None:
        await self._until(lambda: self._ready_for(head))
        state = self.states[head.partition]
        left = state.receiving.pop((head.step, head.src, head.offset))
        if head.offset + head.count > left.hi:
            raise ValueError(f"chunk [{head.offset}, +{head.count}) from rank {head.src} overruns its transfer")
        self._apply(head, payload)
        left.lo += head.count
        if left.lo < left.hi:
            if (left.step, left.peer, left.lo) in state.receiving:
                raise ValueError(f"rank {head.src} sends overlapping ranges in step {head.step}")
            state.receiving[(left.step, left.peer, left.lo)] = left
        await self._progressed()

    def _ready_for(self, chunk: pb.Chunk) -> bool:
        if chunk.iteration < self.iteration:
            raise ValueError(f"chunk for finished iteration {chunk.iteration}")
        if chunk.iteration > self.iteration:
            return False
        state = self.states.get(chunk.partition)
        if state is None or (chunk.step, chunk.src, chunk.offset) not in state.receiving:
            # a transfer's chunks come in order on one stream: the next one starts where
            # the transfer's unreceived range does
            raise ValueError(
                f"unexpected chunk: step {chunk.step}, partition {chunk.partition}, "
                f"[{chunk.offset}, +{chunk.count}) from rank {chunk.src}"
            )
        return state.clear_to_apply(chunk.step, chunk.offset, chunk.offset + chunk.count)

    async def _progressed(self) -> None:
        """Wake whoever waits in `_until`; note the time for stall detection."""
        self.progressed_at = time.monotonic()
        async with self.changed:
            self.changed.notify_all()

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` holds, re-checked whenever ranges or the iteration move."""
        if not ready():
            async with self.changed:
                await self.changed.wait_for(ready)

    def _apply(self, chunk: pb.Chunk, payload: memoryview) -> int:
        data = np.frombuffer(payload, dtype=self.buffer.dtype)
        if len(data) != chunk.count:
            raise ValueError(f"chunk carries {len(data)} elements, header says {chunk.count}")
        view = self.buffer[chunk.offset : chunk.offset + chunk.count]
        if chunk.copy:
            view[:] = data
        else:
            np.add(view, data, out=view)
        return chunk.count

    # -- sending --------------------------------------------------------------------------
    def _target(self, send: Send) -> str:
        """The peer's address on the NIC the transfer names."""
        peer = self.peers[send.dst]
        return peer["by_nic"].get(send.nic, peer["address"]) if send.nic >= 0 else peer["address"]

    def _push(self, target: str):
        """The Data.Push call towards `target`."""
        if target not in self.stubs:
            self.channels[target] = grpc.aio.insecure_channel(target, options=self.options)
            # requests are already-encoded Chunk messages (see encode_chunk)
            self.stubs[target] = self.channels[target].stream_unary(
                PUSH, request_serializer=None, response_deserializer=pb.Ack.FromString
            )
        return self.stubs[target]

    async def _send(self, partition: int, step: int, send: Send, key: tuple[int, int]) -> None:
        """Write one transfer's chunks into the partition's call to the peer (opened on first
        use), each once its range is ready; done when written — the range has been copied
        out of the buffer by then. `key` names the transfer's unwritten range in the state."""
        call, lock = self._stream(partition, send)
        state = self.states[partition]
        left = state.sending[key]
        target = self._target(send)
        if send.share < 1 and target not in self.pacer.fds:
            # its socket exists once connected (`connect` waited already; this is a reconnect)
            try:
                await asyncio.wait_for(self.channels[target].channel_ready(), RECONNECT_WAIT)
            except asyncio.TimeoutError:
                pass  # a peer that is gone: the write below says so
        self.pacer.begin(target, (partition, key), send.share)
        try:
            async with lock:  # two sends of one step to one peer address share the call
                for start in range(send.offset, send.offset + send.count, self.chunk_elements):
                    count = min(self.chunk_elements, send.offset + send.count - start)
                    await self._until(lambda: state.clear_to_send(step, start, start + count))
                    head = pb.Chunk(
                        run_id=self.run_id, iteration=self.iteration, partition=partition, step=step,
                        src=self.rank, offset=start, count=count, copy=send.copy,
                    )
                    try:
                        await call.write(encode_chunk(head, self.buffer[start : start + count]))
                    except Exception as exc:  # the call ended early
                        raise await self._refusal(call, send.dst, exc) from exc
                    left.lo = start + count
                    if left.lo >= left.hi:
                        del state.sending[key]
                    await self._progressed()
        finally:
            self.pacer.end(target, (partition, key))
        size = send.count * self.buffer.itemsize
        self.sent += size
        self.counters(self._node(send.dst), size, 0, send.nic)

    async def connect(self, timeout: float = 10.0) -> None:
        """Open the connection to every peer address the plans send to, before the first
        iteration (rather than 15 at once per rank inside it). A peer that does not answer
        in time is left to the first send to it, which reports it."""
        targets = {self._target(send) for plan in self.plans for step in plan.steps for send in step.sends}
        # before our own channels exist: whatever leads to these peers now is not this run's
        self.pacer.stale |= connected(targets - set(self.stubs))
        for target in targets:
            self._push(target)
        try:
            await asyncio.wait_for(asyncio.gather(*(self.channels[t].channel_ready() for t in targets)), timeout)
        except asyncio.TimeoutError:
            pass

    def _node(self, rank: int) -> str:
        return self.peers.get(rank, {}).get("node", str(rank))

    def _stream(self, partition: int, send: Send) -> tuple[grpc.aio.StreamUnaryCall, asyncio.Lock]:
        key = (partition, send.dst, send.nic)
        if key not in self.streams:
            self.streams[key] = (self._push(self._target(send))(), asyncio.Lock())
        return self.streams[key]

    async def _finish_streams(self, partition: int) -> None:
        for key in [key for key in self.streams if key[0] == partition]:
            call, _ = self.streams.pop(key)
            await call.done_writing()
            self.unacknowledged.append((call, key[1]))

    async def _acknowledged(self) -> None:
        while self.unacknowledged:  # each dropped once in: those left are what Status reports due
            call, dst = self.unacknowledged[0]
            try:
                ack = await call
            except grpc.aio.AioRpcError as exc:
                raise await self._refusal(call, dst, exc) from exc
            if not ack.ok:
                raise RuntimeError(f"rank {dst} ({self._node(dst)}) refused a transfer: {ack.error}")
            self.unacknowledged.pop(0)

    async def _refusal(self, call: grpc.aio.StreamUnaryCall, dst: int, exc: Exception) -> RuntimeError:
        """One line on why a call to `dst` ended early: the call's own status (a failed write
        only says "INTERNAL: Internal error from Core" where the call says, e.g., UNAVAILABLE:
        keepalive watchdog timeout), or the receiver's Ack."""
        def said(error: Exception) -> str:
            if isinstance(error, grpc.aio.AioRpcError):
                return f"{error.code().name}: {error.details()}"
            return f"{type(error).__name__}: {error}"

        try:
            ack = await asyncio.wait_for(asyncio.shield(call), 2.0)
            reason = ack.error if not ack.ok else said(exc)
        except grpc.aio.AioRpcError as failed:
            reason = said(failed)
        except Exception:  # noqa: BLE001 - not ended in time, or unreadable: the first error then
            reason = said(exc)
        return RuntimeError(f"sending to rank {dst} ({self._node(dst)}): {reason}")

    # -- one allreduce --------------------------------------------------------------------
    async def allreduce(self, iteration: int) -> None:
        async with self.changed:
            self.iteration = iteration
            self.states = {p.index: _PartitionState() for p in self.plans}
            for plan in self.plans:
                state = self.states[plan.index]
                for step in plan.steps:
                    for r in step.recvs:
                        if r.count:
                            if (step.step, r.src, r.offset) in state.receiving:
                                raise ValueError(f"plan receives twice from rank {r.src} at {r.offset} in step {step.step}")
                            state.receiving[(step.step, r.src, r.offset)] = _Range(step.step, r.src, r.offset, r.offset + r.count)
                    for i, x in enumerate(step.sends):
                        if x.count:
                            state.sending[(step.step, i)] = _Range(step.step, x.dst, x.offset, x.offset + x.count)
            self.changed.notify_all()
        self.progressed_at = time.monotonic()
        credit = asyncio.Condition()
        in_flight = [0]
        tasks = []

        async def run(plan: PartitionPlan, cost: int) -> None:
            try:
                await self._run_partition(plan)
            finally:
                async with credit:
                    in_flight[0] -= cost
                    credit.notify_all()

        for plan in sorted(self.plans, key=lambda p: (p.priority, p.index)):
            cost = plan.length * self.buffer.itemsize
            if self.credit_bytes:
                async with credit:
                    await credit.wait_for(lambda: in_flight[0] == 0 or in_flight[0] + cost <= self.credit_bytes)
                    in_flight[0] += cost
            tasks.append(asyncio.create_task(run(plan, cost)))
        try:
            await asyncio.gather(*tasks)
            await self._acknowledged()
            self.progressed_at = None
        except BaseException:
            self.progressed_at = None
            for task in tasks:
                task.cancel()
            for call, _ in [*self.streams.values(), *self.unacknowledged]:
                call.cancel()
            self.streams, self.unacknowledged = {}, []
            raise

    async def _run_partition(self, plan: PartitionPlan) -> None:
        state = self.states[plan.index]
        for step in plan.steps:
            await self._send_all(plan.index, step)
        await self._finish_streams(plan.index)
        await self._until(lambda: not state.receiving)

    async def _send_all(self, partition: int, step: Step) -> None:
        """A step's sends, all at once, as the schedule allows and the cost model assumes.

        They used to go one peer at a time per NIC, staggered by rank, to bound the streams
        being written: in step that is as fast, but ranks drift apart, and then some
        downlinks carried two flows while others idled. HiPS on bcube,4,1 at 100 Mbit, 12.5
        MB: 1.70-1.82 × the model's time one at a time; 1.35-1.45 × all at once; 1.10-1.12 ×
        once all ranks also start together (bench/fidelity.py). Memory: a mesh rank writes
        N−1 streams at once (95 MiB beyond the gradient at 16 ranks, against 90 before).
        A stream carries its transfers in step order because steps are written in turn."""
        await asyncio.gather(*(self._send(partition, step.step, send, (step.step, i))
                               for i, send in enumerate(step.sends) if send.count))

    # -- what a stalled rank waits for (Status) --------------------------------------------
    def stalled_seconds(self) -> float:
        """Seconds since this rank last moved data in the current allreduce (0 outside one)."""
        return 0.0 if self.progressed_at is None else time.monotonic() - self.progressed_at

    def pending(self, limit: int = 64) -> list[pb.Pending]:
        """The transfers of this iteration not yet done, earliest steps first: for each,
        whether this rank could move its next chunk now (`ready`: then it waits on the peer
        or the path between them, not on its own earlier steps)."""
        found = []
        for partition, state in self.states.items():
            for r in state.receiving.values():
                hi = min(r.hi, r.lo + self.chunk_elements)
                found.append(pb.Pending(kind="receive", peer=r.peer, step=r.step, partition=partition,
                                        offset=r.start, end=r.hi, done=r.lo,
                                        ready=state.clear_to_apply(r.step, r.lo, hi)))
            for (step, _), r in state.sending.items():
                hi = min(r.hi, r.lo + self.chunk_elements)
                found.append(pb.Pending(kind="send", peer=r.peer, step=step, partition=partition, offset=r.start,
                                        end=r.hi, done=r.lo, ready=state.clear_to_send(step, r.lo, hi)))
        if not found and self.progressed_at is not None:  # all moved: the receivers' Acks are due
            found = [pb.Pending(kind="ack", peer=dst, ready=True) for _, dst in self.unacknowledged]
        found.sort(key=lambda p: (p.step, p.kind != "receive", p.peer))
        return found[:limit]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        # a closed channel's connection lives as long as a call object on it does
        self.channels.clear()
        self.stubs.clear()
        self.streams.clear()
        self.unacknowledged.clear()


PUSH = "/testbed.Data/Push"
_DATA_KEY = b"\x4a"  # field 9 (`data`), wire type 2 (length-delimited)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def decode_chunk(raw: bytes) -> tuple[pb.Chunk, memoryview]:
    """(header, payload view) of an encoded Chunk, without copying the payload (protobuf's
    parser would copy it into a new bytes object). Accepts any valid encoding, in any
    field order, from any client."""
    view, pos, header, payload = memoryview(raw), 0, [], memoryview(b"")
    while pos < len(raw):
        start = pos
        key, pos = _read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire == 2:
            length, pos = _read_varint(raw, pos)
            if key >> 3 == 9:
                payload = view[pos : pos + length]
                pos += length
                continue
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} in a Chunk")
        header.append(raw[start:pos])
    return pb.Chunk.FromString(b"".join(header)), payload


def _padded_varint(value: int, width: int) -> bytes:
    """`value` as a varint of exactly `width` bytes (≤ 5: continuation bytes carrying
    zeros, a valid encoding that protobuf's parsers accept up to 32 bits)."""
    out = bytearray(_varint(value))
    if len(out) > width:
        raise ValueError(f"{value} does not fit a {width}-byte varint")
    out[-1] |= 0x80
    out += b"\x80" * (width - len(out) - 1) + b"\x00"
    return bytes(out)


_COPY_KEY = b"\x40"  # field 8 (`copy`), wire type 0 (varint)
PAYLOAD_OFFSET = 8  # where an encoded chunk's payload starts: 8-byte aligned, as the message is


def encode_chunk(head: pb.Chunk, data: np.ndarray) -> bytes:
    """The protobuf encoding of `head` with `data` as its `data` field, built with a single
    copy out of the buffer (a Chunk built and serialised by protobuf copies twice; at
    several Gbit/s through 2 cores that matters). Receivers parse it as a plain Chunk.

    The payload starts at byte 8: `copy` (2 bytes), then `data`'s key and its length as a
    5-byte varint, then the payload, then the other fields. A received message is a fresh
    bytes object whose data is 8-byte aligned, so the payload is too, and numpy adds it
    without first copying it into aligned buffers (it did, for ~4 % of the agents' copying
    in a ring)."""
    view = memoryview(np.ascontiguousarray(data)).cast("B")
    # `copy` may come again in the other fields, with the same value (the last one counts)
    return b"".join((_COPY_KEY, b"\x01" if head.copy else b"\x00", _DATA_KEY, _padded_varint(view.nbytes, 5), view,
                     head.SerializeToString()))
