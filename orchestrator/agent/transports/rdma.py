"""The rdma transport: RoCE v2 over soft-RoCE (rdma_rxe) through rdma-core's own binding, pyverbs.

One reliable-connected queue pair per (peer, NIC), connected by rdma_cm: the connection is
resolved from the peer's IP address, as RoCE v2 is routed, and with it the rxe device of the
NIC the route leaves by. A chunk travels as SEND messages of at most SLOT_BYTES, each the tcp
transport's 32-byte header and its payload (the same frames: HELLO, CHUNK, END, ACK, REFUSE),
into receive slots registered once per queue pair; the receiver copies or adds a slot into
the gradient buffer, or stages it when its range may not land yet, exactly as the tcp
transport's reader does (agent/transports/tcp.py says why).

Why slots rather than RDMA WRITE into the peer's gradient buffer: half of all chunks are
reductions, which need the bytes beside the buffer anyway, and pyverbs 44 (Debian 12's) posts
a send only from the start of a registered region — so each slot is its own region.

rxe has no congestion control: every queue pair is paced by the agent (`pace`), at its fair
share or a hair under the link when it has the link to itself, and a receiver with no slot
free answers "not ready" until it has one (rnr_retry 7: without end, the backpressure a full
TCP window gives). A path that dies fails the queue pair's sends after RETRIES timeouts.
rxe does bound what a queue pair leaves unacknowledged: under the vm tier's kernel the queue
into a link slowed to 20 Mbit held at most 70 KB (65 frames), paced or not. The pace sets the
share each queue pair takes of a link it shares, and a pace left at a slowed link's share holds
a run there after the link recovers: agents are re-paced when a link changes mid-run
(control/repacing.py; in the vm tier a 4 MB ring went from 3.5 to 0.76 s per iteration).

Nothing here blocks the event loop, which also serves Control: pyverbs 44 holds the
interpreter lock inside every verb, so a verb that waited (for a completion, a connection
request) would stop the whole agent. The completion channels and the listener's event channel
are made non-blocking and watched by the loop; a verb that would wait then fails with EAGAIN,
"nothing yet". rdma_cm runs asynchronously for the same reason (its synchronous connect and
accept each wait for the other side's agent to answer: a ring of agents, each connecting to
the next while holding the lock, waited for each other for good): an event channel per
connection on the sending side, one per listener on the receiving side.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import os
import socket
import sys
from collections import deque
from typing import Awaitable, Callable

import numpy as np

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.transports import register
from orchestrator.agent.transports.tcp import ACK, CHUNK, END, HEAD, HELLO, MAX_REASON, MAX_RUN_ID, OPEN_WAIT, \
    REFUSE, STAGE_BYTES, _frame, _text

try:  # rdma-core's binding (Debian's python3-pyverbs); without it the transport says so
    from pyverbs import cm_enums, enums
    from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
    from pyverbs.pyverbs_error import PyverbsError
    from pyverbs.qp import QPCap, QPInitAttr
except ImportError:  # pragma: no cover - depends on the machine
    CMID = None

    class PyverbsError(Exception):  # type: ignore[no-redef]
        pass

PORT_OFFSET = 2  # an rdma_cm listener on each data address's port + 2 (tcp's is + 1)
SLOT_BYTES = 256 * 2**10  # payload of one message: a chunk larger than this goes as several
SEND_SLOTS = 8  # messages a queue pair has in flight: 2 MiB, what a send hands over before it leaves
RECV_SLOTS = 16  # messages a receiver takes before it answers "not ready"
CONTROL_SLOTS = 4  # slots of the other direction (ACK, REFUSE)
CONTROL_BYTES = HEAD.size + MAX_REASON
RETRIES = 7  # rdma_cm's most: transport retries before a send fails; RNR retries without end
EVENT_FD = "anon_inode:[infinibandevent]"  # a completion channel (or a device's async events)
CM_FD = "/dev/infiniband/rdma_cm"
SPINS = 8  # readable wake-ups in a row that drained nothing: not a completion channel
RESOLVE_MS = 2000  # rdma_cm's address and route resolution, each
HELLO_WAIT_S = 60.0  # an accepted queue pair that has said nothing by then is closed


def unavailable() -> str:
    """Why this process cannot use the rdma transport ("" when it can try)."""
    if CMID is None:
        return "pyverbs (rdma-core's Python binding, Debian's python3-pyverbs) is not installed"
    return ""


def _fds() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return found


def _opened(before: dict[int, str], kind: str) -> list[int]:
    """Descriptors of `kind` opened since `before`, now non-blocking. Only this module's
    verbs open rdma descriptors, and only on the loop's thread: the difference is theirs."""
    new = [fd for fd, link in _fds().items() if link == kind and before.get(fd) != link]
    for fd in new:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return new


