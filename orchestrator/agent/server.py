"""`testbed-agent`: one process per server, a gRPC Control service on the management address
and the data plane on the data-plane addresses: a gRPC Data service on each address's port
and each transport's listener on the ports after it (agent/transports).

    TESTBED_AGENT_TOKEN=… testbed-agent --node h00 --control 198.18.0.2:7000 \
                  --data 10.0.0.1:7001,10.1.0.1:7001 --metrics 198.18.0.2:9100

    testbed-agent --config /etc/testbed/agent/agent.json      # what a deployed agent runs

Every Control call must carry the token given in TESTBED_AGENT_TOKEN, or in the file the
config names (mode 0600: see agent/auth.py). Data stays open to any peer of the fabric: peers are other
agents, which would all hold a lab-wide secret alike, and a Push is accepted only for the run
Control configured.

Beside Control, the Control address serves the standard `grpc.health.v1.Health` (Check and
Watch; services "", "testbed.Control" and "testbed.Data") and server reflection, without a
token: probes (grpc_health_probe, Kubernetes' gRPC probes, `grpcurl list`) carry none, and
what they learn (that the agent is up, the names in testbed.proto) is public. SIGTERM (what
a supervisor sends) turns every status NOT_SERVING, then stops the agent.

The orchestrator configures a run (this rank's plan, its peers' addresses, the workload),
starts it, polls status and collects per-iteration records; see orchestrator/control.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import json
import os
import resource
import signal
import time
import traceback
from pathlib import Path

# Before gRPC loads. Its EventEngine TCP endpoints hand every read and write between their own
# threads and the caller's; iomgr's endpoints do the I/O on the polling thread. In a CPU-bound
# ring (8 agents, 1 Gbit, 2 cores) that took busbw from ~0.56 to ~0.66 × link, medians of 7
# interleaved runs. A GRPC_EXPERIMENTS set by the user wins.
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client,-event_engine_listener")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_health.v1.health import aio as health_aio  # noqa: E402
from grpc_reflection.v1alpha import reflection  # noqa: E402

from orchestrator.agent import plan as plan_format  # noqa: E402
from orchestrator.agent import workload as workloads  # noqa: E402
from orchestrator.agent.auth import TOKEN_ENV, TokenCheck  # noqa: E402
from orchestrator.agent import transports  # noqa: E402
from orchestrator.agent.engine import Engine  # noqa: E402
from orchestrator.agent.native import engine as _native  # noqa: E402,F401 - tcp's native engine
from orchestrator.agent.transports.grpc_push import channel_options, decode_chunk  # noqa: E402
from orchestrator.agent.metrics import Metrics  # noqa: E402
from orchestrator.agent.proto import testbed_pb2 as pb  # noqa: E402
from orchestrator.agent.proto import testbed_pb2_grpc as pb_grpc  # noqa: E402


MAX_START_WAIT = 5.0  # seconds; a start time further ahead means clocks that disagree
PENDING_AFTER = 1.0  # seconds stalled before Status lists the pending transfers (they cost a walk)


class Agent:
    def __init__(self, node: str, metrics: Metrics, window_bytes: int = 0) -> None:
        self.node = node
        self.window_bytes = window_bytes
        self.metrics = metrics
        self.state = "idle"
        self.error = ""
        self.config: pb.RunConfig | None = None
        self.engine: Engine | None = None
        self.records: list[pb.IterationRecord] = []
        self.recorded = asyncio.Condition()  # notified on every record and when a run ends
        self.model: workloads.DigitsMLP | None = None
        self.iteration = 0
        self.task: asyncio.Task | None = None
        self.ready = asyncio.Condition()
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.ended = asyncio.Event()  # set while no run is going on (see `wait`)
        self.ended.set()
        self.buffer_bytes = 0
        self.watched = time.monotonic()  # an orchestrator's last Configure, Start or Wait (see `status`)
        self.repaced = 0  # the sequence of the configured run's last Repace taken

    # -- control ----------------------------------------------------------------------------
    async def configure(self, config: pb.RunConfig) -> None:
        if self.state == "running":
            raise RuntimeError("a run is in progress: Stop it first")
        if self.engine is not None:
            await self.engine.close()
            # the last run's calls sit in reference cycles (a cancelled send's traceback holds
            # its call, the finished task its traceback), each holding its connection open
            if self.task is not None and self.task.done():
                self.task = None
            gc.collect()
        peers = {
            p.rank: {"address": p.address, "by_nic": dict(p.by_nic), "node": p.node} for p in config.peers
        }
        plans = plan_format.parse(config.plan_json)
        _set_mmap_threshold(mmap_threshold(plan_format.peers(plans)))  # before the buffer: it stays out of the heap
        buffer = np.zeros(config.size, dtype=np.float32)
        self.buffer_bytes = buffer.nbytes
        arguments = (
            config.run_id, config.rank, plans, buffer, peers,
            config.chunk_bytes or plan_format.DEFAULT_CHUNK_BYTES, config.credit_bytes, self.metrics.count_bytes,
            self.window_bytes, plan_format.link_rate(config.plan_json), config.transport, config.trace,
        )
        own = transports.get(config.transport).engine  # a transport that moves chunks itself
        self.engine = (own(*arguments) if own is not None else None) or Engine(*arguments)
        # connected before Start: the orchestrator may read the connections' paths in between
        await self.engine.connect()
        self.watched = time.monotonic()
        async with self.ready:
            self.config, self.records, self.error, self.iteration = config, [], "", config.first_iteration
            self.repaced = 0
            self.model = None
            self.state = "configured"
            self.ready.notify_all()
        self.metrics.rank.set(config.rank)
        self.metrics.gradient.set(buffer.nbytes)
        self.metrics.workers.set(config.workers)

    def start(self, run_id: str, start_at: float = 0.0, plan_json: str = "") -> None:
        if self.config is None or self.config.run_id != run_id:
            raise RuntimeError(f"run {run_id!r} is not the configured one")
        if self.state != "configured":
            raise RuntimeError(f"cannot start from state {self.state}")
        if plan_json:
            self.engine.replan(plan_format.parse(plan_json), plan_format.link_rate(plan_json))
        self.state, self.watched = "running", time.monotonic()
        self.ended.clear()
        self.task = asyncio.create_task(self._run(start_at))
        self.task.add_done_callback(lambda _: (self.ended.set(), asyncio.create_task(self._notify())))

    def repace(self, run_id: str, plan_json: str, sequence: int) -> None:
        """The running run's plan with shares over the links as they are now: from its next
        iteration on (Engine.replan). One older than the last taken (`sequence`) is passed over."""
        if self.config is None or self.config.run_id != run_id:
            raise RuntimeError(f"run {run_id!r} is not the configured one")
        if self.state not in ("configured", "running"):
            raise RuntimeError(f"cannot repace a run that is {self.state}")
        if sequence <= self.repaced:
            return
        self.engine.replan(plan_format.parse(plan_json), plan_format.link_rate(plan_json))
        self.repaced = sequence

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping anyway
                pass
        if self.state == "running":
            self.state, self.error = "failed", "stopped"

    async def _notify(self) -> None:
        async with self.recorded:
            self.recorded.notify_all()

    async def wait(self, timeout: float, live: bool = True, records_from: int | None = None) -> None:
        """Return once no run is going on, or after `timeout` seconds: the orchestrator's
        long poll. Polling Status instead (20 a second per agent) cost the orchestrator 5 %
        of a core, and the agents as much, in runs where the agents were short of CPU.
        `live`: its caller still waits for the answer (a frozen agent, thawed, serves the
        calls that queued meanwhile, long given up: they do not count as watching)."""
        if live:
            self.watched = time.monotonic()
        try:
            if records_from is None:
                await asyncio.wait_for(self.ended.wait(), timeout)
            else:  # also once a record beyond `records_from` exists
                async with self.recorded:
                    await asyncio.wait_for(self.recorded.wait_for(
                        lambda: self.ended.is_set() or len(self.records) > records_from), timeout)
        except TimeoutError:
            pass
        if live:
            self.watched = time.monotonic()

    def status(self) -> pb.AgentStatus:
        """What the orchestrator polls. A pure read (it does not count as watching): the
        driver asks it before configuring to tell a stale run from another driver's."""
        config, engine = self.config, self.engine
        stalled = engine.stalled_seconds() if engine is not None and self.state == "running" else 0.0
        return pb.AgentStatus(
            state=self.state, run_id=config.run_id if config else "", rank=config.rank if config else 0,
            iteration=self.iteration, error=self.error, stalled_seconds=stalled,
            unwatched_seconds=time.monotonic() - self.watched,
            pending=engine.pending() if stalled >= PENDING_AFTER else (),
        )

    async def engine_for(self, run_id: str) -> Engine:
        """The engine of run `run_id`, waiting for it to be configured (peers may be early)."""
        async with self.ready:
            await asyncio.wait_for(
                self.ready.wait_for(lambda: self.config is not None and self.config.run_id == run_id), 60
            )
        return self.engine

    # -- a run ------------------------------------------------------------------------------
    async def _run(self, start_at: float = 0.0) -> None:
        config, engine = self.config, self.engine
        spec = json.loads(config.workload_json or "{}")
        worker = config.role == "worker"
        model = workloads.DigitsMLP(spec, config.workers) if worker and spec.get("kind") == "real" else None
        if model is not None and config.state:
            model.restore(config.state)  # joining a run under way: its current parameters
        self.model = model
        back_to_back = spec.get("kind") == "back-to-back"
        # who contributes: identities survive re-ranking when a run re-forms over survivors
        members = list(config.members) or list(range(config.workers))
        identity = config.identity if config.members else config.rank
        rng = np.random.default_rng(config.rank)
        try:
            await engine.connect()
            # every rank enters iteration 0 at the same instant: ranks that start apart stay
            # apart for several back-to-back iterations (16 ranks of a mesh, started as the
            # Start calls arrived, drifted 0.4-0.8 s apart and took 7 iterations to settle)
            await asyncio.sleep(min(MAX_START_WAIT, max(0.0, start_at - time.time())))
            synced = None  # when the last allreduce ended: what the rank did since is its compute
            for iteration in range(config.first_iteration, config.first_iteration + config.iterations):
                self.iteration = iteration
                timed_loop = back_to_back and iteration > 0  # after the warm-up: no refill (see workloads)
                # compute is the time between a rank's synchronisations: the last result's use
                # (a model's step and digest, the sum's check) counts as much as the next
                # gradient (the digits MLP's step and digest took as long as its gradient)
                started = time.perf_counter() if synced is None else synced
                loss = 0.0
                if not worker:
                    engine.buffer[:] = 0
                elif model is not None:
                    loss = model.gradient(iteration, engine.buffer)
                elif timed_loop:
                    if iteration == 1:
                        engine.buffer[:] = 0  # once: what follows is NCCL-tests' timed loop
                else:
                    # off the event loop: it keeps answering peers meanwhile (the Acks that
                    # end their allreduce), as a real worker's compute leaves its
                    # communication thread free
                    await asyncio.to_thread(
                        workloads.emulated_gradient, identity, iteration, len(engine.buffer), engine.buffer
                    )
                contribution = workloads.checksum(engine.buffer) if worker and not timed_loop else None
                if worker and not back_to_back:
                    await workloads.compute(spec, started, iteration)
                compute_s = time.perf_counter() - started
                sent, received = engine.sent, engine.received
                wall, begin = time.time(), time.perf_counter()
                await engine.allreduce(iteration)
                synced = time.perf_counter()
                gst = synced - begin
                record = pb.IterationRecord(
                    iteration=iteration, gst_seconds=gst, compute_seconds=compute_s,
                    bytes_sent=engine.sent - sent, bytes_received=engine.received - received,
                    start_time=wall,
                )
                if contribution is not None:
                    record.contribution, record.aggregate = str(contribution), str(workloads.checksum(engine.buffer))
                    record.members.extend(members)
                if model is not None:
                    record.loss, record.param_digest = loss, model.apply(engine.buffer)
                    self.metrics.loss.set(loss)
                elif worker:
                    record.verified = workloads.check_zero(engine.buffer, rng) if timed_loop \
                        else workloads.check_sum(engine.buffer, config.workers, iteration, rng, members)
                    if not record.verified:
                        raise RuntimeError(f"iteration {iteration}: the reduced buffer is wrong")
                self.records.append(record)
                await self._notify()
                self.metrics.gst.labels(config.algorithm).observe(gst)
                self.metrics.compute.observe(compute_s)
                self.metrics.iterations.labels(config.algorithm).inc()
            self.state = "done"
        except asyncio.CancelledError:
            self.state, self.error = "failed", "stopped"
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, not lost
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self.metrics.errors.inc()
            traceback.print_exc()

    def results(self) -> pb.RunResults:
        usage = peak_rss_mib()
        return pb.RunResults(
            run_id=self.config.run_id if self.config else "", rank=self.config.rank if self.config else 0,
            node=self.node, records=self.records, error=self.error,
            peak_rss_mib=usage, buffer_mib=self.buffer_bytes / 2**20,
            state=self.model.state() if self.model is not None else b"",
            transfers=(self.engine.spans or []) if self.engine is not None else [],
        )


