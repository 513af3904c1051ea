"""The rdma transport's logic above the verbs: two endpoints joined by a stand-in queue pair.

The stand-in does what an RC queue pair does for the logic: a SEND lands in the peer's oldest
posted receive (or waits while none is posted: "receiver not ready"), completions come back in
order, and a poll with nothing to return fails with EAGAIN as the non-blocking channels make
it. The real verbs run in the vm tier (tests/vm/guest/test_softroce.py)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import threading
from collections import deque

import numpy as np
import pytest

from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.transports import rdma
from orchestrator.agent.transports.tcp import CHUNK, HEAD, HELLO, _frame


class FakeMR:
    def __init__(self, size: int) -> None:
        self.memory = (ctypes.c_uint8 * size)()
        self.buf, self.length = ctypes.addressof(self.memory), size

    def close(self) -> None:
        pass


class FakeWC:
    def __init__(self, byte_len: int = 0, status: int = 0) -> None:
        self.byte_len, self.status = byte_len, status


def would_wait() -> Exception:
    exc = rdma.PyverbsError("nothing yet")
    exc.error_code = errno.EAGAIN
    return exc


class FakeCmid:
    def __init__(self) -> None:
        self.peer: FakeCmid | None = None
        self.posted: deque[FakeMR] = deque()
        self.sends: deque[FakeWC] = deque()
        self.receives: deque[FakeWC] = deque()
        self.not_ready: deque[bytes] = deque()  # sends waiting for a posted receive
        self.closed = False

    def reg_msgs(self, size: int) -> FakeMR:
        return FakeMR(size)

    def post_recv(self, mr: FakeMR) -> None:
        self.posted.append(mr)
        while self.not_ready and self.posted:
            self._land(self.not_ready.popleft())

    def post_send(self, mr: FakeMR, length: int) -> None:
        data = bytes(mr.memory[:length])
        self.sends.append(FakeWC(length))
        if self.peer.posted:
            self.peer._land(data)
        else:
            self.peer.not_ready.append(data)

    def _land(self, data: bytes) -> None:
        mr = self.posted.popleft()
        ctypes.memmove(mr.buf, data, len(data))
        self.receives.append(FakeWC(len(data)))

    def get_send_comp(self) -> FakeWC:
        if not self.sends:
            raise would_wait()
        return self.sends.popleft()

    def get_recv_comp(self) -> FakeWC:
        if not self.receives:
            raise would_wait()
        return self.receives.popleft()

    def disconnect(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    """What a transport's receiving side asks of agent/engine.py, with per-range admission:
    a chunk may land once `open_from` ≤ its step."""

    def __init__(self, elements: int) -> None:
        self.run_id = "run-1"
        self.buffer = np.zeros(elements, np.float32)
        self.apply_lock = threading.Lock()
        self.inbound: set = set()
        self.landed_heads: list[pb.Chunk] = []
        self.open_from = 0
        self.limit = elements

    async def engine_for(self, run_id: str):
        if run_id != self.run_id:
            raise KeyError(f"no run {run_id}")
        return self

    def node_of(self, rank: int) -> str:
        return f"h{rank}"

    def admit_now(self, head: pb.Chunk) -> bool:
        return head.step <= self.open_from and head.offset + head.count <= self.limit

    def landed(self, head: pb.Chunk, peer: str) -> None:
        self.landed_heads.append(head)

    async def accept_staged(self, head: pb.Chunk, payload: memoryview, peer: str, after=None) -> None:
        if after is not None:
            await asyncio.wrap_future(after) if not isinstance(after, asyncio.Future) else await after
        if head.offset + head.count > self.limit:
            raise ValueError(f"chunk [{head.offset}, +{head.count}) overruns its transfer")
        while head.step > self.open_from:
            await asyncio.sleep(0.001)
        view = self.buffer[head.offset : head.offset + head.count]
        data = np.frombuffer(payload, np.float32)
        if head.copy:
            view[:] = data
        else:
            view += data
        self.landed_heads.append(head)


def pair(engine: FakeEngine):
    """A sender's connection and the receiver's inbound endpoint, joined."""
    out, into = FakeCmid(), FakeCmid()
    out.peer, into.peer = into, out
    connection = rdma._Connection(out, engine.run_id, 3)
    inbound = rdma._Inbound(into, engine.engine_for)
    return connection, inbound


async def introduced(engine: FakeEngine):
    """A joined pair whose sender has said HELLO for the engine's run, and a stream on it."""
    connection, inbound = pair(engine)
    connection.loop = inbound.loop = asyncio.get_running_loop()
    hello = engine.run_id.encode()
    await connection.send(_frame(HELLO, src=3, count=len(hello)) + hello)
    stream = rdma.RdmaStream(None, "peer")
    stream.connection, stream.id = connection, 0
    return connection, inbound, stream


