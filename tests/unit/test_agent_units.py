"""Pure parts of the agent: the per-rank plan format, chunk encoding, workloads."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent import plan as plan_format
from orchestrator.agent.transports.grpc_push import PAYLOAD_OFFSET, GrpcStream, decode_chunk, encode_chunk
from orchestrator.agent.proto import testbed_pb2 as pb
from orchestrator.agent.workload import DigitsMLP, check_sum, check_zero, emulated_gradient
from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import partitions
from orchestrator.collectives.schedule import simulate


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300_000), step=st.integers(0, 2**32 - 1), copy=st.booleans())
def test_encoded_chunk_is_a_protobuf_chunk(n, step, copy):
    data = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    head = pb.Chunk(run_id="run", iteration=2, partition=3, step=step, src=1, offset=10, count=n, copy=copy)
    encoded = encode_chunk(head, data)
    # the payload sits 8-byte aligned in the message, so numpy adds it without copying it first
    assert encoded[PAYLOAD_OFFSET : PAYLOAD_OFFSET + data.nbytes] == data.tobytes()
    assert np.frombuffer(decode_chunk(encoded)[1], np.float32).flags.aligned
    parsed = pb.Chunk.FromString(encoded)
    assert (parsed.step, parsed.count, parsed.copy, parsed.offset) == (step, n, copy, 10)
    assert np.array_equal(np.frombuffer(parsed.data, np.float32), data)
    # and our decoder reads it, and protobuf's own encoding, without copying the payload
    for raw in (encoded, pb.Chunk(**{f.name: getattr(parsed, f.name) for f in pb.Chunk.DESCRIPTOR.fields}).SerializeToString()):
        header, payload = decode_chunk(raw)
        assert (header.step, header.count, header.copy, header.run_id, header.data) == (step, n, copy, "run", b"")
        assert np.array_equal(np.frombuffer(payload, np.float32), data)


@pytest.mark.parametrize("algorithm,workers", [("ring", 5), ("mesh", 4), ("ps", 3), ("tree", 6)])
def test_rank_plans_replay_the_schedule(algorithm, workers):
    """Executing every rank's plan step by step (one order the agents' per-range ordering allows) gives the schedule's sums."""
    ctx = Context(workers, options={"shards": 2} if algorithm == "ps" else {})
    tensors = [7, 13, 1, 29]
    parts = partitions(tensors, 24)
    schedules = registry.schedules(algorithm, ctx, sum(tensors), parts)
    ranks = schedules[0][1].ranks
    plans = [plan_format.parse(text) for text in plan_format.build_rank_plans(schedules, ranks)]
    grads = [np.arange(sum(tensors), dtype=np.int64) * (r + 1) for r in range(workers)]
    buffers = [g.copy() for g in grads] + [np.zeros(sum(tensors), np.int64) for _ in range(ranks - workers)]
    for p_index, (part, schedule) in enumerate(schedules):
        for step in range(len(schedule.steps)):
            sends = []
            for rank in range(ranks):
                for s in plans[rank][p_index].steps:
                    if s.step == step:
                        sends += [(rank, x, buffers[rank][x.offset : x.offset + x.count].copy()) for x in s.sends]
            received = {}
            for src, x, data in sends:
                target = buffers[x.dst][x.offset : x.offset + x.count]
                target[:] = data if x.copy else target + data
                received[x.dst] = received.get(x.dst, 0) + x.count
            for rank in range(ranks):
                expected = sum(r.count for s in plans[rank][p_index].steps if s.step == step for r in s.recvs)
                assert received.get(rank, 0) == expected
    reference = simulate_all(schedules, grads, ranks, workers)
    for rank in range(workers):
        assert np.array_equal(buffers[rank], sum(grads))
        assert np.array_equal(buffers[rank], reference[rank])


def simulate_all(schedules, grads, ranks, workers):
    buffers = [g.copy() for g in grads]
    for _, schedule in schedules:
        out = simulate(schedule, buffers)
        buffers = out[:workers]
    return buffers