def peak_rss_mib() -> float:
    """This process's peak resident memory since its exec, in MiB.

    Not getrusage's ru_maxrss: Linux carries that across exec from the process that forked,
    so an agent launched by an orchestrator of ~90 MiB reported ~90 MiB however small it
    stayed. VmHWM is the high-water mark of this program's own address space."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ControlService(pb_grpc.ControlServicer):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def Configure(self, request, context):  # noqa: N802 (gRPC's names)
        try:
            await self.agent.configure(request)
            return pb.Ack(ok=True)
        except Exception as exc:  # noqa: BLE001 - the reply carries it
            return pb.Ack(ok=False, error=f"{type(exc).__name__}: {exc}")

    async def Start(self, request, context):  # noqa: N802
        try:
            self.agent.start(request.run_id, request.start_at, request.plan_json)
            return pb.Ack(ok=True)
        except Exception as exc:  # noqa: BLE001
            return pb.Ack(ok=False, error=str(exc))

    async def Repace(self, request, context):  # noqa: N802
        try:
            self.agent.repace(request.run_id, request.plan_json, request.sequence)
            return pb.Ack(ok=True)
        except Exception as exc:  # noqa: BLE001
            return pb.Ack(ok=False, error=f"{type(exc).__name__}: {exc}")

    async def Status(self, request, context):  # noqa: N802
        return self.agent.status()

    async def Wait(self, request, context):  # noqa: N802
        remaining = context.time_remaining()
        live = remaining is None or remaining > 0
        records_from = request.records_from if request.records else None
        await self.agent.wait(min(request.timeout_seconds, 60.0) if live else 0.0, live, records_from)
        status = self.agent.status()
        if records_from is not None:
            status.records.extend(self.agent.records[records_from:])
        return status

    async def Results(self, request, context):  # noqa: N802
        return self.agent.results()

    async def Stop(self, request, context):  # noqa: N802
        await self.agent.stop()
        return pb.Ack(ok=True)

    async def Health(self, request, context):  # noqa: N802
        return pb.HealthReply(ok=True, node=self.agent.node, pid=os.getpid(), uptime_seconds=time.time() - self.agent.started)

    async def Shutdown(self, request, context):  # noqa: N802
        self.agent.stopping.set()
        return pb.Ack(ok=True)


class DataService:
    """Data.Push, registered with raw requests so payloads reach numpy without a copy."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def handler(self) -> grpc.GenericRpcHandler:
        push = grpc.stream_unary_rpc_method_handler(
            self.push, request_deserializer=None, response_serializer=pb.Ack.SerializeToString
        )
        return grpc.method_handlers_generic_handler("testbed.Data", {"Push": push})

    async def push(self, request_iterator, context):
        try:
            first = decode_chunk(await anext(request_iterator))
            engine = await self.agent.engine_for(first[0].run_id)
            await engine.accept(first, (decode_chunk(raw) async for raw in request_iterator))
            return pb.Ack(ok=True)
        except Exception as exc:  # noqa: BLE001 - the sender reports it
            return pb.Ack(ok=False, error=f"{type(exc).__name__}: {exc}")


