"""The tcp transport's native data path (agent/native): ranks in one process, real TCP on
loopback, every chunk moved by dataplane.c. What the agents tier runs across processes
(tests/agents), here with the peers' frames under the test's control: wire compatibility with
the Python path, hostile frames refused in one line, staging, credit, tracing, stall reports."""

from __future__ import annotations

import asyncio
import socket
import struct

import numpy as np
import pytest

from orchestrator.agent import native
from orchestrator.agent import plan as plan_format
from orchestrator.agent.engine import Engine
from orchestrator.agent.transports import tcp
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions

if not native.available():  # setup.sh builds it; a checkout without a compiler cannot
    pytest.skip(f"the native data path is not built ({native.LIBRARY.name}): run ./setup.sh", allow_module_level=True)

from orchestrator.agent.native.engine import NativeEngine  # noqa: E402


def _free_port() -> int:
    """A port nothing listens on (for a peer that must not answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listener(engine_for) -> tuple[tcp.TcpListener, int]:
    """A tcp listener bound now on a port the kernel picks, and that port: one picked free and
    bound later may meanwhile be taken (as a connection's own port, by a test beside it)."""
    listener = tcp.TcpListener("127.0.0.1:0", engine_for)
    listener.bind()
    port = listener.sock.getsockname()[1]
    listener.address = f"127.0.0.1:{port}"
    return listener, port


def _start(rank: int, workers: int, size: int) -> np.ndarray:
    return ((rank + 1) * (np.arange(size) % 1000 + 1)).astype(np.float32) if rank < workers else np.zeros(size, np.float32)


def _plans(algorithm: str, ctx: Context, size: int, part_bytes=None):
    schedules = registry.schedules(algorithm, ctx, size, partitions([size], part_bytes))
    ranks = max(max(t.dst, t.src) for _, s in schedules for _, t in s.transfers()) + 1
    # with the rendezvous the tcp transport keeps: halving-doubling's sends wait for READYs
    return [plan_format.parse(p) for p in plan_format.build_rank_plans(schedules, ranks, rendezvous=True)]


async def _allreduce(algorithm: str, ctx: Context, size: int, *, python_ranks=(), part_bytes=None, credit=0,
                     chunk_bytes=256, iterations=2, trace=False):
    """Run `algorithm` over its ranks in this process, each rank's gradient `_start`; ranks
    in `python_ranks` on Engine (the Python path), the others on NativeEngine. Returns
    (the workers' buffers after the last iteration, the engines)."""
    plans = _plans(algorithm, ctx, size, part_bytes)
    ranks = len(plans)
    engines: list = []
    listeners, ports = [], []
    for r in range(ranks):
        async def engine_for(run_id, r=r):
            return engines[r]
        listener, port = _listener(engine_for)
        listeners.append(listener)
        ports.append(port)
    peers = {r: {"address": f"127.0.0.1:{ports[r] - tcp.PORT_OFFSET}", "by_nic": {}, "node": f"h{r}"}
             for r in range(ranks)}
    engines += [(Engine if r in python_ranks else NativeEngine)(
        "run", r, plans[r], _start(r, ctx.workers, size), peers, chunk_bytes, credit, lambda *_: None,
        transport="tcp", trace=trace) for r in range(ranks)]
    for listener in listeners:
        await listener.start()
    try:
        await asyncio.gather(*(e.connect() for e in engines))
        for iteration in range(iterations):
            for r, e in enumerate(engines):
                e.buffer[:] = _start(r, ctx.workers, size)
            await asyncio.wait_for(asyncio.gather(*(e.allreduce(iteration) for e in engines)), 30)
        return [e.buffer.copy() for e in engines[:ctx.workers]], engines
    finally:
        for e in engines:
            await e.close()
        for listener in listeners:
            listener.close()


def _expected(workers: int, size: int) -> np.ndarray:
    return sum(_start(r, workers, size) for r in range(workers))


CASES = [("ring", Context(5)), ("mesh", Context(4)), ("tree", Context(5)), ("double-tree", Context(6)),
         ("halving-doubling", Context(5)), ("ps", Context(4, options={"shards": 2})),
         ("hierarchical", Context(6, options={"group": 3})), ("flextree", Context(6))]


@pytest.mark.parametrize("algorithm,ctx", CASES, ids=[c[0] for c in CASES])
def test_every_algorithm_sums_exactly_with_every_chunk_moved_natively(algorithm, ctx):
    size = 1001  # odd: ranges of unequal length, a last chunk shorter than the rest
    buffers, engines = asyncio.run(_allreduce(algorithm, ctx, size))
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, _expected(ctx.workers, size))
    assert all(isinstance(e, NativeEngine) for e in engines)
    assert sum(e.sent for e in engines) == sum(e.received for e in engines) > 0