async def pump(*endpoints, rounds: int = 50) -> None:
    """Deliver completions (what the loop's readers do) and let tasks run, `rounds` times."""
    for _ in range(rounds):
        for endpoint in endpoints:
            if endpoint.cmid is not None:
                endpoint._drain()
        await asyncio.sleep(0)


def pumping(*endpoints) -> asyncio.Task:
    """Completions delivered in the background, as the loop's readers would."""
    async def forever():
        while True:
            await pump(*endpoints, rounds=1)
            await asyncio.sleep(0.0005)
    return asyncio.ensure_future(forever())


def chunk(step: int, offset: int, count: int, copy: bool) -> pb.Chunk:
    return pb.Chunk(run_id="run-1", iteration=0, partition=0, step=step, src=3, offset=offset, count=count, copy=copy)


def run(coroutine):
    return asyncio.run(coroutine)


def test_chunks_larger_than_a_slot_land_whole_copied_and_added_then_acknowledged():
    async def go():
        elements = 3 * rdma.SLOT_BYTES // 4 + 123  # four messages per chunk, the last short
        engine = FakeEngine(elements)
        connection, inbound = pair(engine)
        loop = asyncio.get_running_loop()
        connection.loop = inbound.loop = loop
        hello = engine.run_id.encode()
        await connection.send(_frame(HELLO, src=3, count=len(hello)) + hello)
        stream = rdma.RdmaStream(None, "peer")
        stream.connection, stream.id = connection, 0
        data = np.arange(elements, dtype=np.float32)
        pumping(connection, inbound)
        await stream.write(chunk(0, 0, elements, True), data)
        await stream.write(chunk(0, 0, elements, False), data)  # a reduction: added in
        await stream.finish()
        await pump(connection, inbound)
        assert await asyncio.wait_for(stream.acknowledged(), 1) == ""
        assert np.array_equal(engine.buffer, 2 * data)
        assert sum(h.count for h in engine.landed_heads) == 2 * elements
        assert max(h.count for h in engine.landed_heads) == rdma.SLOT_BYTES // 4
        assert inbound in engine.inbound  # closed with the run
    run(go())


def test_a_chunk_that_may_not_land_yet_is_staged_and_applied_in_order():
    async def go():
        engine = FakeEngine(1000)
        engine.open_from = -1  # nothing may land yet
        connection, inbound, stream = await introduced(engine)
        first, second = np.full(500, 1, np.float32), np.full(500, 2, np.float32)
        pumping(connection, inbound)
        await stream.write(chunk(0, 0, 500, True), first)
        await stream.write(chunk(0, 500, 500, True), second)
        await pump(connection, inbound)
        assert engine.landed_heads == [] and len(inbound.staged) == 1
        await stream.finish()
        await pump(connection, inbound)
        assert not stream.ack.done()  # the ACK waits for the staged chunks
        engine.open_from = 0
        await pump(connection, inbound, rounds=200)
        assert await asyncio.wait_for(stream.acknowledged(), 1) == ""
        assert [h.offset for h in engine.landed_heads] == [0, 500]
        assert np.array_equal(engine.buffer[:500], first) and np.array_equal(engine.buffer[500:], second)
    run(go())


def test_a_chunk_the_engine_refuses_reaches_the_sender_as_its_reason():
    async def go():
        engine = FakeEngine(1000)
        engine.limit = 100  # the transfer is 100 elements: a chunk past it overruns
        connection, inbound, stream = await introduced(engine)
        pumping(connection, inbound)
        await stream.write(chunk(0, 50, 100, True), np.ones(100, np.float32))
        await stream.finish()
        await pump(connection, inbound, rounds=200)
        reason = await asyncio.wait_for(stream.acknowledged(), 1)
        assert "overruns its transfer" in reason
    run(go())