CONTROL_SERVICE = pb.DESCRIPTOR.services_by_name["Control"].full_name  # testbed.Control
DATA_SERVICE = pb.DESCRIPTOR.services_by_name["Data"].full_name  # testbed.Data
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name  # grpc.health.v1.Health
# what a caller without the token may call: the probes' protocols
OPEN_SERVICES = (HEALTH_SERVICE, reflection.SERVICE_NAME)


class ControlAccess(TokenCheck):
    """The token check, except for health and reflection (see the module's docstring)."""

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method.lstrip("/").rsplit("/", 1)[0] in OPEN_SERVICES:
            return await continuation(details)
        return await super().intercept_service(continuation, details)


async def serve(
    node: str, control: str, data: list[str], metrics_at: str | None, token: str, window_bytes: int = 0
) -> None:
    metrics = Metrics(node)
    if metrics_at:
        host, _, port = metrics_at.rpartition(":")
        try:
            metrics.serve(host, int(port))
        except OSError as exc:
            raise SystemExit(f"testbed-agent: cannot listen on {metrics_at} (metrics): {exc.strerror}") from None
    agent = Agent(node, metrics, window_bytes)
    health = health_aio.HealthServicer()  # "" is SERVING from the start: the process answers
    for service in (CONTROL_SERVICE, DATA_SERVICE):
        await health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    control_server = grpc.aio.server(options=channel_options(), interceptors=[ControlAccess(token)])
    pb_grpc.add_ControlServicer_to_server(ControlService(agent), control_server)
    health_pb2_grpc.add_HealthServicer_to_server(health, control_server)
    reflection.enable_server_reflection((CONTROL_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), control_server)
    _bind(control_server, control)
    data_server = grpc.aio.server(options=channel_options(window_bytes))
    data_server.add_generic_rpc_handlers((DataService(agent).handler(),))
    for address in data:
        _bind(data_server, address)
    listeners, later = [], []
    for transport in transports.with_listeners():  # tcp, rdma, a user's: each on every data address
        for address in data:
            listener = transport.listener(transports.address_for(transport.name, address), agent.engine_for)
            try:
                listener.bind()
            except OSError as exc:
                if transport.optional:  # e.g. rdma on a NIC without an rxe device: the others serve
                    never = exc.errno == errno.ENOTSUP  # this host has no such transport at all
                    again = "" if never else f" yet (tried again every {RELISTEN_S:g} s)"
                    print(f"testbed-agent {node}: no {transport.name} transport on {address}{again}: "
                          f"{exc.strerror or exc}", flush=True)
                    if not never:
                        later.append(listener)
                    continue
                raise SystemExit(f"testbed-agent: cannot listen on {listener.address} (the {transport.name} "
                                 f"transport, the data port + {transport.port_offset}): {exc.strerror}") from None
            listeners.append(listener)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # a supervisor's stop: health goes NOT_SERVING first
        loop.add_signal_handler(signum, agent.stopping.set)
    await control_server.start()
    await data_server.start()
    for listener in listeners:
        await listener.start()
    retrying = asyncio.ensure_future(_listen_later(node, later, listeners)) if later else None
    for service in (CONTROL_SERVICE, DATA_SERVICE):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    print(f"testbed-agent {node}: control {control}, data {','.join(data)}", flush=True)
    await agent.stopping.wait()
    if retrying is not None:
        retrying.cancel()
    await health.enter_graceful_shutdown()
    await agent.stop()
    await asyncio.sleep(0.1)  # let the Shutdown reply leave
    for listener in listeners:
        listener.close()
    await data_server.stop(0.5)
    await control_server.stop(0.5)


