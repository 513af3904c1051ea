"""The tcp transport's writes: made by the event loop without blocking it, whole, in the
order they were asked, and failed with the connection's reason when it ends meanwhile."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from orchestrator.agent.transports.tcp import _Connection


def _pair(send_buffer: int = 16 * 1024) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
    a.setblocking(False)
    return a, b


def _connection(sock: socket.socket) -> _Connection:
    connection = _Connection("peer:1", "run", 0)
    connection.sock = sock
    return connection


def test_frames_larger_than_the_socket_takes_arrive_whole_and_in_the_order_they_were_written():
    a, b = _pair()
    frames = [bytes([i]) * (200_000 + i) for i in range(4)]  # each many times the socket's buffer
    received = bytearray()
    total = sum(map(len, frames))

    def reader() -> None:
        while len(received) < total:
            data = b.recv(65536)
            if not data:
                return
            received.extend(data)

    async def scenario() -> list[int]:
        connection = _connection(a)
        ticks = []

        async def tick() -> None:  # the loop keeps running while writes wait for room
            while len(ticks) < 1000 and len(received) < total:
                ticks.append(1)
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        await asyncio.gather(*(connection.write([frame]) for frame in frames))
        ticker.cancel()
        return ticks

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        ticks = asyncio.run(scenario())
    finally:
        thread.join(10)
        a.close()
        b.close()
    assert bytes(received) == b"".join(frames)
    assert len(ticks) > 1  # the loop ran while the writes waited


def test_a_write_waiting_for_room_fails_with_the_reason_the_connection_ended():
    a, b = _pair()

    async def scenario() -> None:
        connection = _connection(a)
        write = asyncio.create_task(connection.write([b"x" * 1_000_000]))  # nobody reads: it waits
        for _ in range(20):
            await asyncio.sleep(0)
        assert not write.done()
        connection._ended("the peer refused: test")
        with pytest.raises(ConnectionError, match="the peer refused: test"):
            await asyncio.wait_for(write, 5)

    try:
        asyncio.run(scenario())
    finally:
        a.close()
        b.close()


def test_a_write_cancelled_in_the_middle_of_a_frame_ends_the_connection_and_leaves_no_callback():
    a, b = _pair()
    errors = []

    async def scenario() -> _Connection:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(context))
        connection = _connection(a)
        write = asyncio.create_task(connection.write([b"x" * 1_000_000]))  # part of it goes, then it waits
        for _ in range(20):
            await asyncio.sleep(0)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        b.setblocking(False)
        while True:  # the reader drains: the socket turns writable, and no stale callback may fire
            try:
                if not b.recv(1 << 20):
                    break
            except BlockingIOError:
                break
        for _ in range(20):
            await asyncio.sleep(0.001)
        with pytest.raises(ConnectionError, match="cancelled in the middle of a frame"):
            await connection.write([b"next"])
        return connection

    try:
        asyncio.run(scenario())
    finally:
        a.close()
        b.close()
    assert errors == []