@pytest.mark.parametrize("python_ranks", [{0, 3}, set(range(5))], ids=["mixed", "python"])
@pytest.mark.parametrize("algorithm", ["ring", "mesh", "halving-doubling"])
def test_native_and_python_ranks_speak_the_same_wire(algorithm, python_ranks):
    """Ranks without the library (the Python path, its fallback) beside ranks with it."""
    ctx = Context(5)
    buffers, engines = asyncio.run(_allreduce(algorithm, ctx, 777, python_ranks=python_ranks))
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, _expected(5, 777))
    assert {r for r, e in enumerate(engines) if type(e) is Engine} == python_ranks


def test_partitions_start_by_priority_within_the_credit():
    ctx = Context(4)
    buffers, _ = asyncio.run(_allreduce("ring", ctx, 4000, part_bytes=2000, credit=4000))
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, _expected(4, 4000))


def test_a_traced_run_records_every_transfer_at_both_ends():
    ctx = Context(3)
    _, engines = asyncio.run(_allreduce("ring", ctx, 300, iterations=1, trace=True))
    sends = sorted((s.partition, s.step, e.rank, s.peer, s.offset, s.count) for e in engines for s in e.spans if s.send)
    receives = sorted((s.partition, s.step, s.peer, e.rank, s.offset, s.count) for e in engines for s in e.spans
                      if not s.send)
    assert sends == receives and len(sends) == 2 * 2 * 3  # 2(n-1) steps × n ranks
    assert all(s.begun <= s.first <= s.last for e in engines for s in e.spans)


class _LoneRank:
    """Rank 0 of a 2-rank ring on NativeEngine; rank 1 is this test: its frames are written
    by hand into `peer`, and what rank 0 sends it is accepted and read off."""

    SIZE, CHUNK = 64, 16  # elements

    def __init__(self, python: bool = False, meet: bool = False) -> None:
        self.kind = Engine if python else NativeEngine  # rank 0's: the Python path's, or the native one
        self.meet = meet  # every step meets rank 1: its sends wait for rank 1's READY, it says READY to it

    async def __aenter__(self):
        plans = _plans("ring", Context(2), self.SIZE)
        for step in (step for plan in plans[0] for step in plan.steps) if self.meet else ():
            step.wait = step.say = frozenset({1})

        async def engine_for(run_id):
            return self.engine
        self.listener, own = _listener(engine_for)
        self.sink = socket.create_server(("127.0.0.1", 0))  # rank 1's tcp listener
        self.sink.setblocking(False)
        ports = [own, self.sink.getsockname()[1]]
        peers = {r: {"address": f"127.0.0.1:{ports[r] - tcp.PORT_OFFSET}", "by_nic": {}, "node": f"h{r}"}
                 for r in range(2)}
        self.engine = self.kind("run", 0, plans[0], np.ones(self.SIZE, np.float32), peers, self.CHUNK * 4, 0,
                                lambda *_: None, transport="tcp")
        await self.listener.start()
        loop = asyncio.get_running_loop()
        accepting = loop.sock_accept(self.sink)
        await self.engine.connect()
        self.incoming, _ = await accepting
        self.peer = socket.create_connection(("127.0.0.1", ports[0]))
        self.peer.sendall(tcp._frame(tcp.HELLO, src=1, count=3) + b"run")
        return self

    async def __aexit__(self, *_):
        await self.engine.close()
        self.listener.close()
        for s in (self.peer, self.incoming, self.sink):
            s.close()

    def refusal(self) -> str:
        """The REFUSE rank 0 answers with (it then closes the connection)."""
        self.peer.settimeout(10)
        kind = tcp.READY
        while kind == tcp.READY:  # (rank 0 says READY for each step it enters: before, or not)
            head = self.peer.recv(tcp.HEAD.size, socket.MSG_WAITALL)
            kind, *_, count = tcp.HEAD.unpack(head)
        assert kind == tcp.REFUSE
        reason = self.peer.recv(count, socket.MSG_WAITALL).decode()
        try:  # and closed (reset, when what this test wrote was not all read)
            assert self.peer.recv(1) == b""
        except ConnectionResetError:
            pass
        return reason


