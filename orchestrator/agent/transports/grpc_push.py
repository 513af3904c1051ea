"""The gRPC transport: one Data.Push call per partition, peer and NIC for an iteration.

A call carries that partition's chunks to the peer step after step; HTTP/2 flow control
holds a sender back while the receiver waits to apply a chunk (agent/engine.py, `accept`).
The receiver's Ack, collected when the allreduce ends, says whether it applied them all.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.transports import register

MAX_FRAME_BYTES = 2**20


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
    instead (see `deploy.lab_agents.flow_window`).

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


class GrpcStream:
    def __init__(self, call: grpc.aio.StreamUnaryCall) -> None:
        self.call = call

    async def write(self, head: pb.Chunk, data: np.ndarray) -> None:
        await self.call.write(encode_chunk(head, data))

    async def finish(self) -> None:
        await self.call.done_writing()

    async def acknowledged(self) -> str:
        ack = await self.call  # a call that failed raises: the engine asks `reason`
        return "" if ack.ok else ack.error

    async def reason(self, error: Exception) -> str:
        """The call's own status (a failed write only says "INTERNAL: Internal error from
        Core" where the call says, e.g., UNAVAILABLE: keepalive watchdog timeout), or the
        receiver's Ack."""
        def said(exc: Exception) -> str:
            if isinstance(exc, grpc.aio.AioRpcError):
                return f"{exc.code().name}: {exc.details()}"
            return f"{type(exc).__name__}: {exc}"

        try:
            ack = await asyncio.wait_for(asyncio.shield(self.call), 2.0)
            return ack.error if not ack.ok else said(error)
        except grpc.aio.AioRpcError as failed:
            return said(failed)
        except Exception:  # noqa: BLE001 - not ended in time, or unreadable: the first error then
            return said(error)

    def cancel(self) -> None:
        self.call.cancel()


class GrpcSender:
    """A channel per peer address; a call per stream."""

    def __init__(self, run_id: str, rank: int, window_bytes: int = 0) -> None:
        self.options = channel_options(window_bytes)
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.stubs: dict[str, grpc.aio.StreamUnaryMultiCallable] = {}

    def _push(self, target: str) -> grpc.aio.StreamUnaryMultiCallable:
        if target not in self.stubs:
            self.channels[target] = grpc.aio.insecure_channel(target, options=self.options)
            # requests are already-encoded Chunk messages (see encode_chunk)
            self.stubs[target] = self.channels[target].stream_unary(
                PUSH, request_serializer=None, response_deserializer=pb.Ack.FromString
            )
        return self.stubs[target]

    async def connect(self, targets: set[str], timeout: float) -> None:
        for target in targets:
            self._push(target)
        try:
            await asyncio.wait_for(asyncio.gather(*(self.channels[t].channel_ready() for t in targets)), timeout)
        except asyncio.TimeoutError:
            pass

    def connected(self, target: str) -> bool:
        return target in self.channels and \
            self.channels[target].get_state() == grpc.ChannelConnectivity.READY

    async def ready(self, target: str, timeout: float) -> None:
        self._push(target)
        try:
            await asyncio.wait_for(self.channels[target].channel_ready(), timeout)
        except asyncio.TimeoutError:
            pass  # a peer that is gone: the write says so

    def stream(self, target: str) -> GrpcStream:
        return GrpcStream(self._push(target)())

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        # a closed channel's connection lives as long as a call object on it does
        self.channels.clear()
        self.stubs.clear()


# its sockets are gRPC's, autotuned by the kernel: 2.6 MB on the connections of a 50 Mbit torus
register("grpc", GrpcSender, 0, "gRPC Data.Push streams (HTTP/2)", holds_messages=True, send_buffer=3 * 2**20)
