"""The tcp transport: one plain TCP connection per (peer, NIC), at the kernel's cost.

Why: through gRPC each byte cost the agents ~2.8 × what it costs the kernel (issue 28:
HTTP/2 framing, a copy into a message, the interpreter around every chunk), and a ring of
8 at 1 Gbit was CPU-bound on 2 cores at 0.80 of the link. Here a chunk is a 32-byte header
and its payload: the sender's thread writes it straight out of the gradient buffer with one
`sendmsg`, the receiver's thread reads it straight into the buffer (a copy) or into a
scratch slice that numpy adds in (a reduction), both outside the interpreter lock. The
event loop only answers "may this chunk land now?" and records that it did — the engine's
per-range ordering, pacing (SO_MAX_PACING_RATE on these sockets), stall reporting and
counters are the same as over gRPC.

Ordering on a shared connection: the partitions of a run to one peer share its connection,
so a chunk that may not land yet (its range still waits on an earlier step) must not hold
back the chunks behind it, of other partitions, that may: waiting there could close a
circle of waits between ranks. Such a chunk is read into a staging buffer and applied by
the event loop once it may (rare: a receiver behind its sender by a step); a chunk of the
next iteration instead waits for the receiver to enter it (nothing this iteration needs
comes after it). Staging holds at most STAGE_BYTES per connection before the reader waits.

Frames (little-endian, HEAD): kind, flag, iteration, partition, step, src, offset, count.
    HELLO   sender → receiver once: count = bytes of the run id that follow, src = rank
    CHUNK   flag = copy; count float32 elements follow
    END     a stream is over: partition = its id on the connection
    ACK     receiver → sender: partition = the stream id, flag = ok, count = bytes of reason
    REFUSE  receiver → sender, then it closes: count = bytes of reason
    READY   receiver → sender: it has entered `step` of `partition` in `iteration` (the
            receives of earlier steps from ranks not sending to it now applied); src = the
            receiver's rank. A send the plan marks waits for it: a rendezvous, as MPI's
            large messages have (agent/engine.py)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import struct
import threading
from typing import Awaitable, Callable

import numpy as np

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.transports import register

HEAD = struct.Struct("<BBHIIIIQI")
HELLO, CHUNK, END, ACK, REFUSE, READY = 1, 2, 3, 4, 5, 6
PORT_OFFSET = 1  # listening on each data address's port + 1 (gRPC Data keeps the port)
MAX_RUN_ID = 64
MAX_REASON = 4096
STAGE_BYTES = 32 * 2**20
OPEN_WAIT = 10.0  # seconds a first write waits for its connection (as gRPC's channel would)
# A dead path (a cut link, a frozen peer) ends the connection as gRPC's keepalive does
# (agent/transports/grpc_push.py): data unacknowledged for 10 s, or an idle connection whose
# probes go unanswered for 2 + 5 × 2 s.
USER_TIMEOUT_MS = 10_000
# Bytes of a connection's data the kernel holds, unsent or unacknowledged: fixed rather than
# autotuned (which settled anywhere between 0.45 and 3.6 MB on one 50 Mbit torus), since it
# decides when a rank's send is handed over and its next step may start, which the cost
# model counts (cost/simulate.py). Linux doubles what SO_SNDBUF asks for.
SEND_BUFFER_BYTES = 3 * 2**20
KEEPALIVE = (2, 2, 5)  # idle, interval, probes
# A step's send waits for its receiver's READY (module docstring). TESTBED_RENDEZVOUS=0 sends
# eagerly instead, for an A/B (the agents and the model must both see it)
RENDEZVOUS = os.environ.get("TESTBED_RENDEZVOUS", "1") != "0"


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an END or ACK goes at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, probes = KEEPALIVE
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


def _views(parts: list) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts if len(p)]


def _skip(views: list[memoryview], sent: int) -> None:
    """Drop the first `sent` bytes of `views`, in place."""
    while views and sent >= views[0].nbytes:
        sent -= views[0].nbytes
        views.pop(0)
    if sent:
        views[0] = views[0][sent:]


def _send_all(sock: socket.socket, parts: list) -> None:
    """Write `parts` (bytes-like) whole with as few `sendmsg` calls as the kernel takes."""
    views = _views(parts)
    while views:
        _skip(views, sock.sendmsg(views))


def _send_now(sock: socket.socket, views: list[memoryview]) -> None:
    """Write what the socket takes without waiting (in place: `views` keeps the rest)."""
    try:
        _skip(views, sock.sendmsg(views, [], socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        pass


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`, or raise ConnectionError at its end."""
    got, size = 0, view.nbytes
    while got < size:
        n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        got += n