def test_plan_json_lists_only_steps_a_rank_takes_part_in():
    schedules = registry.schedules("tree", Context(4), 8, partitions([8], None))
    plans = [json.loads(t) for t in plan_format.build_rank_plans(schedules, 4)]
    for rank, data in enumerate(plans):
        for step in data["partitions"][0]["steps"]:
            assert step["send"] or step["recv"]


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(0, 63), iteration=st.integers(0, 1000), size=st.integers(1, 200_000))
def test_emulated_gradient_is_the_documented_pattern(rank, iteration, size):
    out = np.zeros(size, np.float32)
    emulated_gradient(rank, iteration, size, out)
    index = np.arange(size)
    assert np.array_equal(out, (index * 7 + rank * 13 + iteration * 5) % 17 - 8)


def test_check_sum_accepts_the_exact_sum_and_rejects_anything_else():
    size, workers, iteration = 50_000, 5, 3
    total = np.zeros(size, np.float32)
    for rank in range(workers):
        g = np.zeros(size, np.float32)
        emulated_gradient(rank, iteration, size, g)
        total += g
    rng = np.random.default_rng(0)
    assert check_sum(total, workers, iteration, rng)
    total[size - 1] += 1
    assert not check_sum(total, workers, iteration, rng)


def test_digits_fixed_point_sum_is_exact_and_order_free():
    from orchestrator.control.workloads import digits

    workers = 4
    models = [DigitsMLP(digits(workers, r), workers) for r in range(workers)]
    grads = []
    for model in models:
        out = np.zeros(sum(DigitsMLP.tensor_sizes(model.hidden)), np.float32)
        model.gradient(0, out)
        grads.append(out)
    forward = grads[0] + grads[1] + grads[2] + grads[3]
    backward = grads[3] + (grads[2] + (grads[1] + grads[0]))
    assert np.array_equal(forward, backward)  # integers below 2^24: float32 is exact
    assert np.all(np.abs(forward) < 2**24)
    assert len({m.apply(forward.copy()) for m in models}) == 1


def test_channel_options_fix_the_window_or_leave_it_to_bdp_probing():
    from orchestrator.agent.transports.grpc_push import channel_options

    fixed = dict(channel_options(3 * 2**20))
    assert fixed["grpc.http2.bdp_probe"] == 0 and fixed["grpc.http2.lookahead_bytes"] == 3 * 2**20
    probing = dict(channel_options())
    assert probing["grpc.http2.bdp_probe"] == 1 and "grpc.http2.lookahead_bytes" not in probing


@pytest.mark.parametrize(
    "lab, overrides, expected",
    [
        # no netem delay: the floor
        ("star,8", {}, 2**20),
        # star: 2 links across, 5 ms each way on each → RTT 20 ms; 2 × 1 Gbit × 20 ms = 5 MB
        ("star,8", {"links.delay": "5ms"}, 5_000_000),
        # fat-tree k=4: 6 links across, (4 + 1) ms each → RTT 60 ms at 100 Mbit → 2 × 750 kB
        ("fattree,4", {"links.delay": "4ms", "links.jitter": "1ms", "links.bandwidth": "100Mbit"}, 1_500_000),
        # BCube relays through servers: n=4 k=1 is 4 links across; 10 ms → RTT 80 ms at 10 Gbit
        ("bcube,4,1", {"links.delay": "10ms", "links.bandwidth": "10Gbit"}, 200_000_000),
    ],
)
def test_flow_window_is_twice_the_bdp_across_the_diameter(lab, overrides, expected):
    from orchestrator import topology
    from orchestrator.deploy.lab_agents import flow_window
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument(lab, **overrides)
    assert flow_window(spec, topology.from_lab(spec)) == pytest.approx(expected, rel=1e-6)