def _chunk(count: int, *, iteration=0, partition=0, step=0, offset=0, kind=tcp.CHUNK) -> bytes:
    return struct.pack("<BBHIIIIQI", kind, 0, 0, iteration, partition, step, 1, offset, count) + \
        np.ones(max(count, 0), np.float32).tobytes()


HOSTILE = {
    "kind": (_chunk(0, kind=9), "ValueError: unexpected frame kind 9"),
    "too-long": (_chunk(17), "ValueError: a chunk of 17 elements (chunks here carry 1 to 16)"),
    "empty": (_chunk(0), "ValueError: a chunk of 0 elements (chunks here carry 1 to 16)"),
    "partition": (_chunk(4, partition=7), "ValueError: unexpected chunk: step 0, partition 7, [0, +4) from rank 1"),
    "offset": (_chunk(4, offset=3), "ValueError: unexpected chunk: step 0, partition 0, [3, +4) from rank 1"),
    "step": (_chunk(4, step=5), "ValueError: unexpected chunk: step 5, partition 0, [0, +4) from rank 1"),
    "iteration": (_chunk(4, iteration=2**32 - 1), None),  # a later one: waits, nothing refused
}


MEMORY = 1 << 30  # the receiving rank's data limit in the hostile-frame tests


def _under_memory_limit(run):
    """`asyncio.run(run())` in a child process limited to MEMORY bytes of data (RLIMIT_DATA):
    its result, or its failure re-raised here."""
    import multiprocessing
    import resource

    def child(out) -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))
        try:
            out.put(("ok", asyncio.run(run())))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out.put(("failed", f"{type(exc).__name__}: {exc}"))

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    process = context.Process(target=child, args=(out,))
    process.start()
    try:
        status, value = out.get(timeout=60)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    assert status == "ok", value
    return value


@pytest.mark.parametrize("frame,reason", HOSTILE.values(), ids=HOSTILE)
def test_a_hostile_frame_is_refused_in_one_line_and_the_rank_lives_on(frame, reason):
    async def run():
        async with _LoneRank() as lone:
            running = asyncio.ensure_future(lone.engine.allreduce(0))
            await asyncio.sleep(0)
            lone.peer.sendall(frame)
            if reason is None:  # nothing comes back but rank 0's READYs
                heard = await asyncio.get_running_loop().run_in_executor(None, _frames, lone.peer, 0.3)
                assert {h[0] for h in heard} <= {tcp.READY}, heard
                refused = None
            else:
                refused = await asyncio.get_running_loop().run_in_executor(None, lone.refusal)
            assert not running.done()  # refusing a connection does not end the rank's run
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            return refused

    assert _under_memory_limit(run) == reason


def test_a_chunk_past_the_end_of_its_transfer_is_refused_after_those_before_it_landed():
    async def run():
        async with _LoneRank() as lone:
            running = asyncio.ensure_future(lone.engine.allreduce(0))
            receive = lone.engine.plans[0].steps[0].recvs[0]
            assert receive.count == 32
            o = receive.offset
            lone.peer.sendall(_chunk(16, offset=o) + _chunk(8, offset=o + 16) + _chunk(16, offset=o + 24))
            refused = await asyncio.get_running_loop().run_in_executor(None, lone.refusal)
            landed = lone.engine.buffer[o:o + 24].copy()
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return refused, o, landed

    refused, o, landed = _under_memory_limit(run)
    assert refused == f"ValueError: chunk [{o + 24}, +16) from rank 1 overruns its transfer"
    np.testing.assert_array_equal(landed, 2.0)  # 1 + 1: the two chunks before it were added in


def test_a_silent_peer_is_reported_pending_and_a_closed_one_named():
    async def run():
        async with _LoneRank() as lone:
            engine = lone.engine
            running = asyncio.ensure_future(engine.allreduce(0))
            for _ in range(200):  # rank 0's first send goes out at once; its receive waits on us
                await asyncio.sleep(0.01)
                if any(p.kind == "receive" for p in engine.pending()):
                    break
            pending = engine.pending()
            receive = next(p for p in pending if p.kind == "receive")
            assert receive.peer == 1 and receive.step == 0 and receive.ready and receive.done == receive.offset
            assert engine.stalled_seconds() > 0
            lone.incoming.close()  # rank 1 goes away: rank 0's sends to it fail
            lone.peer.close()
            with pytest.raises(RuntimeError, match=r"^sending to rank 1 \(h1\): "):
                await asyncio.wait_for(running, 30)
            assert engine.stalled_seconds() == 0 and engine.pending() == []

    asyncio.run(run())