def _frame(kind: int, flag: int = 0, partition: int = 0, count: int = 0, **fields: int) -> bytes:
    return HEAD.pack(kind, flag, 0, fields.get("iteration", 0), partition, fields.get("step", 0),
                     fields.get("src", 0), fields.get("offset", 0), count)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# -- sending --------------------------------------------------------------------------------
class _Connection:
    """One outgoing connection. Frames are written one at a time by the event loop itself,
    without blocking: what the socket cannot take yet waits for it to be writable (epoll).
    A writer thread handed each frame over and back cost two thread wake-ups per chunk
    (a futex and the loop's self-pipe), with the interpreter lock passed each time: about
    a third of the agents' CPU per byte at 200 Mbit (bench/agent_dataplane.py)."""

    def __init__(self, target: str, run_id: str, rank: int, on_ready=None, on_ended=None) -> None:
        self.target, self.run_id, self.rank = target, run_id, rank
        self.on_ready = on_ready  # (iteration, partition, step, rank) of a READY, on the loop
        self.on_ended = on_ended  # () once it has ended: a send waiting for a READY writes, and fails
        self.sock: socket.socket | None = None
        self.writing = asyncio.Lock()  # one frame at a time, in the order they were asked
        self.room: asyncio.Future | None = None  # set once the socket can take more
        self.acks: dict[int, asyncio.Future] = {}
        self.next_stream = 0
        self.error = ""  # why the connection ended, once it has
        self.inbox = bytearray()
        self.opening: asyncio.Task | None = None

    async def open(self, timeout: float) -> None:
        if self.sock is not None:
            return
        if self.opening is None or self.opening.done():
            self.opening = asyncio.ensure_future(self._open())
        await asyncio.wait_for(asyncio.shield(self.opening), timeout)

    async def _open(self) -> None:
        host, port = self.target.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        while True:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (host.strip("[]"), int(port)))
                break
            except OSError:
                sock.close()
                await asyncio.sleep(0.2)  # the peer's listener is not up yet, or its path is down
        _tune(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES // 2)
        self.sock, self.error = sock, ""
        loop.add_reader(sock.fileno(), self._readable)
        run_id = self.run_id.encode()
        try:
            await self.write([_frame(HELLO, src=self.rank, count=len(run_id)), run_id])
        except BaseException:  # not connected after all: the next write opens again
            self.sock = None
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())
            sock.close()
            raise

    def _readable(self) -> None:
        try:
            data = self.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            data, self.error = b"", self.error or f"{type(exc).__name__}: {exc.strerror or exc}"
        if not data:
            self._ended(self.error or "the peer closed the connection")
            return
        self.inbox += data
        while len(self.inbox) >= HEAD.size:
            kind, flag, _, iteration, stream, step, src, _, count = HEAD.unpack_from(self.inbox)
            if kind == READY:
                del self.inbox[: HEAD.size]
                if self.on_ready is not None:
                    self.on_ready(iteration, stream, step, src)
                continue
            if count > MAX_REASON:
                self._ended(f"the peer sent a reason of {count} bytes")
                return
            if len(self.inbox) < HEAD.size + count:
                break
            reason = _text(self.inbox[HEAD.size : HEAD.size + count])
            del self.inbox[: HEAD.size + count]
            if kind == ACK and stream in self.acks:
                future = self.acks.pop(stream)
                if not future.done():
                    future.set_result("" if flag else reason)
            elif kind == REFUSE:
                self.error = reason
                self._ended(reason)
                return

    def _ended(self, reason: str) -> None:
        """The connection is over: every ack still due fails with `reason`, and so does a
        write waiting for room."""
        self.error = self.error or reason
        if self.on_ended is not None:
            self.on_ended()
        if self.sock is not None:
            try:
                loop = asyncio.get_running_loop()
                loop.remove_reader(self.sock.fileno())
                loop.remove_writer(self.sock.fileno())
            except (RuntimeError, ValueError, OSError):
                pass
        if self.room is not None and not self.room.done():
            self.room.set_exception(ConnectionError(self.error))
        for future in self.acks.values():
            if not future.done():
                future.set_exception(ConnectionError(self.error))
        self.acks.clear()

    async def write(self, parts: list) -> None:
        if self.sock is None and not self.error:  # still connecting (a peer slow to listen)
            try:
                await self.open(OPEN_WAIT)
            except asyncio.TimeoutError:
                pass
        if self.sock is None:
            raise ConnectionError(self.error or f"not connected to {self.target} after {OPEN_WAIT:g} s")
        views = _views(parts)
        size = sum(view.nbytes for view in views)
        async with self.writing:
            if self.error:  # ended (its reason kept): nothing more goes out on it
                raise ConnectionError(self.error)
            _send_now(self.sock, views)
            try:
                while views:
                    await self._writable()
                    _send_now(self.sock, views)
            except asyncio.CancelledError:
                # a frame cut short would be read as the start of the next: nothing more may go
                if views and sum(view.nbytes for view in views) < size:
                    self._ended("a write was cancelled in the middle of a frame")
                raise

    async def _writable(self) -> None:
        """Until the socket can take more (or the connection has ended: ConnectionError)."""
        if self.error:
            raise ConnectionError(self.error)
        loop, fd = asyncio.get_running_loop(), self.sock.fileno()
        room = self.room = loop.create_future()

        def ready() -> None:
            loop.remove_writer(fd)
            if not room.done():
                room.set_result(None)

        loop.add_writer(fd, ready)
        try:
            await room
        finally:
            if room.cancelled():  # its task was: no callback may outlive the wait
                loop.remove_writer(fd)
            self.room = None

    def close(self) -> None:
        if self.opening is not None:
            self.opening.cancel()
        if self.sock is not None:
            self._ended("the run was reconfigured")  # a write waiting for room ends too
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