def test_an_unknown_run_is_refused_and_the_sender_hears_why():
    async def go():
        engine = FakeEngine(10)
        connection, inbound = pair(engine)
        connection.loop = inbound.loop = asyncio.get_running_loop()
        wrong = b"run-2"
        await connection.send(_frame(HELLO, src=3, count=len(wrong)) + wrong)
        await pump(connection, inbound)
        assert "no run run-2" in connection.error
        with pytest.raises(ConnectionError, match="no run run-2"):
            await connection.send(b"x" * HEAD.size)
    run(go())


def test_a_failed_completion_ends_the_connection_with_its_reason():
    async def go():
        engine = FakeEngine(10)
        connection, inbound = pair(engine)
        connection.loop = asyncio.get_running_loop()
        connection.cmid.sends.append(FakeWC(status=12))  # IBV_WC_RETRY_EXC_ERR
        connection._drain()
        assert "stopped answering" in connection.error
    if rdma.CMID is None:
        pytest.skip("pyverbs is not installed: its status names are not known here")
    run(go())


def test_unreachable_fails_a_dial_but_not_a_connected_queue_pair():
    """rdma_cm's UNREACHABLE while connecting ends that attempt (the sender dials again); once
    connected it is the kernel's neighbour watch, which looks across network namespaces and
    fires on other lab servers' ARP traffic: the queue pair goes on."""
    if rdma.CMID is None:
        pytest.skip("pyverbs is not installed: rdma_cm's event numbers are not known here")

    async def go():
        loop = asyncio.get_running_loop()
        engine = FakeEngine(10)

        def dial(connected: bool) -> rdma._Dial:
            attempt = object.__new__(rdma._Dial)
            attempt.target, attempt.loop, attempt.over = "10.0.0.2:7002", loop, False
            attempt.done = loop.create_future()
            attempt.connection, _ = pair(engine)
            attempt.abandon = lambda: setattr(attempt, "over", True)
            if connected:
                attempt._on(rdma.cm_enums.RDMA_CM_EVENT_ESTABLISHED, "RDMA_CM_EVENT_ESTABLISHED")
            return attempt

        connecting = dial(connected=False)
        connecting._on(rdma.cm_enums.RDMA_CM_EVENT_UNREACHABLE, "RDMA_CM_EVENT_UNREACHABLE")
        with pytest.raises(ConnectionError, match="UNREACHABLE"):
            await connecting.done
        assert connecting.over

        connected = dial(connected=True)
        connected._on(rdma.cm_enums.RDMA_CM_EVENT_UNREACHABLE, "RDMA_CM_EVENT_UNREACHABLE")
        assert connected.done.result() is connected.connection and not connected.connection.error
        connected._on(rdma.cm_enums.RDMA_CM_EVENT_DISCONNECTED, "RDMA_CM_EVENT_DISCONNECTED")
        assert connected.connection.error == "the peer closed the queue pair"
    run(go())


