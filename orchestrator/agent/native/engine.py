"""A rank's allreduce over the tcp transport with every chunk moved by dataplane.c.

Why: on the Python path each chunk cost the event loop and a reading thread ~0.4 ms of
interpreter between them, and the agents' CPU per byte stayed at ~2 × the kernel's
(bench/agent_dataplane.py, issue 28). Here Python describes the iteration once (the
ranges of every partition, as arrays dataplane.c reads and moves on) and waits for it; the
rules are agent/engine.py's, the frames and connections agent/transports/tcp.py's, so a
Python peer and a native one speak the same wire. Stall reports, traces and counters are
read from the same arrays.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time

import numpy as np

from orchestrator.agent.engine import Engine
from orchestrator.agent.native import library
from orchestrator.agent.pacing import SLACK
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent import transports
from orchestrator.agent.transports import tcp

_INT64 = ("lo", "hi", "start")


class NativeEngine(Engine):
    """Engine's interface (connect, allreduce, replan, pending, close) over dataplane.c; the
    tcp listener hands it each incoming connection (`serve`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lib = library()
        # peer address → its rank (for its errors and stall reports), in registration order
        self.rank_of = {self._target(s): s.dst for p in self.plans for st in p.steps for s in st.sends if s.count}
        self.targets = sorted(self.rank_of)
        # dataplane.c writes where the ranges say: refused before anything is made
        ranges = [(x.offset, x.count) for p in self.plans for st in p.steps for x in (*st.sends, *st.recvs) if x.count]
        if any(lo < 0 or lo + count > len(self.buffer) for lo, count in ranges):
            raise ValueError(f"the plan's ranges reach past the gradient of {len(self.buffer)} elements")
        self.progress = np.zeros(1, dtype=np.float64)  # CLOCK_MONOTONIC of the last chunk moved
        self.dp = self.lib.dp_new(self.rank, self.buffer.ctypes.data, self.chunk_elements, tcp.STAGE_BYTES,
                                  self.credit_bytes, float(self.pacer.link_rate), SLACK, max(1, len(self.targets)),
                                  self.progress.ctypes.data)
        self.lib.dp_set_rendezvous(self.dp, 1)  # the plan says which sends wait (dp_meets)
        self.registered = False
        self.opening: list[asyncio.Future] = []  # connections still being opened (_open_later)
        self.running = False
        self.repaced: tuple[np.ndarray, float] | None = None  # shares replan took, for the next iteration
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dataplane")
        self.guard = threading.Condition()  # `serving` calls inside dp_serve; none once closed
        self.serving = 0
        self._layout()

    # -- the iteration as arrays ----------------------------------------------------------
    def _layout(self) -> None:
        rows: list[tuple] = []
        nics: list[int] = []
        meets: list[int] = []  # per range: a send that waits for its receiver's READY, a receive that says it
        conn = {target: i for i, target in enumerate(self.targets)}
        count = 1 + max((p.index for p in self.plans), default=-1)
        first, size, steps, cost = (np.zeros(count, np.int32), np.zeros(count, np.int32),
                                    np.zeros(count, np.int32), np.zeros(count, np.int64))
        for plan in sorted(self.plans, key=lambda p: p.index):
            first[plan.index] = len(rows)
            seen = set()
            for k, step in enumerate(plan.steps):
                for r in step.recvs:
                    if r.count:
                        if (step.step, r.src, r.offset) in seen:
                            raise ValueError(f"plan receives twice from rank {r.src} at {r.offset} in step {step.step}")
                        seen.add((step.step, r.src, r.offset))
                        rows.append((plan.index, step.step, r.src, 0, r.offset, r.offset + r.count, -1, 0, 0, k, 1.0))
                        nics.append(-1)
                        meets.append(int(r.src in step.say))
                for i, x in enumerate(step.sends):
                    if x.count:
                        rows.append((plan.index, step.step, x.dst, 1, x.offset, x.offset + x.count,
                                     conn[self._target(x)], i, int(x.copy), k, x.share))
                        nics.append(x.nic)
                        meets.append(int(x.dst in step.wait))
            size[plan.index] = len(rows) - first[plan.index]
            steps[plan.index] = len(plan.steps)
            cost[plan.index] = plan.length * self.buffer.itemsize
        columns = list(zip(*rows)) if rows else [()] * 11
        names = ("part", "step", "peer", "kind", "lo", "hi", "conn", "order", "copy", "step_index", "share")
        a = {name: np.array(column, dtype=np.float64 if name == "share" else np.int64 if name in _INT64 else np.int32)
             for name, column in zip(names, columns)}
        a["start"] = a["lo"].copy()
        a["done"] = np.zeros(len(rows), np.int32)
        for name in ("begun", "first", "last"):
            a[name] = np.zeros(len(rows), np.float64)
        self.a = a
        self.counted = np.zeros(len(rows), np.int64)
        self.nics = np.array(nics, dtype=np.int32)
        self.meets = np.array(meets or [0], dtype=np.int32)
        present = {p.index: p for p in self.plans}
        self.start_order = np.array(sorted(range(count), key=lambda i: (present[i].priority, i) if i in present
                                           else (-2**62, i)), dtype=np.int32)
        self.parts = (first, size, steps, cost)
        ptr = lambda x: x.ctypes.data  # noqa: E731
        order = ("part", "step", "peer", "kind", "lo", "hi", "start", "conn", "order", "copy", "done", "step_index",
                 "share", "begun", "first", "last")
        self.lib.dp_plan(self.dp, len(rows), *(ptr(a[name]) for name in order), count,
                         *(ptr(x) for x in self.parts), ptr(self.start_order))
        self.lib.dp_meets(self.dp, ptr(self.meets))

    def replan(self, plans, link_rate: float) -> None:
        """New shares, handed to dataplane.c when the next iteration begins (its writing
        threads read them while one goes on), as the Python engine takes its plans then."""
        super().replan(plans, link_rate)
        shares = [x.share for plan in sorted(self.plans, key=lambda p: p.index) for step in plan.steps
                  for x in step.sends if x.count]
        self.repaced = (np.array(shares, dtype=np.float64), float(link_rate))

    def _take_shares(self) -> None:
        if self.repaced is not None:
            shares, link_rate = self.repaced
            self.repaced = None
            self.a["share"][self.a["kind"] == 1] = shares
            self.lib.dp_set_link_rate(self.dp, link_rate)

    # -- connections --------------------------------------------------------------------
    async def connect(self, timeout: float = 10.0) -> None:
        await self.sender.connect(set(self.targets), timeout)
        self._register()

    def _register(self) -> None:
        """Hand every outgoing connection to dataplane.c (its indices are the order of
        `targets`); the event loop stops reading them. One not open yet is registered
        without a socket and opened in the background for up to OPEN_WAIT more seconds:
        meanwhile this rank enters its iterations and receives, as the Python path's
        first write waiting for its connection lets it (a peer cut off is then named by the
        ranks sending to it, not by those waiting for this one)."""
        if self.registered:
            return
        self.registered = True
        for index, target in enumerate(self.targets):
            fd = self._take(target) if self.sender.connected(target) else -1
            got = self.lib.dp_connection(self.dp, fd, self.rank_of[target])
            if got == -2:
                if fd >= 0:
                    os.close(fd)
                raise RuntimeError(
                    f"rank {self.rank}: could not start a thread for its connection to rank {self.rank_of[target]} "
                    f"({len(self.targets)} connections): this host is out of threads (kernel.pid_max, "
                    "kernel.threads-max or the cgroup's pids.max): stop other labs, raise the limit, or choose an "
                    "algorithm with fewer peers")
            if got != index:
                raise RuntimeError("dataplane: connections registered out of order")
            if fd < 0:
                self.opening.append(asyncio.ensure_future(self._open_later(index, target)))

    def _heard_ready(self, iteration: int, partition: int, step: int, rank: int) -> None:
        """A READY the event loop read off a connection not yet handed over: dataplane.c's."""
        if self.dp:
            self.lib.dp_heard(self.dp, iteration, partition, step, rank)

    def _take(self, target: str) -> int:
        """A descriptor of `target`'s open socket for dataplane.c (its own: a dup). What the
        loop read off it already (a peer's READYs) reached dataplane.c through `_heard_ready`."""
        sock = self.sender.connections[target].sock
        asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.setblocking(True)
        return sock.dup().detach()

    async def _open_later(self, index: int, target: str) -> None:
        await self.sender.ready(target, tcp.OPEN_WAIT)
        if self.closed or not self.dp:
            return
        if self.sender.connected(target):
            self.lib.dp_attach(self.dp, index, self._take(target))
        else:
            error = self.sender.connections[target].error if target in self.sender.connections else ""
            why = error or f"not connected to {target} after {tcp.OPEN_WAIT:g} s"
            self.lib.dp_unreachable(self.dp, index, why.encode()[:tcp.MAX_REASON])

    # -- one allreduce --------------------------------------------------------------------
    async def allreduce(self, iteration: int) -> None:
        self._register()
        self._take_shares()
        self.iteration = iteration
        self.counted[:] = 0  # dp_iterate starts every range over
        self.progress[0] = time.monotonic()  # (CLOCK_MONOTONIC, as dataplane.c's)
        self.running = True
        future = asyncio.get_running_loop().run_in_executor(self.pool, self.lib.dp_iterate, self.dp, iteration)
        try:
            result = await asyncio.shield(future)
        except BaseException:
            self.lib.dp_cancel(self.dp)
            await asyncio.wait([future])
            raise
        finally:
            self.running = False
            self._count()
        if result == 1:
            reason = self.lib.dp_error(self.dp).decode("utf-8", "replace")
            rank = self.lib.dp_error_rank(self.dp)
            raise RuntimeError(f"sending to rank {rank} ({self._node(rank)}): {reason}")
        if result == 2:
            raise ConnectionAbortedError("the run was reconfigured")
        if self.spans is not None:
            self._trace(iteration)

    def _count(self) -> None:
        """Bytes moved since the last count: into the totals and the counters (per peer, and
        per NIC for sends)."""
        a = self.a
        moved = a["lo"] - a["start"]
        fresh = (moved - self.counted) * self.buffer.itemsize
        self.counted = moved
        self.sent += int(fresh[a["kind"] == 1].sum())
        self.received += int(fresh[a["kind"] == 0].sum())
        moving = np.nonzero(fresh)[0]
        if not len(moving):
            return
        # one counter update per (peer, NIC, direction), not per range: a plan holds up to
        # registry.MAX_TRANSFERS of them
        keys = np.stack([a["peer"][moving], self.nics[moving], a["kind"][moving]], axis=1)
        groups, which = np.unique(keys, axis=0, return_inverse=True)
        sums = np.bincount(which.ravel(), weights=fresh[moving], minlength=len(groups))
        for (peer, nic, kind), size in zip(groups.tolist(), sums.tolist()):
            if kind:
                self.counters(self._node(peer), int(size), 0, nic)
            else:
                self.counters(self._node(peer), 0, int(size))

    def _trace(self, iteration: int) -> None:
        a = self.a
        for i in range(len(a["lo"])):
            send = bool(a["kind"][i])
            first, last = float(a["first"][i]), float(a["last"][i])
            self.spans.append(pb.TransferSpan(
                iteration=iteration, partition=int(a["part"][i]), step=int(a["step"][i]), peer=int(a["peer"][i]),
                send=send, offset=int(a["start"][i]), count=int(a["hi"][i] - a["start"][i]),
                begun=float(a["begun"][i]) if send else first, first=first, last=last))

    # -- receiving (the tcp listener's reading threads) -------------------------------------
    def serve(self, sock, rank: int) -> None:
        """Serve one incoming connection of this run until it ends (on the calling thread)."""
        with self.guard:
            if self.closed:
                return
            self.serving += 1
        try:
            self.lib.dp_serve(self.dp, sock.fileno(), rank)  # a refusal's reason goes to the peer
        finally:
            with self.guard:
                self.serving -= 1
                self.guard.notify_all()

    # -- what a stalled rank waits for (Status) --------------------------------------------
    def stalled_seconds(self) -> float:
        return time.monotonic() - float(self.progress[0]) if self.running else 0.0

    def pending(self, limit: int = 64) -> list[pb.Pending]:
        """The transfers not yet done, earliest steps first, as Engine.pending reports them;
        `ready` (whether this rank could move its next chunk now) for those reported."""
        if not self.running:
            return []
        a = self.a
        left = np.nonzero(a["lo"] < a["hi"])[0]
        if not len(left):
            return [pb.Pending(kind="ack", peer=self.rank_of[t], ready=True)
                    for c, t in enumerate(self.targets) if self.registered and self.lib.dp_acks_due(self.dp, c) > 0]
        order = np.lexsort((a["peer"][left], a["kind"][left], a["step"][left]))  # receives (0) before sends
        return [pb.Pending(kind="send" if a["kind"][i] else "receive", peer=int(a["peer"][i]), step=int(a["step"][i]),
                           partition=int(a["part"][i]), offset=int(a["start"][i]), end=int(a["hi"][i]),
                           done=int(a["lo"][i]), ready=bool(self.lib.dp_ready(self.dp, i)))
                for i in left[order[:limit]].tolist()]

    async def close(self) -> None:
        with self.guard:
            self.closed = True
        if self.dp:
            self.lib.dp_stop(self.dp)  # every thread and dp_serve call winds up (a chunk waiting too)
        for sock in list(self.inbound):  # their dp_serve calls return
            try:
                sock.shutdown(2)
            except OSError:
                pass
        for task in self.opening:
            task.cancel()
        await self.sender.close()  # (its sockets: dataplane.c has its own descriptors)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._free)
        self.pool.shutdown(wait=False)

    def _free(self) -> None:
        with self.guard:
            self.guard.wait_for(lambda: self.serving == 0, timeout=5)
            busy = self.serving
        if self.dp and not busy and self.lib.dp_close(self.dp) == 0:
            self.dp = None


def _engine(*args, **kwargs) -> NativeEngine | None:
    """The tcp transport's engine: native where the library is built, else None (Python's)."""
    return NativeEngine(*args, **kwargs) if library() is not None else None


transports.use_engine("tcp", _engine)