RELISTEN_S = 1.0  # how often an optional transport's listener that could not bind tries again


async def _listen_later(node: str, waiting: list, serving: list) -> None:
    """Bind the optional listeners that could not bind at start, as soon as they can: a
    server restarted after a crash gets its agent before its links (and the RDMA devices on
    them) are up again, and a listener never bound would cut it off that transport for good."""
    while waiting:
        await asyncio.sleep(RELISTEN_S)
        for listener in list(waiting):
            try:
                listener.bind()
            except OSError:
                continue
            await listener.start()
            waiting.remove(listener)
            serving.append(listener)
            print(f"testbed-agent {node}: now listening on {listener.address}", flush=True)


def _bind(server: grpc.aio.Server, address: str) -> None:
    """Listen on `address`, or exit with one line (gRPC returns 0 or raises, by version)."""
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise SystemExit(f"testbed-agent: cannot listen on {address}: the address is missing or the port is taken")


CONFIG_KEYS = {"node", "control", "data", "metrics", "window", "token", "token_file"}


def _private(path: str) -> None:
    if os.stat(path).st_mode & 0o077:
        raise SystemExit(f"testbed-agent: {path} holds the Control token and must be private: chmod 600 {path}")


def read_config(path: str) -> dict:
    """A deployed agent's configuration: JSON with the options of the command line (`data` a
    list or comma-separated) and the token, inline or in `token_file`; whichever file holds
    the token must be private (0600). One line naming the file for anything wrong."""
    try:
        config = json.loads(Path(path).read_text())
        if not isinstance(config, dict) or set(config) - CONFIG_KEYS:
            raise ValueError(f"expected an object with keys among {', '.join(sorted(CONFIG_KEYS))}")
        if "token" in config:
            _private(path)
        if "token_file" in config:
            _private(config["token_file"])
            config["token"] = Path(config.pop("token_file")).read_text().strip()
    except (OSError, ValueError) as exc:
        raise SystemExit(f"testbed-agent: cannot read {path}: {exc}") from None
    if isinstance(config.get("data"), list):
        config["data"] = ",".join(config["data"])
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="testbed-agent", description=__doc__.splitlines()[0])
    parser.add_argument("--config", metavar="FILE", help="JSON: the options below, and token or token_file (0600)")
    parser.add_argument("--node", help="this server's name in the lab")
    parser.add_argument("--control", help="host:port on the management network")
    parser.add_argument("--data", help="comma-separated host:port on data NICs")
    parser.add_argument("--metrics", help="host:port for Prometheus metrics (management network)")
    parser.add_argument("--window", type=int, metavar="BYTES",
                        help="HTTP/2 flow-control window of data streams (0: grow it by BDP probing)")
    args = parser.parse_args(argv)
    config = read_config(args.config) if args.config else {}
    options = {key: value for key, value in vars(args).items() if value is not None and key != "config"}
    settings = config | options  # the command line wins over the file
    missing = [f"--{key}" for key in ("node", "control", "data") if not settings.get(key)]
    if missing:
        parser.error(f"{', '.join(missing)} required (on the command line or in --config)")
    token = os.environ.pop(TOKEN_ENV, "") or config.get("token", "")  # popped: nothing this agent runs inherits it
    if not token:
        raise SystemExit(f"testbed-agent: {TOKEN_ENV} is not set: Control answers only calls carrying a token; "
                         "start agents with testbed (deploy.lab_agents or runner.local), or set it")
    _tune_malloc()
    asyncio.run(serve(settings["node"], settings["control"], settings["data"].split(","), settings.get("metrics"),
                      token, int(settings.get("window") or 0)))