def _would_wait(exc: PyverbsError) -> bool:
    return getattr(exc, "error_code", None) in (errno.EAGAIN, errno.EWOULDBLOCK)


def _channel() -> tuple[object, int]:
    """A new rdma_cm event channel and its descriptor, non-blocking."""
    before = _fds()
    channel = CMEventChannel()
    fds = _opened(before, CM_FD)
    if len(fds) != 1:
        channel.close()
        raise OSError(errno.EIO, f"expected one new rdma_cm event channel, found {len(fds)}")
    return channel, fds[0]


def _events(channel):
    """The channel's events until there are none: (event, its type); the caller acks each."""
    while True:
        try:
            event = CMEvent(channel)
        except PyverbsError as exc:
            if _would_wait(exc):
                return
            raise
        yield event, event.event_type


def _source_for(host: str, port: int) -> str:
    """This host's address that the kernel's route to host:port leaves from (no packet sent)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def _routes() -> list[tuple[int, int, bool]]:
    """This namespace's IPv4 routes: (network, mask, on-link), from /proc/net/route."""
    found = []
    with open("/proc/net/route") as table:
        next(table)
        for line in table:
            fields = line.split()
            network, gateway, mask = (int(fields[i], 16) for i in (1, 2, 7))
            found.append((network, mask, gateway == 0))
    return found


def on_link(candidates: list[str], routes: list[tuple[int, int, bool]] | None = None) -> str:
    """The first of `candidates` (host:port) this host reaches without a gateway, else the
    first. RoCE v2 is taken only by the rxe device of the NIC that owns the destination
    address: an address the path reaches through another NIC of the peer (relayed by it, as
    BCube's servers relay) is never answered."""
    routes = _routes() if routes is None else routes
    for candidate in candidates:
        host = candidate.rsplit(":", 1)[0]
        try:
            packed = int.from_bytes(socket.inet_aton(host), sys.byteorder)  # /proc/net/route: the host's order
        except OSError:
            continue
        best = max(((bin(mask).count("1"), direct) for network, mask, direct in routes if packed & mask == network),
                   default=None)
        if best is not None and best[1]:
            return candidate
    return candidates[0]


def _queue_pair(cmid, sends: int, receives: int) -> list[int]:
    """Create the id's queue pair (and its completion queues and channels); the channels'
    descriptors, non-blocking."""
    before = _fds()
    cmid.create_qp(_qp_init(sends, receives))
    return _opened(before, EVENT_FD)


def _qp_init(sends: int, receives: int) -> QPInitAttr:
    cap = QPCap(max_send_wr=sends, max_recv_wr=receives, max_send_sge=1, max_recv_sge=1)
    return QPInitAttr(qp_type=enums.IBV_QPT_RC, cap=cap)


def _conn_param() -> ConnParam:
    return ConnParam(retry=RETRIES, rnr_retry=RETRIES)


def _status(code: int) -> str:
    known = {enums.IBV_WC_RETRY_EXC_ERR: "the peer stopped answering (transport retries exhausted)",
             enums.IBV_WC_RNR_RETRY_EXC_ERR: "the peer had no receive ready (RNR retries exhausted)",
             enums.IBV_WC_WR_FLUSH_ERR: "the queue pair was closed"}
    return known.get(code, f"a work completion failed with status {code}")


