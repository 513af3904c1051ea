"""Executing one rank's plan over gRPC: streamed transfers into and out of one buffer.

Transfers stream chunks of their range through `Data.Push` calls: one call per partition,
peer and NIC for a whole iteration, carrying that partition's transfers to that peer step
after step (a call costs the agent far more than a chunk, and partitions would otherwise
multiply the calls). The receiver adds (or copies) each chunk straight into its buffer as
it arrives — no staging copy of the model. A partition moves through its steps in order: a
rank enters step s once its sends of earlier steps are written and their receives are
done, and a receiver applies a chunk of step s only after it has entered step s (until
then the sender's stream waits, held back by HTTP/2 flow control). Each stream carries its
partition's steps in order, so its head is always the earliest step the receiver still
needs. That is exactly the schedule's semantics, with no global barrier; the calls' Acks
are collected when the allreduce ends.

Partitions start in priority order, with at most `credit_bytes` of them in flight.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import numpy as np

from orchestrator.agent.plan import PartitionPlan, Send, Step
from orchestrator.agent.proto import testbed_pb2 as pb

SENDS_PER_NIC = 1


def channel_options(window_bytes: int = 0) -> list[tuple[str, int]]:
    """gRPC options of the agents' servers and channels.

    One stream must be able to fill a fast link on its own, so its HTTP/2 window must cover
    the path's bandwidth-delay product. With `window_bytes` 0 gRPC grows windows by BDP
    probing — but behind a deep link queue it measures the queueing delay too and lets every
    connection buffer megabytes (a mesh agent has N−1 of them: measured ~98 MiB beyond its
    gradient at 1 Gbit). Inside a lab the orchestrator knows the BDP and fixes the window
    instead (see `runner.lab_agents.flow_window`)."""
    options = [
        ("grpc.max_receive_message_length", 64 * 2**20),
        ("grpc.max_send_message_length", 64 * 2**20),
    ]
    if window_bytes:
        return options + [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_bytes)]
    return options + [("grpc.http2.bdp_probe", 1)]


@dataclass
class _PartitionState:
    entered_step: int = -1  # schedule step number entered (-1: not started)
    remaining: dict[int, int] = field(default_factory=dict)  # step → elements still to receive
    received: dict[int, asyncio.Event] = field(default_factory=dict)


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
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.plans = plans
        self.buffer = buffer
        self.peers = peers  # rank → {"address": host:port, "by_nic": {nic: host:port}, "node": name}
        self.chunk_elements = max(1, chunk_bytes // buffer.itemsize)
        self.credit_bytes = credit_bytes
        self.counters = counters  # callable(peer_node, sent_bytes, received_bytes)
        self.options = channel_options(window_bytes)
        self.iteration = -1
        self.states: dict[int, _PartitionState] = {}
        self.changed = asyncio.Condition()
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.stubs: dict[str, grpc.aio.StreamUnaryMultiCallable] = {}
        self.streams: dict[tuple[int, int, int], tuple[grpc.aio.StreamUnaryCall, asyncio.Lock]] = {}
        self.unacknowledged: list[tuple[grpc.aio.StreamUnaryCall, int]] = []  # (call, destination rank)
        self.sent = 0
        self.received = 0

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
        if not self._ready_for(head):
            async with self.changed:
                await self.changed.wait_for(lambda: self._ready_for(head))
        state = self.states[head.partition]
        self._apply(head, payload)
        state.remaining[head.step] -= head.count
        if state.remaining[head.step] <= 0:
            state.received[head.step].set()

    def _ready_for(self, chunk: pb.Chunk) -> bool:
        if chunk.iteration < self.iteration:
            raise ValueError(f"chunk for finished iteration {chunk.iteration}")
        if chunk.iteration > self.iteration:
            return False
        state = self.states.get(chunk.partition)
        return state is not None and state.entered_step >= chunk.step

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
    def _push(self, send: Send):
        """The Data.Push call towards the peer's address on the NIC the transfer names."""
        peer = self.peers[send.dst]
        target = peer["by_nic"].get(send.nic, peer["address"]) if send.nic >= 0 else peer["address"]
        if target not in self.stubs:
            self.channels[target] = grpc.aio.insecure_channel(target, options=self.options)
            # requests are already-encoded Chunk messages (see encode_chunk)
            self.stubs[target] = self.channels[target].stream_unary(
                PUSH, request_serializer=None, response_deserializer=pb.Ack.FromString
            )
        return self.stubs[target]

    async def _send(self, partition: int, step: int, send: Send) -> None:
        """Write one transfer's chunks into the partition's call to the peer (opened on first
        use); done when written — the range has been copied out of the buffer by then."""
        call, lock = self._stream(partition, send)
        async with lock:  # with SENDS_PER_NIC > 1, two sends of one step could share the call
            for start in range(send.offset, send.offset + send.count, self.chunk_elements):
                count = min(self.chunk_elements, send.offset + send.count - start)
                head = pb.Chunk(
                    run_id=self.run_id, iteration=self.iteration, partition=partition, step=step,
                    src=self.rank, offset=start, count=count, copy=send.copy,
                )
                try:
                    await call.write(encode_chunk(head, self.buffer[start : start + count]))
                except Exception as exc:  # the call ended early
                    raise await self._refusal(call, send.dst, exc) from exc
        size = send.count * self.buffer.itemsize
        self.sent += size
        self.counters(self._node(send.dst), size, 0)

    def _node(self, rank: int) -> str:
        return self.peers.get(rank, {}).get("node", str(rank))

    def _stream(self, partition: int, send: Send) -> tuple[grpc.aio.StreamUnaryCall, asyncio.Lock]:
        key = (partition, send.dst, send.nic)
        if key not in self.streams:
            self.streams[key] = (self._push(send)(), asyncio.Lock())
        return self.streams[key]

    async def _finish_streams(self, partition: int) -> None:
        for key in [key for key in self.streams if key[0] == partition]:
            call, _ = self.streams.pop(key)
            await call.done_writing()
            self.unacknowledged.append((call, key[1]))

    async def _acknowledged(self) -> None:
        calls, self.unacknowledged = self.unacknowledged, []
        for call, dst in calls:
            try:
                ack = await call
            except grpc.aio.AioRpcError as exc:
                raise await self._refusal(call, dst, exc) from exc
            if not ack.ok:
                raise RuntimeError(f"rank {dst} ({self._node(dst)}) refused a transfer: {ack.error}")

    async def _refusal(self, call: grpc.aio.StreamUnaryCall, dst: int, exc: Exception) -> RuntimeError:
        """One line on why a call to `dst` ended early: gRPC's status, or the receiver's Ack."""
        if isinstance(exc, grpc.aio.AioRpcError):
            reason = f"{exc.code().name}: {exc.details()}"
        else:
            try:
                ack = await call
                reason = ack.error if not ack.ok else f"{type(exc).__name__}: {exc}"
            except grpc.aio.AioRpcError as failed:
                reason = f"{failed.code().name}: {failed.details()}"
        return RuntimeError(f"sending to rank {dst} ({self._node(dst)}): {reason}")

    # -- one allreduce --------------------------------------------------------------------
    async def allreduce(self, iteration: int) -> None:
        async with self.changed:
            self.iteration = iteration
            self.states = {p.index: _PartitionState() for p in self.plans}
            for plan in self.plans:
                state = self.states[plan.index]
                for step in plan.steps:
                    state.remaining[step.step] = step.recv
                    state.received[step.step] = asyncio.Event()
                    if step.recv == 0:
                        state.received[step.step].set()
            self.changed.notify_all()
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
        except BaseException:
            for task in tasks:
                task.cancel()
            for call, _ in [*self.streams.values(), *self.unacknowledged]:
                call.cancel()
            self.streams, self.unacknowledged = {}, []
            raise

    async def _run_partition(self, plan: PartitionPlan) -> None:
        state = self.states[plan.index]
        for step in plan.steps:
            async with self.changed:
                state.entered_step = step.step
                self.changed.notify_all()
            await asyncio.gather(self._send_all(plan.index, step), state.received[step.step].wait())
        await self._finish_streams(plan.index)

    async def _send_all(self, partition: int, step: Step) -> None:
        """A step's sends, at most SENDS_PER_NIC at once on each NIC, staggered by rank.

        Each stream being written holds gRPC buffers at both ends (a mesh step has N−1
        sends): bounding them bounds memory. A send is done once written, so one at a time
        already keeps the NIC busy: on mesh, 8 servers of a star at 1 Gbit, one stream per
        NIC was as fast as two and peaked ~5 MiB lower (72 vs 76–78 MiB beyond the
        gradient). Starting each rank at the next rank spreads the receivers. Only sends of
        one step share the bound, so no transfer can wait on a slot that a later step holds
        (no deadlock)."""
        by_nic: dict[int, list[Send]] = {}
        ranks = len(self.peers)
        for send in sorted(step.sends, key=lambda s: (s.dst - self.rank) % ranks):
            by_nic.setdefault(send.nic, []).append(send)

        async def lane(sends: list[Send]) -> None:
            for send in sends:
                await self._send(partition, step.step, send)

        lanes = []
        for sends in by_nic.values():
            lanes += [lane(sends[i::SENDS_PER_NIC]) for i in range(min(SENDS_PER_NIC, len(sends)))]
        await asyncio.gather(*lanes)

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        self.channels.clear()
        self.stubs.clear()


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