# glibc's mmap threshold per run (see _tune_malloc and mmap_threshold)
HEAP_MMAP_THRESHOLD = 32 * 2**20
MANY_PEERS = 7  # a rank streaming with this many peers at once
MANY_PEERS_MMAP_THRESHOLD = 64 * 1024


def mmap_threshold(peers: int) -> int:
    """glibc's mmap threshold for a run in which a rank exchanges with `peers` others.

    With many peers the heap that serves messages (HEAP_MMAP_THRESHOLD) keeps what they
    free, fragmented among gRPC's 64 KiB read slices and the run's other allocations, and
    never gives it back: a mesh of 16 on bcube,4,1 (15 peers, 128 KiB messages) peaked at
    79-82 MiB beyond its gradient, malloc holding 10-17 MB free. Messages and slices
    mmapped instead (threshold 64 KiB) are returned as they are freed: 72-74 MiB, at the
    same time per allreduce (1.134-1.147 vs 1.128-1.165 × the model); 32 KiB saved 1 MiB
    more for more kernel time, 128 KiB nothing. With few peers the heap stays: mmapping
    every message costs kernel time, and BML on bcube,4,1 (6 peers, 256 KiB messages, 73
    MiB either way) went from 43-51 % CPU idle to 22-35 % and from 1.112-1.120 to
    1.121-1.131 × its closed form with it. Seven peers (a mesh or colocated PS on 8) were
    at 75-77 MiB on the heap, 71 mmapped."""
    return MANY_PEERS_MMAP_THRESHOLD if peers >= MANY_PEERS else HEAP_MMAP_THRESHOLD


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt options