class TcpStream:
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.id = connection.next_stream
        connection.next_stream += 1
        self.ack: asyncio.Future | None = None

    async def write(self, head: pb.Chunk, data: np.ndarray) -> None:
        header = _frame(CHUNK, int(head.copy), head.partition, head.count, iteration=head.iteration, step=head.step,
                        src=head.src, offset=head.offset)
        await self.connection.write([header, np.ascontiguousarray(data)])

    async def finish(self) -> None:
        self.ack = asyncio.get_running_loop().create_future()
        self.connection.acks[self.id] = self.ack
        try:
            await self.connection.write([_frame(END, partition=self.id)])
        except Exception:
            self.connection.acks.pop(self.id, None)
            raise

    async def acknowledged(self) -> str:
        return await self.ack

    async def reason(self, error: Exception) -> str:
        if not self.connection.error:  # the receiver's REFUSE may still be on its way
            await asyncio.sleep(0.2)
        if self.connection.error:
            return self.connection.error
        if isinstance(error, OSError) and error.strerror:
            return f"{type(error).__name__}: {error.strerror}"
        return f"{type(error).__name__}: {error}"

    def cancel(self) -> None:
        if self.ack is not None and not self.ack.done():
            self.ack.cancel()


class TcpSender:
    """A connection per peer address (`host:port` of its tcp listener)."""

    def __init__(self, run_id: str, rank: int, window_bytes: int = 0) -> None:
        self.run_id, self.rank = run_id, rank
        self.connections: dict[str, _Connection] = {}
        self.on_ready = None  # set by the engine: what a READY from any peer calls
        self.on_ended = None  # and what a connection's end calls

    def _connection(self, target: str) -> _Connection:
        if target not in self.connections:
            self.connections[target] = _Connection(target, self.run_id, self.rank,
                                                   lambda *ready: self.on_ready and self.on_ready(*ready),
                                                   lambda: self.on_ended and self.on_ended())
        return self.connections[target]

    async def connect(self, targets: set[str], timeout: float) -> None:
        await asyncio.gather(*(self.ready(t, timeout) for t in targets))

    async def ready(self, target: str, timeout: float) -> None:
        try:
            await self._connection(target).open(timeout)
        except asyncio.TimeoutError:
            pass  # a peer that does not answer: the first write to it says so

    def connected(self, target: str) -> bool:
        return target in self.connections and self.connections[target].sock is not None

    def stream(self, target: str) -> TcpStream:
        return TcpStream(self._connection(target))

    async def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()


