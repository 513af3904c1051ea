"""Executing one rank's plan: streamed transfers into and out of one buffer, over a transport.

Transfers stream chunks of their range through a transport's streams (agent/transports: tcp
by default, or gRPC Data.Push calls): one stream per partition, peer and NIC for a whole
iteration, carrying that partition's transfers to that peer step after step. The receiver
adds (or copies) each chunk straight into its buffer as it arrives — no staging copy of the
model (the tcp transport's reading threads do so outside the event loop, asking `admit_now`
/ `admit_soon` first, moving the range on with `land`, and reporting `after_landing` when
something waits on it).

Ordering is per range, chunk by chunk, as NCCL pipelines a ring by slices: a chunk of a
step-s send is written once every receive of an earlier step into its range has been
applied, and a received chunk of step s is applied once every earlier step's receive into,
and send out of, its range is done (until then the sender's stream waits, held back by
HTTP/2 flow control, or by the tcp transport's reader, which stages such a chunk). That is exactly the schedule's semantics (sends of step s read the
buffer after all receives of steps < s), with no barrier between steps: a ring forwards a
chunk as soon as it is reduced instead of after the whole step's range (8 servers at 1
Gbit: ~2 ms saved per step; busbw by collective time 0.91-0.92 -> 0.94-0.95). A rank
writes its sends step after step, and each stream carries its partition's steps in order,
so a stream's head never waits on anything behind it. The receivers' acknowledgements are
collected when the allreduce ends.

Over a transport with a rendezvous (tcp's READY), a send the plan marks (Step.wait: into a
rank that heard, in an earlier step, from a rank not sending to it in this one, as
halving-doubling's partners change: Schedule.rendezvous) waits until its receiver has
entered the step: applied every receive of the partition's earlier steps from such ranks,
which it says (Step.say) as it gets there. Sent eagerly, a rank a step ahead wrote into a
partner's downlink still busy with the step before; the skew grew within an allreduce, and
the time moved run to run around the model's. bench/model_accuracy.py, star,8 and
bigraph,4,2 at 2 MiB in one session: halving-doubling 0.246 s eager (1.60 × the model),
0.174 s met (1.13 ×); HDRM 0.517 s (1.68 ×) against 0.369 s (1.20 ×). Rings, meshes and
parameter servers, whose receivers hear from the same ranks step after step, never wait.

Partitions start in priority order, with at most `credit_bytes` of them in flight. In a
lab each connection is paced at its fair share of the link (pacing.py), and every rank
opens its connections and enters the first iteration at the instant the driver names.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from orchestrator.agent import transports
from orchestrator.agent.pacing import Pacer, connected
from orchestrator.agent.plan import PartitionPlan, Send, Step
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.transports.base import Stream

RECONNECT_WAIT = 2.0  # seconds a paced send waits for its connection before writing anyway
OPEN_WAIT = 10.0  # seconds a send waiting for its receiver's READY waits for its connection first (as its write would)


@dataclass
class _Range:
    """What is left of one transfer of a step: elements [lo, hi) not yet received (or
    written). Chunks of a transfer travel in order on one stream, so `lo` only grows."""

    step: int
    peer: int
    lo: int
    hi: int
    start: int = -1  # where the transfer began (lo at first); -1: lo's first value
    first: float = 0.0  # a traced run's: when its first chunk landed (Unix time; 0: none yet)

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.lo


@dataclass
class _PartitionState:
    receiving: dict[tuple[int, int, int], _Range] = field(default_factory=dict)  # (step, src, lo) → left
    sending: dict[tuple[int, int], _Range] = field(default_factory=dict)  # (step, send index) → unwritten

    # A reading thread moves `receiving` on (under the engine's state_lock) while the loop
    # reads it without the lock: the loop reads a copy (one C call, whole under the GIL),
    # never a live view, which the thread could change between two of its items.
    def clear_to_send(self, step: int, lo: int, hi: int) -> bool:
        """Every receive of an earlier step into [lo, hi) has been applied."""
        return not _overlaps_earlier(list(self.receiving.values()), step, lo, hi)

    def clear_to_apply(self, step: int, lo: int, hi: int) -> bool:
        """... and every send of an earlier step out of [lo, hi) has been written."""
        return self.clear_to_send(step, lo, hi) and not _overlaps_earlier(list(self.sending.values()), step, lo, hi)


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
        transport: str = "",
        trace: bool = False,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.plans = plans
        self.buffer = buffer
        self.peers = peers  # rank → {"address": host:port, "by_nic": {nic: host:port}, "node": name}
        self.chunk_elements = max(1, chunk_bytes // buffer.itemsize)
        self.credit_bytes = credit_bytes
        self.counters = counters  # callable(peer_node, sent_bytes, received_bytes, nic=-1)
        chosen = transports.get(transport)
        self.transport = chosen.name
        self.sender = chosen.sender(run_id, rank, window_bytes)
        self.pace_setter = self.sender.pace if chosen.paces_itself else None
        # rendezvous: a step's send to a peer waits for the peer's READY for that step (it
        # has applied every receive of the partition's earlier steps), so a rank a step ahead
        # does not send into a downlink still busy with its partner's step before
        self.rendezvous = hasattr(self.sender, "on_ready")  # the plan says which sends wait (Step.wait)
        self.readies: set[tuple[int, int, int, int]] = set()  # (iteration, partition, step, rank) heard
        # partition → (steps with READYs to say: [(step, [to whom], {all it hears from there})], (step, src) said)
        self.announcing: dict[int, tuple[list[tuple[int, list[int], set[int]]], frozenset]] = {}
        self.announce_due = False  # a receive completed (or the iteration began) since the last look
        self.ready_writers: dict[int, list[Callable]] = {}  # rank → writers of READYs to it (inbound connections)
        self.ready_due: dict[int, list[tuple[int, int, int]]] = {}  # rank → READYs before it connected
        self.ready_pool: concurrent.futures.ThreadPoolExecutor | None = None  # writes them off the loop
        if self.rendezvous:  # heard even when this rank's sends do not wait (a peer's may)
            self.sender.on_ready = self._heard_ready
            self.sender.on_ended = self._recheck
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self.picked: dict[int, str] = {}  # peer rank → its address for transfers naming no NIC
        self.pacer = Pacer(link_rate, setter=self.pace_setter)
        self.iteration = -1
        self.states: dict[int, _PartitionState] = {}
        # (condition, then, future or None): what `_until` and `admit_soon` wait for
        self.waiters: list[tuple[Callable[[], bool], Callable[[BaseException | None], None], object]] = []
        self.streams: dict[tuple[int, int, int], tuple[Stream, asyncio.Lock]] = {}
        self.unacknowledged: list[tuple[Stream, int]] = []  # (stream, destination rank)
        # applying chunks: the receiving threads of a transport (tcp) add into the buffer
        # outside the event loop, and two of them may add into one range in one step (a PS)
        self.apply_lock = threading.Lock()
        self.inbound: set = set()  # a transport's incoming sockets of this run (closed with it)
        # held by the loop while it changes the ranges (and the iteration), and by a reading
        # thread while it checks whether a chunk may land (`admit_now`): no hop per chunk
        self.state_lock = threading.Lock()
        self.closed = False
        self.sent = 0
        self.received = 0
        # a traced run's transfers as they end (appended by the loop and by reading threads)
        self.spans: list[pb.TransferSpan] | None = [] if trace else None
        # monotonic time this rank last moved data inside an allreduce (None outside one):
        # the driver's stall detection reads it through Status
        self.progressed_at: float | None = None

    def replan(self, plans: list[PartitionPlan], link_rate: float) -> None:
        """New shares for the same transfers (a plan whose transfers differ would not match
        the peers'). Before the first iteration, or while the run goes on (a link-degrade
        applied or undone): an allreduce takes its plans when it begins, so the new shares
        pace from the next iteration on, while the sends under way keep theirs."""
        if [(p.index, [(s.step, [(x.dst, x.offset, x.count) for x in s.sends]) for s in p.steps]) for p in plans] != \
                [(p.index, [(s.step, [(x.dst, x.offset, x.count) for x in s.sends]) for s in p.steps]) for p in self.plans]:
            raise ValueError("the new plan's transfers differ from the configured ones")
        self.plans = plans
        self.pacer.link_rate = link_rate  # the same Pacer: it knows the connections and what they carry

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
        with self.state_lock:  # the range is due until applied: a reading thread must not see it gone
            left = state.receiving[(head.step, head.src, head.offset)]
            if head.offset + head.count > left.hi:
                raise ValueError(f"chunk [{head.offset}, +{head.count}) from rank {head.src} overruns its transfer")
            self._apply(head, payload)
            if self._advance(state, head):
                self.announce_due = True
        await self._progressed()

    def _advance(self, state: _PartitionState, head: pb.Chunk) -> bool:
        """The receive `head` belongs to has `head.count` elements more (caller holds state_lock).

        The loop reads `receiving` without the lock while a reading thread calls this, and
        may look between any two of its steps: the range is never missing while some of it
        is still due. It goes under its new key before it leaves the old one, and its `lo`
        moves last (an old `lo` reads as "still due": safe). Taken out first and put back,
        it was missing for a moment, and a check then passed a later step's send or copy
        early, or found the partition done with chunks still to come."""
        key = (head.step, head.src, head.offset)
        left = state.receiving[key]
        lo = left.lo + head.count
        if lo < left.hi:
            if (left.step, left.peer, lo) in state.receiving:
                raise ValueError(f"rank {head.src} sends overlapping ranges in step {head.step}")
            state.receiving[(left.step, left.peer, lo)] = left
        del state.receiving[key]
        left.lo = lo
        if self.spans is not None:
            self._trace_receive(left, head)
        return lo >= left.hi

    def _trace_receive(self, left: _Range, head: pb.Chunk) -> None:
        now = time.time()
        if not left.first:
            left.first = now
        if left.lo >= left.hi:
            self.spans.append(pb.TransferSpan(
                iteration=head.iteration, partition=head.partition, step=left.step, peer=left.peer, send=False,
                offset=left.start, count=left.hi - left.start, begun=left.first, first=left.first, last=now))

    def _count_received(self, head: pb.Chunk, peer: str) -> None:
        size = head.count * self.buffer.itemsize
        self.received += size
        self.counters(peer, 0, size)

    def _ready_for(self, chunk: pb.Chunk) -> bool:
        if self.closed:
            raise ConnectionAbortedError("the run was reconfigured")
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

    # -- receiving outside the event loop (a transport's reading threads: tcp) -------------
    def admit_soon(self, head: pb.Chunk, answer: concurrent.futures.Future) -> None:
        """Answer (in `answer`, for the reading thread that asks through call_soon_threadsafe)
        whether `head`'s payload may land now, written by that thread: once this rank has
        entered the chunk's iteration (nothing this iteration needs comes after it); False
        while its range still waits on this rank's earlier steps; an exception for a chunk
        that does not belong. Until `landed`, its range stays due: nothing after it in the
        schedule reads or writes it. No task per chunk: a waiter, checked in `_wake`."""
        def entered() -> bool:
            return self.closed or head.iteration <= self.iteration

        def then(error: BaseException | None) -> None:
            if error is not None:
                answer.set_exception(error)
                return
            try:
                answer.set_result(self._admissible(head))
            except Exception as exc:  # noqa: BLE001 - the reading thread refuses the chunk with it
                answer.set_exception(exc)

        if entered():
            then(None)
        else:
            self.waiters.append((entered, then, None))

    def admit_now(self, head: pb.Chunk) -> bool:
        """`admit_soon`'s answer when it is a plain yes, checked on the reading thread itself
        (most chunks: no round trip through the loop); False means "ask admit_soon"."""
        with self.state_lock:
            if self.closed or head.iteration != self.iteration:
                return False
            try:
                return self._admissible(head)
            except Exception:  # noqa: BLE001 - admit_soon raises it, with the loop's view
                return False

    def _admissible(self, head: pb.Chunk) -> bool:
        if not self._ready_for(head):
            return False
        left = self.states[head.partition].receiving[(head.step, head.src, head.offset)]
        if head.offset + head.count > left.hi:
            raise ValueError(f"chunk [{head.offset}, +{head.count}) from rank {head.src} overruns its transfer")
        return True

    def landed(self, head: pb.Chunk, peer: str) -> None:
        """An admitted chunk has been applied (called on the loop, in the order chunks came)."""
        if self.land(head, peer):
            self.after_landing()

    def land(self, head: pb.Chunk, peer: str) -> bool:
        """An applied chunk's range moves on, and it is counted: on the loop, or on the
        reading thread that applied it (tcp), in the order chunks came. On the thread, the
        transfer's next chunk is then admitted there at once (`admit_now`); moved on by the
        loop, most chunks of a transfer found their range not moved yet and asked the loop
        (admit_soon): a round trip and two thread wake-ups per chunk. Counted here, before
        anything can see the range done (an iteration's record reads the count).

        Returns whether the loop must hear of it (`after_landing`): whether something waits
        that may now go on. Most chunks land before anything waits on them (a ring's next
        step reaches a range after it has mostly come in), and waking the loop for nothing
        cost a thread wake-up and a pass over the waiters per chunk."""
        with self.state_lock:
            self._count_received(head, peer)  # first: the loop may see the range done at once
            completed = self._advance(self.states[head.partition], head)
        self.progressed_at = time.monotonic()
        if completed and self._announcing():
            self.announce_due = True  # a step it enters may need its READY: the loop says it
            return True
        return self._awaited()

    def _awaited(self) -> bool:
        """Does some waiter's condition hold now (or raise)? Read on a reading thread: the
        conditions only read the state (through copies, see _PartitionState), and one
        registered just after this looked is checked once more by `_until` itself."""
        for ready, _, future in list(self.waiters):
            if future is not None and future.done():
                continue
            try:
                if ready():
                    return True
            except Exception:  # noqa: BLE001 - the loop raises it in the waiter
                return True
        return False

    def after_landing(self) -> None:
        """On the loop, after a chunk has landed: what waited on it goes on. (`land` noted
        the time already; noted here, it could come after the iteration ended, and a rank
        between iterations would look stalled.)"""
        self._recheck()

    async def accept_staged(self, head: pb.Chunk, payload: memoryview, peer: str, after=None) -> None:
        """Apply a chunk that could not land when it arrived, once it may; after `after`
        (a concurrent future: the transfer's chunk before it, staged too)."""
        if after is not None:
            await asyncio.wrap_future(after)
        await self._accept_chunk(head, payload)
        with self.state_lock:  # reading threads count theirs (land) at the same time
            self._count_received(head, peer)

    def node_of(self, rank: int) -> str:
        return self._node(rank)

    async def _progressed(self) -> None:
        self._wake()

    def _wake(self) -> None:
        """Note the time (stall detection) and let go every waiter whose condition now holds.

        Conditions are checked here rather than by waking each waiting task to check its own
        (asyncio.Condition.notify_all): most keep waiting after any one chunk, and a task
        woken for nothing cost ~0.1 ms per chunk and waiter."""
        self.progressed_at = time.monotonic()
        self._recheck()

    def _recheck(self) -> None:
        if self.announce_due:
            self._announce()
        # Every waiter stays listed while its condition is checked: a reading thread that
        # lands a chunk meanwhile must find it there (`land` wakes the loop only for a
        # listed waiter), so the list is not taken out and rebuilt.
        over: list[tuple[tuple, BaseException | None]] = []
        for entry in list(self.waiters):
            ready, then, future = entry
            if future is not None and future.done():  # its task was cancelled
                over.append((entry, None))
                continue
            try:
                if ready():
                    over.append((entry, None))
            except Exception as exc:  # noqa: BLE001 - the waiter raises it
                over.append((entry, exc))
        if not over:
            return
        gone = {id(entry) for entry, _ in over}
        self.waiters = [entry for entry in self.waiters if id(entry) not in gone]
        for (_, then, future), error in over:
            if future is None or not future.done():
                then(error)

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` holds, re-checked whenever ranges or the iteration move
        (raising what it raises)."""
        if ready():
            return
        future = asyncio.get_running_loop().create_future()

        def then(error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(None)

        self.waiters.append((ready, then, future))
        # a reading thread that landed a chunk between the check above and the append saw
        # no waiter and left the loop asleep (`land`): look once more, now that it is listed
        try:
            holds = ready()
        except Exception as exc:  # noqa: BLE001 - raised in the waiter, as _recheck would
            then(exc)
        else:
            if holds:
                then(None)
        await future

    def _apply(self, chunk: pb.Chunk, payload: memoryview) -> int:
        data = np.frombuffer(payload, dtype=self.buffer.dtype)
        if len(data) != chunk.count:
            raise ValueError(f"chunk carries {len(data)} elements, header says {chunk.count}")
        view = self.buffer[chunk.offset : chunk.offset + chunk.count]
        with self.apply_lock:
            if chunk.copy:
                view[:] = data
            else:
                np.add(view, data, out=view)
        return chunk.count

    # -- sending --------------------------------------------------------------------------
    def _target(self, send: Send) -> str:
        """The peer's address on the NIC the transfer names, for this run's transport; where
        it names none, the one the transport picks among the peer's (rdma: one its NIC
        reaches directly, since RoCE is taken only by the NIC that owns the address)."""
        peer = self.peers[send.dst]
        if send.nic >= 0:
            address = peer["by_nic"].get(send.nic, peer["address"])
        else:
            address = self.picked.get(send.dst)
            if address is None:  # once per peer and run: a pick may read the routing table
                pick = transports.get(self.transport).pick_address
                address = pick([peer["address"], *peer["by_nic"].values()]) if pick else peer["address"]
                self.picked[send.dst] = address
        return transports.address_for(self.transport, address)

    async def _send(self, partition: int, step: int, send: Send, key: tuple[int, int], wait: bool = False) -> None:
        """Write one transfer's chunks into the partition's call to the peer (opened on first
        use), each once its range is ready; done when written — the range has been copied
        out of the buffer by then. `key` names the transfer's unwritten range in the state."""
        stream, lock = self._stream(partition, send)
        state = self.states[partition]
        left = state.sending[key]
        target = self._target(send)
        if send.share < 1 and target not in self.pacer.fds and self.pace_setter is None:
            # its socket exists once connected (`connect` waited already; this is a reconnect)
            await self.sender.ready(target, RECONNECT_WAIT)
        begun, first = time.time(), 0.0
        if self.rendezvous and wait:  # until its receiver has entered the step (a connection gone: the write says so)
            iteration = self.iteration
            if not self.sender.connected(target):
                await self.sender.ready(target, OPEN_WAIT)
            await self._until(lambda: (iteration, partition, step, send.dst) in self.readies
                              or not self.sender.connected(target) or bool(self.sender.connections[target].error))
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
                        await stream.write(head, self.buffer[start : start + count])
                    except Exception as exc:  # the stream ended early
                        reason = await stream.reason(exc)
                        raise RuntimeError(f"sending to rank {send.dst} ({self._node(send.dst)}): {reason}") from exc
                    first = first or time.time()
                    with self.state_lock:
                        left.lo = start + count
                        if left.lo >= left.hi:
                            del state.sending[key]
                    await self._progressed()
        finally:
            self.pacer.end(target, (partition, key))
        if self.spans is not None:
            self.spans.append(pb.TransferSpan(
                iteration=self.iteration, partition=partition, step=step, peer=send.dst, send=True,
                offset=send.offset, count=send.count, begun=begun, first=first, last=time.time()))
        size = send.count * self.buffer.itemsize
        self.sent += size
        self.counters(self._node(send.dst), size, 0, send.nic)

    async def connect(self, timeout: float = 10.0) -> None:
        """Open the connection to every peer address the plans send to, before the first
        iteration (rather than 15 at once per rank inside it). A peer that does not answer
        in time is left to the first send to it, which reports it."""
        targets = {self._target(send) for plan in self.plans for step in plan.steps for send in step.sends}
        # before our own channels exist: whatever leads to these peers now is not this run's
        self.pacer.stale |= connected({t for t in targets if not self.sender.connected(t)})
        await self.sender.connect(targets, timeout)

    def _node(self, rank: int) -> str:
        return self.peers.get(rank, {}).get("node", str(rank))

    def _stream(self, partition: int, send: Send) -> tuple[Stream, asyncio.Lock]:
        key = (partition, send.dst, send.nic)
        if key not in self.streams:
            self.streams[key] = (self.sender.stream(self._target(send)), asyncio.Lock())
        return self.streams[key]

    async def _finish_streams(self, partition: int) -> None:
        for key in [key for key in self.streams if key[0] == partition]:
            stream, _ = self.streams.pop(key)
            await stream.finish()
            self.unacknowledged.append((stream, key[1]))

    async def _acknowledged(self) -> None:
        while self.unacknowledged:  # each dropped once in: those left are what Status reports due
            stream, dst = self.unacknowledged[0]
            try:
                refused = await stream.acknowledged()
            except Exception as exc:  # the stream ended without the receiver's word
                reason = await stream.reason(exc)
                raise RuntimeError(f"sending to rank {dst} ({self._node(dst)}): {reason}") from exc
            if refused:
                raise RuntimeError(f"rank {dst} ({self._node(dst)}) refused a transfer: {refused}")
            self.unacknowledged.pop(0)

    # -- rendezvous ---------------------------------------------------------------------------
    def _heard_ready(self, iteration: int, partition: int, step: int, rank: int) -> None:
        """A peer's READY (on the loop): a send waiting for it may go."""
        if iteration >= self.iteration:
            self.readies.add((iteration, partition, step, rank))
            self._recheck()

    def inbound_ready(self, rank: int, write: Callable) -> None:
        """A reading thread's connection from `rank` (called on that thread): READYs to
        `rank` may go out on it, those held for it first."""
        def register() -> None:
            self.ready_writers.setdefault(rank, []).append(write)
            for ready in self.ready_due.pop(rank, []):
                self._write_ready(rank, *ready)
        self._on_loop(register)

    def inbound_gone(self, rank: int, write: Callable) -> None:
        """That connection has ended (called on its reading thread): no READY goes out on it."""
        def forget() -> None:
            writers = self.ready_writers.get(rank, [])
            if write in writers:
                writers.remove(write)
        self._on_loop(forget)

    def _on_loop(self, call: Callable[[], None]) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(call)
            return
        call()

    def _write_ready(self, rank: int, iteration: int, partition: int, step: int) -> None:
        """READY to `rank`, written on a thread of its own (a socket the peer does not drain
        at once must not hold up this loop, which drains the peer's) on every connection
        from `rank` (the send that waits for it may go over any of its NICs), or held until
        `rank` has connected."""
        if self.closed:
            return
        writers = self.ready_writers.get(rank)
        if not writers:
            self.ready_due.setdefault(rank, []).append((iteration, partition, step))
            return
        if self.ready_pool is None:
            self.ready_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ready")

        def write() -> None:
            for writer in list(writers):
                try:
                    writer(iteration, partition, step, self.rank)
                except OSError:
                    continue  # that connection is over: the others carry it
        self.ready_pool.submit(write)

    def _announce(self) -> None:
        """READY for every step this rank has entered since it last looked, to each rank it
        receives from there: once every receive of an earlier step from another rank is
        applied (its own sender's come first on their connection anyway: a ring's receiver
        says READY for every step as it enters the iteration)."""
        self.announce_due = False
        if self.iteration < 0 or self.closed:
            return
        for index, (steps, done) in list(self.announcing.items()):
            state = self.states.get(index)
            if state is None or not _owes(steps, done):
                continue
            pending = [(r.step, r.peer) for r in list(state.receiving.values())]
            said = set(done)
            for step, say, sources in steps:
                for src in say:
                    if (step, src) not in said and all(s >= step for s, peer in pending if peer not in sources):
                        said.add((step, src))
                        self._write_ready(src, self.iteration, index, step)
            self.announcing[index] = (steps, frozenset(said))

    def _announcing(self) -> bool:
        """Whether some step of this iteration is still to be announced (read on a reading
        thread: the entries are replaced whole, never changed in place)."""
        return any(_owes(steps, done) for steps, done in list(self.announcing.values()))

    def announced(self, partition: int, step: int, src: int) -> bool:
        """Whether this rank has said READY to `src` for `step` of `partition` (a stall
        report's: a receive not announced waits on this rank's own earlier steps)."""
        steps, done = self.announcing.get(partition, ([], frozenset()))
        owed = any(at == step and src in say for at, say, _ in steps)
        return not owed or (step, src) in done

    # -- one allreduce --------------------------------------------------------------------
    async def allreduce(self, iteration: int) -> None:
        if True:  # (one block: nothing awaits inside it)
            states = {p.index: _PartitionState() for p in self.plans}
            for plan in self.plans:
                state = states[plan.index]
                for step in plan.steps:
                    for r in step.recvs:
                        if r.count:
                            if (step.step, r.src, r.offset) in state.receiving:
                                raise ValueError(f"plan receives twice from rank {r.src} at {r.offset} in step {step.step}")
                            state.receiving[(step.step, r.src, r.offset)] = _Range(step.step, r.src, r.offset, r.offset + r.count)
                    for i, x in enumerate(step.sends):
                        if x.count:
                            state.sending[(step.step, i)] = _Range(step.step, x.dst, x.offset, x.offset + x.count)
            with self.state_lock:
                self.iteration, self.states = iteration, states
            if self.loop is None:
                self.loop = asyncio.get_running_loop()
            if self.rendezvous:  # tcp: say READY as each step is entered
                self.announcing = {plan.index: ([(step.step, sorted(step.say), {r.src for r in step.recvs if r.count})
                                                 for step in plan.steps if step.say], frozenset())
                                   for plan in self.plans}
                self.announce_due = True
            self.readies = {r for r in self.readies if r[0] >= iteration}
            self._recheck()
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
            for stream, _ in [*self.streams.values(), *self.unacknowledged]:
                stream.cancel()
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
        await asyncio.gather(*(self._send(partition, step.step, send, (step.step, i), send.dst in step.wait)
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
            for r in list(state.receiving.values()):
                hi = min(r.hi, r.lo + self.chunk_elements)
                said = not self.rendezvous or self.announced(partition, r.step, r.peer)  # else its own steps hold it
                found.append(pb.Pending(kind="receive", peer=r.peer, step=r.step, partition=partition,
                                        offset=r.start, end=r.hi, done=r.lo,
                                        ready=said and state.clear_to_apply(r.step, r.lo, hi)))
            for (step, _), r in list(state.sending.items()):
                hi = min(r.hi, r.lo + self.chunk_elements)
                found.append(pb.Pending(kind="send", peer=r.peer, step=step, partition=partition, offset=r.start,
                                        end=r.hi, done=r.lo, ready=state.clear_to_send(step, r.lo, hi)))
        if not found and self.progressed_at is not None:  # all moved: the receivers' Acks are due
            found = [pb.Pending(kind="ack", peer=dst, ready=True) for _, dst in self.unacknowledged]
        found.sort(key=lambda p: (p.step, p.kind != "receive", p.peer))
        return found[:limit]

    async def close(self) -> None:
        self.closed = True  # chunks waiting to land give up (_ready_for raises)
        if self.ready_pool is not None:
            self.ready_pool.shutdown(wait=False)
        self._recheck()
        for stream, _ in [*self.streams.values(), *self.unacknowledged]:
            stream.cancel()
        await self.sender.close()
        for sock in list(self.inbound):  # their reading threads end (an rdma queue pair closes)
            try:
                sock.shutdown(2)  # SHUT_RDWR
            except OSError:
                pass
        self.streams.clear()
        self.unacknowledged.clear()


def _owes(steps: list[tuple[int, list[int], set[int]]], done: frozenset) -> bool:
    """Whether a partition's READYs (Engine.announcing's steps) are not all said yet."""
    return len(done) < sum(len(say) for _, say, _ in steps)