def _mallopt(tunables: dict[int, int]) -> None:
    """Set glibc malloc's {option: value}; elsewhere (not glibc) nothing to tune."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        for option, value in tunables.items():
            libc.mallopt(option, value)
    except (OSError, AttributeError):
        pass


def _set_mmap_threshold(threshold: int) -> None:
    _mallopt({M_MMAP_THRESHOLD: threshold})


def _tune_malloc(arenas: int = 2, mmap_threshold: int = HEAP_MMAP_THRESHOLD, trim_threshold: int = 64 * 2**20) -> None:
    """glibc malloc, tuned for an agent's traffic.

    Arenas: glibc gives every thread that allocates its own arena; gRPC's threads each grow
    one with freed chunk buffers that are not returned. Two keep the agent's RSS close to
    its buffer (measured: the worst agent of a ring drops from ~83 to ~76 MiB).
    mmap and trim thresholds: gRPC's Python layer copies every message into fresh objects
    of its size (~1 MiB); above glibc's default threshold each one is mmapped, page-faulted
    in, zeroed by the kernel and unmapped again, and a heap trimmed at 128 KiB does the same
    through brk. Served from a heap that keeps up to 64 MiB free, the agents' kernel time in
    a CPU-bound ring (8 agents, 1 Gbit, 2 cores) fell from ~0.76 to ~0.49 cores. Each run
    sets the mmap threshold again for its rank's peers (mmap_threshold): with many peers
    the heap's retention costs more than the mmapping."""
    # before gRPC starts threads
    _mallopt({M_ARENA_MAX: arenas, M_MMAP_THRESHOLD: mmap_threshold, M_TRIM_THRESHOLD: trim_threshold})


if __name__ == "__main__":
    main()