def test_a_chunk_that_may_not_land_yet_is_staged_then_applied_in_order():
    """Rank 0 receives [0, 16) from rank 1 twice: added at step 0, copied over at step 1. The
    step-1 chunk, sent first, must wait for the step-0 one (staged: the connection goes on
    reading), and the END is acknowledged only once both have landed."""
    step = lambda n, op: plan_format.Step(n, [], [plan_format.Recv(1, 0, 16)])  # noqa: E731
    plans = [plan_format.PartitionPlan(0, 0, 16, 0, [step(0, "add"), step(1, "copy")])]

    async def run():
        async def engine_for(run_id):
            return engine
        listener, port = _listener(engine_for)
        peers = {0: {"address": f"127.0.0.1:{port - tcp.PORT_OFFSET}", "by_nic": {}, "node": "h0"},
                 1: {"address": "127.0.0.1:9", "by_nic": {}, "node": "h1"}}
        engine = NativeEngine("run", 0, plans, np.ones(16, np.float32), peers, 64, 0, lambda *_: None,
                              transport="tcp")
        await listener.start()
        peer = socket.create_connection(("127.0.0.1", port))
        try:
            await engine.connect()
            running = asyncio.ensure_future(engine.allreduce(0))
            copy = struct.pack("<BBHIIIIQI", tcp.CHUNK, 1, 0, 0, 0, 1, 1, 0, 16) + np.full(16, 5, np.float32).tobytes()
            add = struct.pack("<BBHIIIIQI", tcp.CHUNK, 0, 0, 0, 0, 0, 1, 0, 16) + np.full(16, 1, np.float32).tobytes()
            peer.sendall(tcp._frame(tcp.HELLO, src=1, count=3) + b"run" + copy)
            await asyncio.sleep(0.2)
            assert not running.done() and engine.buffer[0] == 1  # staged, not applied
            peer.sendall(add + tcp._frame(tcp.END, partition=0))
            await asyncio.wait_for(running, 10)
            peer.settimeout(10)
            kind = tcp.READY
            while kind == tcp.READY:  # the READYs of the steps it entered, then the ACK
                kind, flag, *_ = tcp.HEAD.unpack(peer.recv(tcp.HEAD.size, socket.MSG_WAITALL))
            return engine.buffer.copy(), (kind, flag), engine.received
        finally:
            peer.close()
            await engine.close()
            listener.close()

    buffer, ack, received = asyncio.run(run())
    np.testing.assert_array_equal(buffer, 5.0)  # 1 + 1, then 5 copied over it
    assert ack == (tcp.ACK, 1) and received == 2 * 64


def test_an_agent_runs_tcp_on_the_native_engine_unless_told_not_to(monkeypatch):
    import orchestrator.agent.server  # noqa: F401 - what the agent imports gives tcp its engine
    from orchestrator.agent import transports

    peers = {0: {"address": "127.0.0.1:1", "by_nic": {}, "node": "h0"}}
    make = transports.get("tcp").engine
    engine = make("run", 0, [], np.zeros(4, np.float32), peers, 64, 0, lambda *_: None, transport="tcp")
    assert type(engine) is NativeEngine
    asyncio.run(engine.close())
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setenv("TESTBED_NATIVE", "0")
    assert make("run", 0, [], np.zeros(4, np.float32), peers, 64, 0, lambda *_: None, transport="tcp") is None