def _agent_process(code: str, env: dict[str, str]) -> str:
    """Output of `code` run in a fresh interpreter after importing the agent's server module."""
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    script = "import orchestrator.agent.server as server\n" + code
    return subprocess.run([sys.executable, "-c", script], env=base | env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_agent_runs_grpc_on_iomgr_endpoints_unless_the_user_chose():
    assert _agent_process("import os; print(os.environ['GRPC_EXPERIMENTS'])", {}) == \
        "-event_engine_client,-event_engine_listener"
    assert _agent_process("import os; print(os.environ['GRPC_EXPERIMENTS'])", {"GRPC_EXPERIMENTS": "x"}) == "x"


def test_tuned_malloc_serves_message_sized_buffers_without_faulting_pages_in():
    # 200 times four 1 MiB messages in flight, then freed: with glibc's defaults the heap
    # is trimmed and grown again each time, faulting every page back in (~256 per MiB).
    measure = (
        "import resource\n"
        "{tune}\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for i in range(200): held = [bytearray(2**20 + i) for _ in range(4)]; del held\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    default = int(_agent_process(measure.format(tune=""), {}))
    tuned = int(_agent_process(measure.format(tune="server._tune_malloc()"), {}))
    assert default > 200 * 4 * 128
    assert tuned < default / 20


KIB = 1024


def test_a_run_of_small_messages_gives_freed_messages_back():
    """A rank with many peers (a 16-rank mesh's): what its messages free goes back to the
    system even among messages still held; with few (a ring's) the heap keeps it (the test
    above says why)."""
    measure = (
        "server._tune_malloc()\n"
        "server._set_mmap_threshold(server.mmap_threshold({peers}))\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "before = rss()\n"
        "held = [bytearray(128 * 1024) for _ in range(200)]\n"
        "kept = held[::10]; del held\n"
        "print(rss() - before)\n"
    )
    def rank_peers(algorithm: str, workers: int) -> int:
        schedules = registry.schedules(algorithm, Context(workers), 10_000, partitions([10_000], None))
        return plan_format.peers(plan_format.parse(plan_format.build_rank_plans(schedules, workers)[0]))

    assert rank_peers("mesh", 16) == 15 and rank_peers("ring", 8) == 2
    retained_small = int(_agent_process(measure.format(peers=rank_peers("mesh", 16)), {}))
    retained_heap = int(_agent_process(measure.format(peers=rank_peers("ring", 8)), {}))
    assert retained_heap > 200 * 128 * KIB * 0.8  # 25 MiB freed but kept by the heap
    assert retained_small < retained_heap / 4


@pytest.mark.parametrize("algorithm, workers, part_bytes, credit, expected", [
    ("ring", 8, None, 0, 1024 * KIB), ("ring", 17, None, 0, 1024 * KIB),  # one stream in: the most
    ("ring", 8, 8_000, 8_000, 1024 * KIB),  # one partition in flight at a time
    ("ring", 8, 8_000, 16_000, 1024 * KIB),  # two at once: two streams from the neighbour, 2 MiB
    ("ring", 8, 8_000, 0, 256 * KIB),  # every partition (5) at once
    ("tree", 2, None, 0, 1024 * KIB),
    ("halving-doubling", 8, None, 0, 512 * KIB),  # three partners over its steps
    ("tree", 5, None, 0, 512 * KIB), ("mesh", 4, None, 0, 512 * KIB),  # a root of three children; three peers
    ("mesh", 16, None, 0, 128 * KIB), ("mesh", 64, None, 0, 64 * KIB),  # never under 64 KiB
])
def test_grpc_message_size_shrinks_when_a_rank_has_several_streams_coming_in(algorithm, workers, part_bytes, credit,
                                                                             expected):
    schedules = registry.schedules(algorithm, Context(workers), 10_000, partitions([10_000], part_bytes))
    assert plan_format.chunk_bytes(schedules, credit, transport="grpc") == expected
    # read straight into the buffer, tcp's chunks hold nothing in flight: always the largest
    assert plan_format.chunk_bytes(schedules, credit, transport="tcp") == plan_format.MAX_CHUNK_BYTES


class _EndedCall:
    """A Data.Push call the receiver ended after `accepts` chunks with `ack` (a fake of
    grpc.aio's StreamUnaryCall: write, done_writing, await)."""

    def __init__(self, accepts: int, ack: pb.Ack) -> None:
        self.accepts, self.ack, self.written = accepts, ack, 0

    async def write(self, message: bytes) -> None:
        if self.written == self.accepts:
            raise RuntimeError("the call is over")  # what grpc.aio raises is not the reason
        self.written += 1

    async def done_writing(self) -> None:
        pass

    def __await__(self):
        yield from []
        return self.ack


def _engine_sending_to(call: _EndedCall):
    from orchestrator.agent.engine import Engine, _PartitionState, _Range

    engine = Engine("run", 0, [], np.arange(10, dtype=np.float32), {1: {"node": "h1", "address": "-", "by_nic": {}}},
                    chunk_bytes=8, credit_bytes=0, counters=lambda *_: None, transport="grpc")
    engine.sender.stream = lambda target: GrpcStream(call)
    engine.iteration = 0
    engine.states = {0: _PartitionState(sending={(0, 0): _Range(0, 1, 0, 10)})}
    return engine


def test_a_receiver_that_ends_a_stream_early_is_named_with_its_reason():
    import asyncio

    call = _EndedCall(1, pb.Ack(ok=False, error="ValueError: chunk for finished iteration 3"))
    engine = _engine_sending_to(call)
    with pytest.raises(RuntimeError, match=r"^sending to rank 1 \(h1\): ValueError: chunk for finished iteration 3$"):
        asyncio.run(engine._send(0, 0, plan_format.Send(dst=1, offset=0, count=10, copy=False, nic=-1), (0, 0)))
    assert call.written == 1


def test_a_refusal_at_the_end_of_a_stream_fails_the_allreduce_naming_the_peer():
    import asyncio

    engine = _engine_sending_to(_EndedCall(99, pb.Ack(ok=False, error="ValueError: chunk carries 3 elements")))

    async def send_then_collect():
        await engine._send(0, 0, plan_format.Send(dst=1, offset=0, count=10, copy=False, nic=-1), (0, 0))
        await engine._finish_streams(0)
        await engine._acknowledged()

    with pytest.raises(RuntimeError, match=r"^rank 1 \(h1\) refused a transfer: ValueError: chunk carries 3"):
        asyncio.run(send_then_collect())


def test_gst_is_the_slowest_agents_time_per_iteration():
    from orchestrator.control.driver import RunResult

    def agent(rank, *iterations):
        records = [pb.IterationRecord(iteration=i, start_time=start, gst_seconds=gst) for i, (start, gst) in enumerate(iterations)]
        return pb.RunResults(rank=rank, records=records)

    result = RunResult("r", "ring", [agent(0, (0.0, 1.0), (2.0, 1.5)), agent(1, (0.3, 0.7), (2.1, 1.0)),
                                     pb.RunResults(rank=2)], 8, 4.0)  # a rank without records is left out
    assert result.gst() == [1.0, 1.5]


def test_back_to_back_time_is_each_agents_loop_after_the_warm_up_over_its_operations():
    from orchestrator.control.driver import RunResult

    def agent(rank, *iterations):
        records = [pb.IterationRecord(iteration=i, start_time=start, gst_seconds=gst) for i, (start, gst) in enumerate(iterations)]
        return pb.RunResults(rank=rank, records=records)

    # rank 0: warm-up 0-5 (left out), loop 5.0-7.0 over 2 operations; rank 1: 5.1-7.5
    result = RunResult("r", "ring", [agent(0, (0.0, 5.0), (5.0, 1.0), (6.0, 1.0)),
                                     agent(1, (0.0, 5.1), (5.1, 1.4), (6.5, 1.0)), pb.RunResults(rank=2)], 8, 9.0)
    assert result.back_to_back_times() == pytest.approx([1.0, 1.2])
    with pytest.raises(ValueError, match="warm-up"):
        RunResult("r", "ring", [agent(0, (0.0, 5.0))], 8, 5.0).back_to_back_times()


def test_a_back_to_back_iteration_is_checked_to_have_reduced_zeros():
    rng = np.random.default_rng(0)
    buffer = np.zeros(100_000, dtype=np.float32)
    assert check_zero(buffer, rng)
    buffer[-1] = 1  # the last position is always among those sampled
    assert not check_zero(buffer, rng)


def test_an_agents_long_poll_answers_when_the_run_ends_not_at_its_timeout():
    from orchestrator.agent.metrics import Metrics
    from orchestrator.agent.server import Agent

    async def scenario() -> tuple[float, float]:
        agent = Agent("h0", Metrics("h0"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        await agent.wait(30)  # no run: at once
        idle = loop.time() - started
        agent.ended.clear()  # as Start does
        loop.call_later(0.2, agent.ended.set)  # as the run's end does
        started = loop.time()
        await agent.wait(30)
        return idle, loop.time() - started

    idle, running = asyncio.run(scenario())
    assert idle < 1 and 0.15 < running < 10


class _RecordingCall:
    """A Data.Push call that records the chunks written into it; `gate`, when given, holds
    every write until it is set."""

    def __init__(self, gate=None) -> None:
        self.chunks: list[tuple[pb.Chunk, np.ndarray]] = []
        self.gate = gate

    async def write(self, message: bytes) -> None:
        if self.gate is not None:
            await self.gate.wait()
        head, payload = decode_chunk(message)
        self.chunks.append((head, np.frombuffer(payload, np.float32).copy()))

    async def done_writing(self) -> None:
        pass

    def __await__(self):
        yield from []
        return pb.Ack(ok=True)


def _engine_of(steps: list[plan_format.Step], call: _RecordingCall, size: int = 4):
    """Rank 0 of two, one partition over `size` elements of ones, chunks of 2 elements."""
    from orchestrator.agent.engine import Engine

    plans = [plan_format.PartitionPlan(0, 0, size, 0, steps)]
    engine = Engine("run", 0, plans, np.ones(size, np.float32), {1: {"node": "h1", "address": "-", "by_nic": {}}},
                    chunk_bytes=8, credit_bytes=0, counters=lambda *_: None, transport="grpc")
    engine.sender.stream = lambda target: GrpcStream(call)
    return engine


def _chunk(step: int, offset: int, value: float, copy: bool = False) -> tuple[pb.Chunk, memoryview]:
    head = pb.Chunk(run_id="run", iteration=0, partition=0, step=step, src=1, offset=offset, count=2, copy=copy)
    return head, memoryview(np.full(2, value, np.float32).tobytes())


def _receive_then_forward() -> list[plan_format.Step]:
    """Step 0 receives [0, 4) from rank 1 (two chunks); step 1 sends that range back."""
    return [
        plan_format.Step(0, [], [plan_format.Recv(1, 0, 4)]),
        plan_format.Step(1, [plan_format.Send(1, 0, 4, False, -1)], []),
    ]


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_reduced_chunk_is_forwarded_before_the_rest_of_its_step_arrives():
    """Per-range ordering, as NCCL pipelines a ring: step 1 sends what step 0 receives, and
    its first chunk leaves as soon as that chunk is reduced, not after the whole range."""
    call = _RecordingCall()
    engine = _engine_of(_receive_then_forward(), call)

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        await engine._accept_chunk(*_chunk(0, 0, 10))
        await _settle()
        forwarded_early = [(h.step, h.offset, list(data)) for h, data in call.chunks]
        await engine._accept_chunk(*_chunk(0, 2, 20))
        await asyncio.wait_for(run, 5)
        return forwarded_early

    assert asyncio.run(scenario()) == [(1, 0, [11.0, 11.0])]
    assert [(h.offset, list(data)) for h, data in call.chunks] == [(0, [11.0, 11.0]), (2, [21.0, 21.0])]


def test_a_received_chunk_waits_for_an_earlier_steps_send_of_its_range():
    """A step-1 copy into [0, 2) must not land before step 0 has sent [0, 2) out: the send
    would carry the new values."""
    gate = asyncio.Event()
    call = _RecordingCall(gate)
    engine = _engine_of([
        plan_format.Step(0, [plan_format.Send(1, 0, 4, False, -1)], []),
        plan_format.Step(1, [], [plan_format.Recv(1, 0, 2), plan_format.Recv(1, 2, 2)]),
    ], call)

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        landing = asyncio.create_task(engine._accept_chunk(*_chunk(1, 0, 7, copy=True)))
        await _settle()
        held = engine.buffer.tolist()
        gate.set()
        await landing
        await engine._accept_chunk(*_chunk(1, 2, 8, copy=True))
        await asyncio.wait_for(run, 5)
        return held

    assert asyncio.run(scenario()) == [1.0, 1.0, 1.0, 1.0]
    assert [list(data) for _, data in call.chunks] == [[1.0, 1.0], [1.0, 1.0]]  # sent before overwritten
    assert engine.buffer.tolist() == [7.0, 7.0, 8.0, 8.0]


def test_a_chunk_nobody_planned_is_refused():
    engine = _engine_of([plan_format.Step(0, [], [plan_format.Recv(1, 0, 2)])], _RecordingCall(), size=2)

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        await _settle()
        try:
            with pytest.raises(ValueError, match=r"unexpected chunk: step 3"):
                await engine._accept_chunk(*_chunk(3, 0, 1))
        finally:
            run.cancel()

    asyncio.run(scenario())


def test_a_transfers_next_chunk_is_admitted_on_the_reading_thread_once_the_last_has_landed_there():
    """The tcp transport's reading thread applies a chunk and moves its range on itself
    (`land`), so the transfer's next chunk is admitted right there (`admit_now`) without a
    round trip through the event loop, which does not run meanwhile here; what waited on
    the range (the forward of step 1) goes on once the loop hears of it (`after_landing`)."""
    import threading

    call = _RecordingCall()
    engine = _engine_of(_receive_then_forward(), call)
    admitted = []

    def reading_thread() -> None:
        for offset, value in ((0, 10.0), (2, 20.0)):
            head, payload = _chunk(0, offset, value)
            admitted.append(engine.admit_now(head))
            engine.buffer[offset:offset + 2] += np.frombuffer(payload, np.float32)
            engine.land(head, "h1")

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        await _settle()
        thread = threading.Thread(target=reading_thread)
        thread.start()
        thread.join()  # the loop is blocked meanwhile: every admission was the thread's own
        engine.after_landing()
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())
    assert admitted == [True, True]
    assert [(h.offset, list(data)) for h, data in call.chunks] == [(0, [11.0, 11.0]), (2, [21.0, 21.0])]
    assert engine.received == 16


def test_a_landing_wakes_the_loop_only_when_something_waits_that_may_go_on():
    """`land` (on a reading thread) asks for the loop (`after_landing`) only when a waiter's
    condition now holds: here the forward of step 1 waits on the range's first chunk, so
    that chunk's landing asks for it; the second chunk's, which no one waits for yet (the
    forward is blocked writing its first chunk), does not."""
    gate = asyncio.Event()
    call = _RecordingCall(gate)
    engine = _engine_of(_receive_then_forward(), call)

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        await _settle()  # the forward waits on [0, 2)
        first, _ = _chunk(0, 0, 10.0)
        assert engine.admit_now(first)
        assert engine.land(first, "h1") is True
        engine.after_landing()
        await _settle()  # the forward writes [0, 2), held by the gate: nothing waits on [2, 4)
        second, _ = _chunk(0, 2, 20.0)
        assert engine.admit_now(second)
        assert engine.land(second, "h1") is False
        gate.set()
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())
    assert [h.offset for h, _ in call.chunks] == [0, 2]


def test_a_waiter_listed_just_after_a_landing_it_missed_does_not_sleep():
    """A chunk landing on a reading thread between `_until`'s check and its listing of the
    waiter wakes no one (no waiter was listed yet): `_until` looks once more once listed.
    Here the condition turns true right after its first check, and nothing else ever wakes
    the loop."""
    engine = _engine_of([plan_format.Step(0, [], [])], _RecordingCall())
    looked = []

    def ready() -> bool:
        # a chunk lands right after the first look, and the thread then looks for waiters:
        # true only once this waiter is listed (a second look before listing is too early)
        listed = any(entry[0] is ready for entry in engine.waiters)
        if not looked:
            looked.append(engine._awaited())  # the landing's look: no waiter listed yet
        return listed

    async def scenario():
        await asyncio.wait_for(engine._until(ready), 2)

    asyncio.run(scenario())
    assert looked == [False]


def test_waiters_stay_listed_while_the_loop_checks_them():
    """While the loop goes over its waiters (`_recheck`), a reading thread may land a chunk and
    look for a waiter to wake: every waiter not yet let go must still be listed then, or the
    landing wakes no one and that waiter sleeps. Here the thread's look happens inside the
    first waiter's check and must find the second one, whose condition the landing met."""
    engine = _engine_of([plan_format.Step(0, [], [])], _RecordingCall())
    landed, seen = [False], []

    def first() -> bool:
        if not landed[0]:  # once: a reading thread lands a chunk now, then looks for waiters
            landed[0] = True
            seen.append(engine._awaited())
        return False

    async def scenario():
        loop = asyncio.get_running_loop()
        engine.waiters.append((first, lambda error: None, loop.create_future()))
        second = asyncio.create_task(engine._until(lambda: landed[0]))
        await _settle()
        engine._recheck()
        await asyncio.wait_for(second, 2)

    asyncio.run(scenario())
    assert seen == [True]


def test_a_waiter_stays_listed_while_its_own_condition_is_checked():
    """The waiter the loop is checking when a chunk lands: its check read the state before
    the landing (False), so the landing's look must find it listed and wake the loop, whose
    next pass lets it go. Unlisted while checked, it would sleep with its condition met."""
    engine = _engine_of([plan_format.Step(0, [], [])], _RecordingCall())
    state, looks, released = {"landed": False, "inside": False}, [], []

    def ready() -> bool:
        value = state["landed"]  # read before the landing
        if not value and not state["inside"]:
            state["inside"], state["landed"] = True, True  # a reading thread lands now and looks
            looks.append(engine._awaited())
            state["inside"] = False
        return value

    async def scenario():
        loop = asyncio.get_running_loop()
        engine.waiters.append((ready, released.append, loop.create_future()))
        engine._recheck()  # its check is the stale one
        assert released == []
        if looks == [True]:  # the landing woke the loop
            engine._recheck()

    asyncio.run(scenario())
    assert looks == [True] and released == [None]


def test_a_condition_that_raises_wakes_the_loop_to_raise_it():
    engine = _engine_of([plan_format.Step(0, [], [])], _RecordingCall())

    def broken() -> bool:
        raise ValueError("unexpected chunk")

    engine.waiters.append((broken, lambda error: None, None))
    assert engine._awaited() is True


class _Watched(dict):
    """`receiving`, checking after every change that the elements still due stay listed:
    what the event loop, reading it without the lock, may see at any moment."""

    def __init__(self, items, due):
        super().__init__(items)
        self.due = due  # () -> the elements still to come

    def _check(self):
        listed = {e for r in self.values() for e in range(r.lo, r.hi)}
        assert self.due() <= listed, f"{sorted(self.due() - listed)} due but not listed"

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._check()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._check()

    def pop(self, *args):
        value = super().pop(*args)
        self._check()
        return value


def test_a_range_moved_on_by_a_reading_thread_is_never_missing_while_some_of_it_is_due():
    """The loop reads the ranges without the lock while a reading thread moves them on
    (land): between any two changes, what is still to come must be listed, or a later
    step's send or copy passes early and a partition ends with chunks still to come."""
    call = _RecordingCall()
    engine = _engine_of([plan_format.Step(0, [], [plan_format.Recv(1, 0, 6)])], call, size=6)
    landed = [0]

    async def scenario():
        run = asyncio.create_task(engine.allreduce(0))
        await _settle()
        state = engine.states[0]
        state.receiving = _Watched(state.receiving, lambda: set(range(landed[0], 6)))
        for offset in (0, 2, 4):
            head, payload = _chunk(0, offset, 1.0)
            assert engine.admit_now(head)
            landed[0] = offset + 2  # applied: from here on only the rest is due
            engine.land(head, "h1")
            engine.after_landing()
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())
    assert engine.received == 24