def _view(mr) -> np.ndarray:
    """The bytes of a registered region, as numpy sees them (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * mr.length).from_address(mr.buf))


class _Endpoint:
    """One end of a queue pair: registered slots to send from and receive into, their
    completions drained on the loop (non-blocking), in order (a queue pair completes its sends,
    and its receives, in the order they were posted)."""

    def __init__(self, cmid, send_bytes: int, sends: int, recv_bytes: int, receives: int) -> None:
        self.cmid = cmid
        self.send_mrs = [cmid.reg_msgs(send_bytes) for _ in range(sends)]
        self.send_views = [_view(mr) for mr in self.send_mrs]
        self.recv_mrs = [cmid.reg_msgs(recv_bytes) for _ in range(receives)]
        self.recv_views = [_view(mr) for mr in self.recv_mrs]
        self.free = deque(range(sends))
        self.sending: deque[int] = deque()  # slots posted, in order
        self.receiving: deque[int] = deque()
        self.slot_waiters: deque[asyncio.Future] = deque()
        self.fds: list[int] = []
        self.spins: dict[int, int] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error = ""
        self.rate = 0.0  # bytes per second a send is paced at (0: not paced)
        self.next_at = 0.0
        self.channel: tuple[object, int] | None = None  # an rdma_cm channel of its own (the sender's)
        for slot in range(receives):
            self.repost(slot)

    def repost(self, slot: int) -> None:
        self.cmid.post_recv(self.recv_mrs[slot])
        self.receiving.append(slot)

    def watch(self, fds: list[int], loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.fds = loop, fds
        for fd in fds:
            loop.add_reader(fd, self._readable, fd)
        self._drain()  # completions that came before the watch

    def _readable(self, fd: int) -> None:
        if self._drain():
            self.spins[fd] = 0
            return
        self.spins[fd] = self.spins.get(fd, 0) + 1
        if self.spins[fd] >= SPINS:  # a device's async event channel, not ours: never drained here
            self.loop.remove_reader(fd)
            self.fds.remove(fd)

    def _drain(self) -> bool:
        """Handle every completion there is; whether there was one."""
        got = False
        for receive in (False, True):
            while not self.error:
                try:
                    wc = self.cmid.get_recv_comp() if receive else self.cmid.get_send_comp()
                except PyverbsError as exc:
                    if not _would_wait(exc):
                        self.ended(f"polling completions: {exc}")
                    break
                if wc is None:
                    break
                got = True
                if wc.status != enums.IBV_WC_SUCCESS:
                    self.ended(_status(wc.status))
                    break
                if receive:
                    self.received(self.receiving.popleft(), wc.byte_len)
                else:
                    self.free.append(self.sending.popleft())
                    self._wake_one()
        return got

    def _wake_one(self) -> None:
        while self.slot_waiters:
            waiter = self.slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def send(self, header: bytes, payload: np.ndarray | None = None) -> None:
        """Post one message; return once it is copied into a slot (`payload` may change)."""
        while not self.free and not self.error:
            waiter = asyncio.get_running_loop().create_future()
            self.slot_waiters.append(waiter)
            await waiter
        if self.error:
            raise ConnectionError(self.error)
        slot = self.free.popleft()
        view = self.send_views[slot]
        size = len(header)
        view[:size] = np.frombuffer(header, np.uint8)
        if payload is not None and payload.size:
            raw = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
            view[size : size + raw.size] = raw
            size += raw.size
        if self.rate:  # rxe has no congestion control: the agent paces
            now = self.loop.time()
            start = max(now, self.next_at)
            self.next_at = start + size / self.rate
            if start > now:
                await asyncio.sleep(start - now)
        if self.error:
            self.free.append(slot)
            raise ConnectionError(self.error)
        try:
            self.cmid.post_send(self.send_mrs[slot], length=size)
        except PyverbsError as exc:
            self.free.append(slot)
            self.ended(f"posting a send: {exc}")
            raise ConnectionError(self.error) from exc
        self.sending.append(slot)

    def received(self, slot: int, length: int) -> None:  # pragma: no cover - each side's own
        raise NotImplementedError

    def ended(self, reason: str) -> None:
        self.error = self.error or reason
        for waiter in self.slot_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.slot_waiters.clear()

    def close(self) -> None:
        self.ended("the run was reconfigured")
        if self.loop is not None:
            for fd in self.fds:
                self.loop.remove_reader(fd)
        self.fds = []
        try:
            self.cmid.disconnect()
        except PyverbsError:
            pass
        self.cmid.close()  # the queue pair first, then the regions registered on it (pyverbs' order)
        self.send_views = self.recv_views = []
        if self.channel is not None:
            channel, fd = self.channel
            if self.loop is not None:
                self.loop.remove_reader(fd)
            channel.close()
            self.channel = None


# -- sending --------------------------------------------------------------------------------
class _Connection(_Endpoint):
    """A rank's queue pair to one peer address; the receiver's ACKs come back on it."""

    def __init__(self, cmid, run_id: str, rank: int) -> None:
        super().__init__(cmid, HEAD.size + SLOT_BYTES, SEND_SLOTS, CONTROL_BYTES, CONTROL_SLOTS)
        self.run_id, self.rank = run_id, rank
        self.acks: dict[int, asyncio.Future] = {}
        self.next_stream = 0

    def received(self, slot: int, length: int) -> None:
        view = self.recv_views[slot]
        kind, flag, _, _, stream, _, _, _, count = HEAD.unpack_from(view)
        reason = _text(bytes(view[HEAD.size : HEAD.size + min(count, length - HEAD.size, MAX_REASON)]))
        self.repost(slot)
        if kind == ACK and stream in self.acks:
            future = self.acks.pop(stream)
            if not future.done():
                future.set_result("" if flag else reason)
        elif kind == REFUSE:
            self.ended(reason)

    def ended(self, reason: str) -> None:
        super().ended(reason)
        for future in self.acks.values():
            if not future.done():
                future.set_exception(ConnectionError(self.error))
        self.acks.clear()


class _Dial:
    """Connecting a queue pair to `target` (host:port of its rdma_cm listener), step by step
    as rdma_cm's events arrive on the connection's own channel: address, route, queue pair
    and connect, established. `done` ends with the connection or a ConnectionError."""

    def __init__(self, target: str, run_id: str, rank: int, loop: asyncio.AbstractEventLoop) -> None:
        self.target, self.run_id, self.rank, self.loop = target, run_id, rank, loop
        self.done: asyncio.Future = loop.create_future()
        self.connection: _Connection | None = None
        self.over = False
        self.cmid = None
        self.channel, self.fd = _channel()
        host, port = target.rsplit(":", 1)
        host = host.strip("[]")
        try:
            self.cmid = CMID(creator=self.channel, port_space=cm_enums.RDMA_PS_TCP)
            # bound first to the address the route to the peer leaves from: that NIC's rxe
            # device, and the device context and protection domain pyverbs needs for the
            # queue pair, as a listener's bind makes them
            local = _source_for(host, int(port))
            self.cmid.bind_addr(AddrInfo(src=local, port_space=cm_enums.RDMA_PS_TCP, flags=cm_enums.RAI_PASSIVE))
            loop.add_reader(self.fd, self._events)
            info = AddrInfo(src=local, dst=host, dst_service=port, port_space=cm_enums.RDMA_PS_TCP)
            self.cmid.resolve_addr(info, RESOLVE_MS)
        except BaseException:
            self.abandon()
            raise

    def _events(self) -> None:
        try:
            for event, kind in _events(self.channel):
                reason = event.event_str()
                event.close()  # acknowledged at once: destroying an id waits for its events' acks
                self._on(kind, reason)
                if self.over:  # abandoned: its channel is closed
                    return
        except PyverbsError as exc:
            self._fail(str(exc))

    def _on(self, kind: int, reason: str) -> None:
        if kind == cm_enums.RDMA_CM_EVENT_ADDR_RESOLVED:
            self.cmid.resolve_route(RESOLVE_MS)
        elif kind == cm_enums.RDMA_CM_EVENT_ROUTE_RESOLVED:
            fds = _queue_pair(self.cmid, SEND_SLOTS + 1, CONTROL_SLOTS)
            self.connection = _Connection(self.cmid, self.run_id, self.rank)  # receives posted before connecting
            self.connection.channel = (self.channel, self.fd)
            self.connection.watch(fds, self.loop)
            self.cmid.connect(_conn_param())
        elif kind == cm_enums.RDMA_CM_EVENT_ESTABLISHED and self.connection is not None:
            if not self.done.done():
                self.done.set_result(self.connection)
        elif kind in (cm_enums.RDMA_CM_EVENT_DISCONNECTED, cm_enums.RDMA_CM_EVENT_TIMEWAIT_EXIT):
            if self.connection is not None:
                self.connection.ended("the peer closed the queue pair")
        elif kind == cm_enums.RDMA_CM_EVENT_UNREACHABLE and self.done.done():
            # Once connected, UNREACHABLE is only the kernel's neighbour watch (Linux >= 6.0): it
            # fires when a neighbour entry with this id's interface index and peer address changes
            # its MAC, looked up across every network namespace. Lab servers live in namespaces of
            # their own, with the same interface indexes and (in several labs) the same addresses,
            # so another server's ARP traffic raises it on a healthy queue pair (seen in the vm
            # tier). The queue pair's own retries say when a path is really gone.
            pass
        else:  # address, route or connect error, unreachable, rejected (no listener), device gone
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"rdma_cm to {self.target}: {reason}"))
            self.abandon()
        elif self.connection is not None:
            self.connection.ended(reason)

    def abandon(self) -> None:
        """Give up connecting: everything it made goes."""
        if self.over:
            return
        self.over = True
        if self.connection is not None:
            self.connection.close()  # its id and the channel with it
            return
        self.loop.remove_reader(self.fd)
        if self.cmid is not None:
            self.cmid.close()
        self.channel.close()


class RdmaStream:
    def __init__(self, sender: "RdmaSender", target: str) -> None:
        self.sender, self.target = sender, target
        self.connection: _Connection | None = None
        self.id = -1
        self.ack: asyncio.Future | None = None

    async def _connected(self) -> _Connection:
        if self.connection is None:
            self.connection = await self.sender.opened(self.target)
            self.id = self.connection.next_stream
            self.connection.next_stream += 1
        return self.connection

    async def write(self, head: pb.Chunk, data: np.ndarray) -> None:
        connection = await self._connected()
        per = SLOT_BYTES // data.itemsize
        for start in range(0, head.count, per):  # a chunk larger than a slot goes as several
            count = min(per, head.count - start)
            header = _frame(CHUNK, int(head.copy), head.partition, count, iteration=head.iteration, step=head.step,
                            src=head.src, offset=head.offset + start)
            await connection.send(header, data[start : start + count])

    async def finish(self) -> None:
        connection = await self._connected()
        self.ack = asyncio.get_running_loop().create_future()
        connection.acks[self.id] = self.ack
        try:
            await connection.send(_frame(END, partition=self.id))
        except Exception:
            connection.acks.pop(self.id, None)
            raise

    async def acknowledged(self) -> str:
        return await self.ack

    async def reason(self, error: Exception) -> str:
        connection = self.connection
        if connection is not None and not connection.error:  # the receiver's REFUSE may be on its way
            await asyncio.sleep(0.2)
        if connection is not None and connection.error:
            return connection.error
        return f"{type(error).__name__}: {error}"

    def cancel(self) -> None:
        if self.ack is not None and not self.ack.done():
            self.ack.cancel()


class RdmaSender:
    """A queue pair per peer address (`host:port` of its rdma_cm listener)."""

    def __init__(self, run_id: str, rank: int, window_bytes: int = 0) -> None:
        self.run_id, self.rank = run_id, rank
        self.connections: dict[str, _Connection] = {}
        self.opening: dict[str, asyncio.Task] = {}
        self.rates: dict[str, float] = {}
        self.errors: dict[str, str] = {}

    async def _open(self, target: str) -> _Connection:
        loop = asyncio.get_running_loop()
        why = unavailable()
        if why:
            raise ConnectionError(why)
        while True:
            dial = None
            try:
                dial = _Dial(target, self.run_id, self.rank, loop)
                connection = await dial.done
                break
            except (PyverbsError, ConnectionError, OSError) as exc:  # its listener not up yet, or the path down
                self.errors[target] = str(exc) if isinstance(exc, ConnectionError) else f"rdma_cm to {target}: {exc}"
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                if dial is not None:
                    dial.abandon()
                raise
        connection.rate = self.rates.get(target, 0.0)
        try:
            await connection.send(_frame(HELLO, src=self.rank, count=len(self.run_id.encode())) + self.run_id.encode())
        except BaseException:
            connection.close()
            raise
        self.connections[target] = connection
        return connection

    async def opened(self, target: str, timeout: float = OPEN_WAIT) -> _Connection:
        if target in self.connections:
            return self.connections[target]
        task = self.opening.get(target)
        if task is None or task.done():
            task = self.opening[target] = asyncio.ensure_future(self._open(target))
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            raise ConnectionError(self.errors.get(target) or f"not connected to {target} after {timeout:g} s") from None

    async def connect(self, targets: set[str], timeout: float) -> None:
        await asyncio.gather(*(self.ready(t, timeout) for t in targets))

    async def ready(self, target: str, timeout: float) -> None:
        try:
            await self.opened(target, timeout)
        except ConnectionError:
            pass  # a peer that does not answer: the first write to it says so

    def connected(self, target: str) -> bool:
        return target in self.connections and not self.connections[target].error

    def stream(self, target: str) -> RdmaStream:
        return RdmaStream(self, target)

    def pace(self, target: str, rate: float) -> None:
        """Send to `target` at `rate` payload bytes per second (0: as fast as posted)."""
        self.rates[target] = rate
        if target in self.connections:
            self.connections[target].rate = rate

    async def close(self) -> None:
        for task in self.opening.values():
            task.cancel()
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()
        self.opening.clear()


# -- receiving ------------------------------------------------------------------------------
class _Inbound(_Endpoint):
    """A queue pair a peer connected; its chunks are applied on the loop as they complete."""

    def __init__(self, cmid, engine_for: Callable[[str], Awaitable]) -> None:
        super().__init__(cmid, CONTROL_BYTES, CONTROL_SLOTS, HEAD.size + SLOT_BYTES, RECV_SLOTS)
        self.engine_for = engine_for
        self.engine = None
        self.peer = ""
        self.waiting: deque[tuple[int, int]] | None = None  # completions while the run is looked up
        self.staged: dict[tuple[int, int, int], asyncio.Task] = {}  # transfer → its last staged chunk
        self.staged_bytes = 0
        self.held: list[int] = []  # slots not reposted while staging is full: the sender waits
        self.refused = False
        self.listener: RdmaListener | None = None

    def received(self, slot: int, length: int) -> None:
        if self.refused:
            return
        if self.waiting is not None:
            self.waiting.append((slot, length))
            return
        try:
            self._message(slot, length)
        except Exception as exc:  # noqa: BLE001 - the sender names it as a refusal
            self.refuse(f"{type(exc).__name__}: {exc}")

    def _message(self, slot: int, length: int) -> None:
        view = self.recv_views[slot]
        if length < HEAD.size:
            raise ValueError(f"a message of {length} bytes")
        kind, copy, _, iteration, partition, step, src, offset, count = HEAD.unpack_from(view)
        if self.engine is None:
            if kind != HELLO or count > MAX_RUN_ID or length != HEAD.size + count:
                raise ValueError("expected a testbed rdma transport HELLO")
            run_id = bytes(view[HEAD.size : HEAD.size + count]).decode("utf-8", "replace")
            self.repost(slot)
            self.waiting = deque()
            asyncio.ensure_future(self._bind(run_id, src))
            return
        engine = self.engine
        if kind == END:
            self.repost(slot)
            asyncio.ensure_future(self._acknowledge(partition, list(self.staged.values())))
            # only what has landed is forgotten: a staged chunk of another partition on this
            # queue pair must still order the chunks of its transfer behind it
            self.staged = {transfer: task for transfer, task in self.staged.items() if not task.done()}
            return
        if kind != CHUNK:
            raise ValueError(f"unexpected frame kind {kind}")
        itemsize = engine.buffer.itemsize
        if count == 0 or length != HEAD.size + count * itemsize:
            raise ValueError(f"a chunk of {count} elements in a message of {length} bytes")
        head = pb.Chunk(run_id=engine.run_id, iteration=iteration, partition=partition, step=step, src=src,
                        offset=offset, count=count, copy=bool(copy))
        payload = view[HEAD.size : length].view(engine.buffer.dtype)
        transfer = (partition, step, src)
        earlier = self.staged.get(transfer)
        if earlier is not None and earlier.done():
            earlier.result()  # a staged chunk the engine refused: say so
            earlier = None
        if earlier is None and engine.admit_now(head):
            target = engine.buffer[offset : offset + count]
            with engine.apply_lock:
                if copy:
                    target[:] = payload
                else:
                    np.add(target, payload, out=target)
            self.repost(slot)
            engine.landed(head, self.peer)
            return
        # not yet: staged, applied by the engine once it may
        staged = bytearray(payload.view(np.uint8))
        task = asyncio.ensure_future(engine.accept_staged(head, memoryview(staged), self.peer, earlier))
        self.staged[transfer] = task
        self.staged_bytes += len(staged)
        task.add_done_callback(lambda _, n=len(staged): self._unstaged(n))
        if self.staged_bytes > STAGE_BYTES:
            self.held.append(slot)
        else:
            self.repost(slot)

    def _unstaged(self, size: int) -> None:
        self.staged_bytes -= size
        while self.held and self.staged_bytes <= STAGE_BYTES and not self.error:
            self.repost(self.held.pop(0))

    async def _bind(self, run_id: str, rank: int) -> None:
        try:
            engine = await asyncio.wait_for(self.engine_for(run_id), 90)
        except Exception as exc:  # noqa: BLE001
            self.refuse(f"{type(exc).__name__}: {exc}")
            return
        if self.cmid is None:  # closed while the run was looked up: its slots are gone
            return
        self.engine, self.peer = engine, engine.node_of(rank)
        engine.inbound.add(self)
        waiting, self.waiting = self.waiting, None
        for slot, length in waiting:
            self.received(slot, length)

    async def _acknowledge(self, stream: int, staged: list[asyncio.Task]) -> None:
        reason = ""
        for task in staged:
            try:
                await task
            except Exception as exc:  # noqa: BLE001
                reason = reason or f"{type(exc).__name__}: {exc}"
        raw = reason.encode()[:MAX_REASON]
        try:
            await self.send(_frame(ACK, int(not reason), stream, len(raw)) + raw)
        except ConnectionError:
            pass

    def refuse(self, reason: str) -> None:
        """Tell the sender why, then close: nothing more it sends is applied."""
        if self.refused or self.error:
            return
        self.refused = True
        asyncio.ensure_future(self._refuse(reason))

    async def _refuse(self, reason: str) -> None:
        raw = reason.encode()[:MAX_REASON]
        try:
            await self.send(_frame(REFUSE, 0, 0, len(raw)) + raw)
        except ConnectionError:
            pass
        self.error = self.error or reason
        asyncio.get_running_loop().call_later(1.0, self.shutdown)  # the REFUSE leaves first

    def shutdown(self, how: int = 2) -> None:
        """The run is over (the engine closes its inbound connections like sockets)."""
        if self.engine is not None:
            self.engine.inbound.discard(self)
        if self.listener is not None:
            self.listener.inbound.discard(self)
        if self.cmid is not None:
            self.close()
            self.cmid = None


class RdmaListener:
    """Accepts the rdma transport's connections on one data address.

    `bind` raises OSError where no RDMA device serves the address (no rxe on its NIC): the
    agent then serves the other transports there, and tries again; ENOTSUP where this host
    has no RDMA at all (no pyverbs, no rdma_cm): not tried again."""

    def __init__(self, address: str, engine_for: Callable[[str], Awaitable]) -> None:
        self.address = address
        self.engine_for = engine_for
        self.cmid = None
        self.channel = None
        self.fd: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.inbound: set[_Inbound] = set()

    def bind(self) -> None:
        why = unavailable()
        if why:
            raise OSError(errno.ENOTSUP, why)
        host, port = self.address.rsplit(":", 1)
        try:
            self.channel, self.fd = _channel()
            self.cmid = CMID(creator=self.channel, port_space=cm_enums.RDMA_PS_TCP)
            info = AddrInfo(src=host.strip("[]"), src_service=port, port_space=cm_enums.RDMA_PS_TCP,
                            flags=cm_enums.RAI_PASSIVE)
            self.cmid.bind_addr(info)
            self.cmid.listen(128)
        except PyverbsError as exc:
            had_channel = self.channel is not None
            self._release()
            if not had_channel:  # no /dev/infiniband/rdma_cm: rdma_ucm is not loaded, or no device at all
                raise OSError(errno.ENOTSUP, f"no rdma_cm on this host ({exc}): modprobe rdma_ucm, and an rxe "
                              "device") from None
            raise OSError(getattr(exc, "error_code", errno.EIO), f"no RDMA device serves {host}: {exc}") from None

    async def start(self) -> None:
        if self.cmid is None:
            self.bind()
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.fd, self._events)

    def _events(self) -> None:
        try:
            for event, kind in _events(self.channel):
                try:
                    if kind == cm_enums.RDMA_CM_EVENT_CONNECT_REQUEST:
                        self._accept(event)
                finally:  # every event acknowledged: closing the listener waits for that
                    event.close()  # established, disconnected, time-wait over: nothing to do
        except PyverbsError:
            pass  # the channel failed: connections already made go on

    def _accept(self, event) -> None:
        inbound = None
        try:
            conn = CMID(creator=event, listen_id=self.cmid)
            fds = _queue_pair(conn, CONTROL_SLOTS + 1, RECV_SLOTS)
            inbound = _Inbound(conn, self.engine_for)  # its receives posted before accepting
            conn.accept(_conn_param())
        except PyverbsError:
            if inbound is not None:
                inbound.close()
            return
        inbound.listener = self
        inbound.watch(fds, self.loop)
        self.inbound.add(inbound)
        # a sender that went away before its HELLO (abandoned, crashed) is never heard of again
        self.loop.call_later(HELLO_WAIT_S, lambda: inbound.engine is None and inbound.waiting is None
                             and inbound.shutdown())

    def _release(self) -> None:
        if self.loop is not None and self.fd is not None:
            self.loop.remove_reader(self.fd)
        if self.cmid is not None:
            self.cmid.close()
            self.cmid = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        for inbound in list(self.inbound):
            inbound.shutdown()
        self.inbound.clear()
        self._release()


register("rdma", RdmaSender, PORT_OFFSET, "RoCE v2 queue pairs over soft-RoCE (pyverbs, rdma_cm), paced by the agent",
         send_buffer=SEND_SLOTS * SLOT_BYTES, listener=RdmaListener, optional=True, paces_itself=True, wire="roce",
         pick_address=on_link)