# -- receiving ------------------------------------------------------------------------------
class TcpListener:
    """Accepts the tcp transport's connections on one address; a thread reads each.

    `engine_for(run_id)` (a coroutine on `loop`) returns the engine of that run once it is
    configured (agent/server.py's Agent.engine_for)."""

    def __init__(self, address: str, engine_for: Callable[[str], Awaitable]) -> None:
        self.address = address
        self.engine_for = engine_for
        self.sock: socket.socket | None = None
        self.task: asyncio.Task | None = None

    def bind(self) -> None:
        host, port = self.address.rsplit(":", 1)
        host = host.strip("[]")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
        sock.setblocking(False)
        self.sock = sock

    async def start(self) -> None:
        if self.sock is None:
            self.bind()
        self.task = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.sock)
            conn.setblocking(True)
            _tune(conn)
            threading.Thread(target=_Reader(conn, self.engine_for, loop).run, daemon=True,
                             name=f"tcp-recv {self.address}").start()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.sock is not None:
            self.sock.close()


class _Reader:
    """One incoming connection, read on its own thread until it ends."""

    def __init__(self, sock: socket.socket, engine_for, loop: asyncio.AbstractEventLoop) -> None:
        self.sock, self.engine_for, self.loop = sock, engine_for, loop
        self.head = bytearray(HEAD.size)
        self.staged: dict[tuple[int, int, int], concurrent.futures.Future] = {}  # transfer → its last staged chunk
        self.staged_bytes: list[tuple[concurrent.futures.Future, int]] = []
        self.send_lock = threading.Lock()

    def _call(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _read_head(self) -> tuple:
        _recv_into(self.sock, memoryview(self.head))
        return HEAD.unpack(self.head)

    def _ready(self, iteration: int, partition: int, step: int, rank: int) -> None:
        with self.send_lock:
            _send_all(self.sock, [_frame(READY, 0, partition, 0, iteration=iteration, step=step, src=rank)])

    def _reply(self, kind: int, flag: int, stream: int, reason: str = "") -> None:
        raw = reason.encode()[:MAX_REASON]
        with self.send_lock:
            _send_all(self.sock, [_frame(kind, flag, stream, len(raw)), raw])

    def run(self) -> None:
        engine = None
        try:
            kind, _, _, _, _, _, src, _, count = self._read_head()
            if kind != HELLO or count > MAX_RUN_ID:
                raise ValueError("expected a testbed tcp transport HELLO")
            run_id = bytearray(count)
            _recv_into(self.sock, memoryview(run_id))
            engine = self._call(self.engine_for(run_id.decode("utf-8", "replace")), 90)
            engine.inbound.add(self.sock)
            serve = getattr(engine, "serve", None)  # an engine with its own data path (agent/native)
            if serve is not None:
                serve(self.sock, src)
            else:
                engine.inbound_ready(src, self._ready)  # the READYs it sends to `src` go out here
                try:
                    self._serve(engine, src)
                finally:
                    engine.inbound_gone(src, self._ready)
        except (ConnectionError, OSError):
            pass  # the peer went away (or its run was reconfigured): its sender reports it
        except Exception as exc:  # noqa: BLE001 - the sender names it as a refusal
            try:
                self._reply(REFUSE, 0, 0, f"{type(exc).__name__}: {exc}")
            except OSError:
                pass
        finally:
            if engine is not None:
                engine.inbound.discard(self.sock)
            try:
                self.sock.close()
            except OSError:
                pass

    def _serve(self, engine, rank: int) -> None:
        peer = engine.node_of(rank)
        itemsize = engine.buffer.itemsize
        scratch = np.empty(engine.chunk_elements, dtype=engine.buffer.dtype)
        while True:
            kind, copy, _, iteration, partition, step, src, offset, count = self._read_head()
            if kind == END:
                self._drain()
                self._reply(ACK, 1, partition)
                continue
            if kind != CHUNK:
                raise ValueError(f"unexpected frame kind {kind}")
            if count > engine.chunk_elements or count == 0:
                raise ValueError(f"a chunk of {count} elements (chunks here carry 1 to {engine.chunk_elements})")
            head = pb.Chunk(run_id=engine.run_id, iteration=iteration, partition=partition, step=step, src=src,
                            offset=offset, count=count, copy=bool(copy))
            transfer = (partition, step, src)
            earlier = self.staged.get(transfer)
            if earlier is not None and earlier.done():
                earlier.result()  # a staged chunk the engine refused: say so
                earlier = None
            if earlier is None and self._admitted(engine, head):
                view = engine.buffer[offset : offset + count]
                if copy:
                    _recv_into(self.sock, memoryview(view).cast("B"))
                else:
                    part = scratch[:count]
                    _recv_into(self.sock, memoryview(part).cast("B"))
                    with engine.apply_lock:
                        np.add(view, part, out=view)
                if engine.land(head, peer):  # something waits that may now go on
                    self.loop.call_soon_threadsafe(engine.after_landing)
                continue
            # not yet: staged, and applied by the event loop once it may
            payload = bytearray(count * itemsize)
            _recv_into(self.sock, memoryview(payload))
            future = asyncio.run_coroutine_threadsafe(
                engine.accept_staged(head, memoryview(payload), peer, earlier), self.loop)
            self.staged[transfer] = future
            self.staged_bytes.append((future, len(payload)))
            self._bound_staging()

    def _admitted(self, engine, head: pb.Chunk) -> bool:
        if engine.admit_now(head):
            return True
        answer: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(engine.admit_soon, head, answer)
        return answer.result()

    def _bound_staging(self) -> None:
        self.staged_bytes = [(f, n) for f, n in self.staged_bytes if not f.done()]
        while sum(n for _, n in self.staged_bytes) > STAGE_BYTES:
            self.staged_bytes.pop(0)[0].result()

    def _drain(self) -> None:
        """Every staged chunk applied (or the engine's refusal raised)."""
        for future in list(self.staged.values()):
            future.result()
        self.staged.clear()
        self.staged_bytes.clear()


# agent/native gives it an engine that moves every chunk in native threads (when built)
register("tcp", TcpSender, PORT_OFFSET, "plain TCP per (peer, NIC), read straight into the gradient buffer and "
         "written from it", send_buffer=SEND_BUFFER_BYTES, listener=TcpListener, rendezvous=RENDEZVOUS)