def test_a_peer_not_listening_leaves_the_rank_receiving_until_it_is_named(monkeypatch):
    """Rank 1 never listens: rank 0 still enters its iteration and takes rank 1's chunks (so
    rank 1's own sends are not the ones that stall), and names rank 1 once its connection
    has had OPEN_WAIT to open."""
    monkeypatch.setattr(tcp, "OPEN_WAIT", 0.5)
    plans = _plans("ring", Context(2), 64)

    async def run():
        async def engine_for(run_id):
            return engine
        listener, own = _listener(engine_for)
        ports = [own, _free_port()]  # rank 1's: nothing listens there
        peers = {r: {"address": f"127.0.0.1:{ports[r] - tcp.PORT_OFFSET}", "by_nic": {}, "node": f"h{r}"}
                 for r in range(2)}
        engine = NativeEngine("run", 0, plans[0], np.ones(64, np.float32), peers, 64, 0, lambda *_: None,
                              transport="tcp")
        await listener.start()
        peer = socket.create_connection(("127.0.0.1", ports[0]))
        try:
            await engine.connect(0.2)
            running = asyncio.ensure_future(engine.allreduce(0))
            receive = plans[0][0].steps[0].recvs[0]
            peer.sendall(tcp._frame(tcp.HELLO, src=1, count=3) + b"run" + _chunk(16, offset=receive.offset))
            with pytest.raises(RuntimeError, match=rf"^sending to rank 1 \(h1\): not connected to 127.0.0.1:{ports[1]}"):
                await asyncio.wait_for(running, 10)
            return engine.buffer[receive.offset:receive.offset + 16].copy()
        finally:
            peer.close()
            await engine.close()
            listener.close()

    np.testing.assert_array_equal(asyncio.run(run()), 2.0)  # its chunk landed meanwhile


def test_a_plan_reaching_past_the_gradient_is_refused_before_anything_moves():
    plans = [plan_format.PartitionPlan(0, 0, 16, 0, [plan_format.Step(0, [], [plan_format.Recv(1, 8, 16)])])]
    peers = {r: {"address": "127.0.0.1:9", "by_nic": {}, "node": f"h{r}"} for r in range(2)}
    with pytest.raises(ValueError, match="^the plan's ranges reach past the gradient of 16 elements$"):
        NativeEngine("run", 0, plans, np.zeros(16, np.float32), peers, 64, 0, lambda *_: None, transport="tcp")


def _tasks_of(uid: int) -> int:
    """Threads of `uid` on this host (what RLIMIT_NPROC counts)."""
    import os

    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid:
            count += int(status["Threads"])
    return count


def test_a_rank_out_of_threads_says_so_in_one_line_and_closes_cleanly():
    """Rank 0 of a mesh of 8 may start only 3 more threads (RLIMIT_NPROC, in a child that runs
    as nobody: root's is not enforced) and needs 8 (a writer per peer and the answers' poller):
    registering its connections fails in one line naming the host's thread limit, and the
    engine closes without joining a thread that never started."""
    import os
    import resource

    native.library()  # loaded while the child may still read it
    plans = _plans("mesh", Context(8), 64)
    peers = {r: {"address": f"127.0.0.1:{_free_port() - tcp.PORT_OFFSET}", "by_nic": {}, "node": f"h{r}"}
             for r in range(8)}

    async def run():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        engine = NativeEngine("run", 0, plans[0], np.ones(64, np.float32), peers, 64, 0, lambda *_: None,
                              transport="tcp")
        await engine.sender.connect(set(engine.targets), 0.1)  # nobody listens: opened later, each
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        resource.setrlimit(resource.RLIMIT_NPROC, (_tasks_of(65534) + 3, hard))
        try:
            engine._register()
        except RuntimeError as exc:
            return str(exc)
        finally:
            resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
            await engine.close()
        return "registered"

    message = _under_memory_limit(run)
    assert message.startswith("rank 0: could not start a thread for its connection to rank "), message
    assert "(7 connections): this host is out of threads (kernel.pid_max" in message and "\n" not in message


def test_new_shares_reach_dataplane_c_when_the_next_iteration_begins():
    """A re-pacing mid-run (Engine.replan) leaves the shares dataplane.c's writing threads
    read alone while an iteration goes on; the next iteration starts with the new ones."""
    steps = [plan_format.Step(0, [plan_format.Send(1, 0, 8, False, -1, 0.5)], [])]
    plans = [plan_format.PartitionPlan(0, 0, 8, 0, steps)]
    peers = {r: {"address": "127.0.0.1:9", "by_nic": {}, "node": f"h{r}"} for r in range(2)}
    engine = NativeEngine("run", 0, plans, np.zeros(8, np.float32), peers, 64, 0, lambda *_: None, link_rate=1e6,
                          transport="tcp")
    try:
        sends = engine.a["kind"] == 1
        engine.iteration = 3  # running
        engine.replan([plan_format.PartitionPlan(0, 0, 8, 0, [plan_format.Step(
            0, [plan_format.Send(1, 0, 8, False, -1, 0.25)], [])])], 1e6)
        assert list(engine.a["share"][sends]) == [0.5]  # the iteration under way keeps its shares
        engine._take_shares()  # what allreduce does first
        assert list(engine.a["share"][sends]) == [0.25] and engine.repaced is None
    finally:
        asyncio.run(engine.close())