def test_sends_are_paced_at_the_rate_given():
    async def go():
        engine = FakeEngine(rdma.SLOT_BYTES // 4)
        connection, inbound = pair(engine)
        loop = asyncio.get_running_loop()
        connection.loop = inbound.loop = loop
        hello = engine.run_id.encode()
        await connection.send(_frame(HELLO, src=3, count=len(hello)) + hello)
        connection.rate = 32 * 2**20  # bytes per second
        pumping(connection, inbound)
        started = loop.time()
        for step in range(4):  # 1 MiB + headers
            await connection.send(_frame(CHUNK, 1, count=rdma.SLOT_BYTES // 4, step=0), np.zeros(rdma.SLOT_BYTES // 4, np.float32))
        # the fourth message may start once three have had their time on the wire
        assert loop.time() - started >= 3 * rdma.SLOT_BYTES / connection.rate * 0.95
    run(go())


def test_without_pyverbs_the_transport_says_what_to_install(monkeypatch):
    monkeypatch.setattr(rdma, "CMID", None)
    assert "python3-pyverbs" in rdma.unavailable()
    listener = rdma.RdmaListener("127.0.0.1:7003", None)
    with pytest.raises(OSError, match="python3-pyverbs"):
        listener.bind()


def test_the_model_takes_roces_payload_share():
    from orchestrator.agent import transports
    from orchestrator.cost.network import Network, roce_efficiency, roce_mtu

    assert roce_mtu(1500) == 1024 and roce_mtu(9000) == 4096 and roce_mtu(1104) == 1024 and roce_mtu(1103) == 512
    assert roce_efficiency(1500) == pytest.approx(1024 / 1082)
    links = type("Links", (), {"bandwidth": 1e8, "delay": 0.0, "mtu": 1500})()
    wire = transports.get("rdma").wire
    assert Network.from_links(links, wire=wire).efficiency == pytest.approx(1024 / 1082)
    assert Network.from_links(links).efficiency == pytest.approx(1448 / 1514)


def test_a_transfer_that_names_no_nic_goes_to_the_address_the_host_reaches_directly():
    import socket

    def route(network: str, bits: int, direct: bool):
        mask = (2**bits - 1) << (32 - bits)
        as_proc = lambda value: int.from_bytes(value.to_bytes(4, "big"), "little")
        return as_proc(int.from_bytes(socket.inet_aton(network), "big") & mask), as_proc(mask), direct

    # h10 of bcube,2,1: its own subnets on-link, h00's 10.0.0.1 through h00's other NIC
    routes = [route("10.0.1.0", 24, True), route("10.1.0.0", 24, True), route("10.0.0.1", 32, False),
              route("198.18.0.0", 24, True)]
    assert rdma.on_link(["10.0.0.1:7001", "10.0.0.1:7001", "10.1.0.1:7001"], routes) == "10.1.0.1:7001"
    assert rdma.on_link(["10.0.1.2:7001", "10.1.1.2:7001"], routes) == "10.0.1.2:7001"
    # none reached directly (two digits apart): the first, which RoCE cannot answer (symmetric paths only)
    assert rdma.on_link(["10.0.0.9:7001", "10.9.9.9:7001"], routes + [route("10.0.0.0", 16, False)]) == "10.0.0.9:7001"


def test_an_experiment_asking_for_rdma_on_a_lab_without_soft_roce_is_one_line(tmp_path):
    from orchestrator.errors import SpecError
    from orchestrator.spec.experiment import load_experiment

    path = tmp_path / "e.yaml"
    lab = "{name: e, topology: {kind: star, servers: 4}, servers: {runtime: netns}%s}"
    body = "name: e\nlab: %s\nagents: {algorithms: [ring], transport: rdma, workload: {kind: back-to-back, size: 1MB}}\n"
    path.write_text(body % (lab % ""))
    with pytest.raises(SpecError) as refused:
        load_experiment(path)
    message = str(refused.value)
    assert "agents.transport: rdma carries RoCE" in message and "lab.rdma: softroce" in message
    assert "\n" not in message
    path.write_text(body % (lab % ", rdma: softroce"))
    assert load_experiment(path).agents.transport == "rdma"


def test_the_python_api_refuses_rdma_on_a_lab_without_soft_roce_in_one_line():
    from types import SimpleNamespace

    from orchestrator.deploy.lab_agents import LabAgents
    from orchestrator.errors import BadUsage

    lab = SimpleNamespace(name="plain", spec=SimpleNamespace(rdma="none"))
    with pytest.raises(BadUsage, match="rdma: softroce") as refused:
        LabAgents(lab, []).run("ring", [1000], transport="rdma")
    assert "\n" not in str(refused.value)


def test_a_listener_where_this_host_has_no_rdma_is_an_os_error_the_agent_passes_over(monkeypatch):
    """The agent serves the other transports there (agent/server.py catches OSError of an
    optional transport's listener); any other exception would end the agent."""
    if rdma.CMID is None:
        pytest.skip("pyverbs is not installed: unavailable() says so instead (tested above)")

    def no_device():
        raise rdma.PyverbsError("Failed to create CMEventChannel. Errno: 19, No such device")

    monkeypatch.setattr(rdma, "CMEventChannel", no_device)
    with pytest.raises(OSError, match="modprobe rdma_ucm") as raised:
        rdma.RdmaListener("127.0.0.1:7003", None).bind()
    assert raised.value.errno == errno.ENOTSUP  # the agent does not try again every second