def _frames(sock: socket.socket, timeout: float) -> list[tuple]:
    """Frame heads (and skipped payloads) `sock` receives within `timeout` of quiet."""
    sock.settimeout(timeout)
    heads = []
    try:
        while True:
            head = sock.recv(tcp.HEAD.size, socket.MSG_WAITALL)
            if len(head) < tcp.HEAD.size:
                break
            fields = tcp.HEAD.unpack(head)
            heads.append(fields)
            if fields[0] == tcp.CHUNK:
                sock.recv(fields[-1] * 4, socket.MSG_WAITALL)
            elif fields[0] == tcp.HELLO:
                sock.recv(fields[-1], socket.MSG_WAITALL)
    except (TimeoutError, socket.timeout):
        pass
    return heads


@pytest.mark.parametrize("python", [False, True], ids=["native", "python"])
def test_with_a_rendezvous_a_step_is_sent_once_its_receiver_said_ready(python):
    """Rank 0 of a 2-rank ring whose plan meets rank 1 at every step (a ring's would not:
    Schedule.rendezvous; here set by hand) hears only from rank 1, so it says READY for both
    steps as it enters the iteration (nothing from another sender can hold a step up); it
    writes a step's chunks only once rank 1 (this test) has said READY for that step."""
    async def run():
        async with _LoneRank(python=python, meet=True) as lone:
            loop = asyncio.get_running_loop()
            running = asyncio.ensure_future(lone.engine.allreduce(0))
            await asyncio.sleep(0.05)
            heard = await loop.run_in_executor(None, _frames, lone.peer, 0.3)  # rank 0's READYs to us
            sent = await loop.run_in_executor(None, _frames, lone.incoming, 0.3)  # what rank 0 wrote us
            said = sorted((h[0], h[3], h[5], h[6]) for h in heard)  # kind, iteration, step, src
            assert said == [(tcp.READY, 0, 0, 0), (tcp.READY, 0, 1, 0)], heard
            written = [h[0] for h in sent if h[0] != tcp.HELLO]
            assert written == [], sent  # nothing before our READY
            lone.incoming.sendall(tcp._frame(tcp.READY, 0, 0, 0, iteration=0, step=0, src=1))
            sent = await loop.run_in_executor(None, _frames, lone.incoming, 0.3)
            written = {(h[0], h[5]) for h in sent}
            assert written == {(tcp.CHUNK, 0)}, sent  # step 0's
            receive = lone.engine.plans[0].steps[0].recvs[0]
            lone.peer.sendall(_chunk(16, offset=receive.offset) + _chunk(16, offset=receive.offset + 16))
            sent = await loop.run_in_executor(None, _frames, lone.incoming, 0.3)
            assert sent == [], sent  # step 1's data is there, but not our READY for it
            lone.incoming.sendall(tcp._frame(tcp.READY, 0, 0, 0, iteration=0, step=1, src=1))
            sent = await loop.run_in_executor(None, _frames, lone.incoming, 0.3)
            written = {(h[0], h[5]) for h in sent if h[0] != tcp.END}
            assert written == {(tcp.CHUNK, 1)}, sent  # then its stream's END
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    asyncio.run(run())


def test_the_plan_names_whom_a_step_waits_for_and_says_ready_to():
    """Halving-doubling's partners change every step: from its second step on, a rank's
    sends wait for their receiver (wait) and it says READY to its senders (say), when the
    plan is built with the rendezvous; a ring's receivers hear from one rank throughout:
    nothing waits. Without the rendezvous no step names anyone."""
    hd = _plans("halving-doubling", Context(8), 8000)[0]
    for plan in hd:
        first, *rest = plan.steps
        assert not first.wait and not first.say
        for step in rest:
            assert step.wait == {s.dst for s in step.sends if s.count}, step
            assert step.say == {r.src for r in step.recvs if r.count}, step
    assert all(not s.wait and not s.say for p in _plans("ring", Context(8), 8000)[0] for s in p.steps)
    schedules = registry.schedules("halving-doubling", Context(8), 8000, partitions([8000], None))
    eager = plan_format.parse(plan_format.build_rank_plans(schedules, 8)[0])
    assert all(not s.wait and not s.say for p in eager for s in p.steps)
