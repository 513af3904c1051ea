"""One compiled run: the schedules a run's agents execute, the server of every rank, the
agents' message size and the cost model's prediction for exactly these, built in one place
for `testbed predict` (cost/report.py), `testbed run --dry-run` and the experiment's plan
(experiment/plan.py) and the run driver (control/driver.py), with one rule for ranks
(collectives.schedule.check_ranks).

    compiled = compile_run("hips", ctx, elements, parts, nodes=layout, chunk_bytes=chunk_of)
    compiled = compiled.predicted(network, topology)   # the prediction and the routes it took
    compiled.shares()                                  # the fair share every connection paces at

Pure, as the rest of the model: what the agents' transport adds (its message size, the
bytes it holds once handed over) comes in as values or a function of the schedules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

from orchestrator.collectives import registry
from orchestrator.collectives.context import Context
from orchestrator.collectives.partition import Partition, partitions
from orchestrator.collectives.schedule import RankMismatch, check_ranks
from orchestrator.cost.network import Network
from orchestrator.cost.predict import Prediction, Schedules, predict_schedules
from orchestrator.cost.routes import Routes
from orchestrator.cost.shares import fair_shares
from orchestrator.cost.simulate import (DEFAULT_CHUNK_BYTES, DEFAULT_RECEIVE_BUFFER_BYTES, DEFAULT_SEND_BUFFER_BYTES,
                                        Simulation, simulate)
from orchestrator.topology import Topology


@dataclass(frozen=True)
class CompiledRun:
    algorithm: str
    schedules: Schedules
    nodes: tuple[str, ...]  # the server of every rank
    chunk_bytes: int  # the agents' message size
    credit_bytes: int
    send_buffer_bytes: int  # what the transport holds once handed over (the model counts it sent)
    rendezvous: bool = False  # the transport lets a send wait for its receiver to enter its step
    network: Network | None = None
    routes: Routes | None = None  # what the prediction mapped the transfers onto
    prediction: Prediction | None = None

    @property
    def meets(self) -> bool:
        """Do its sends wait for their receivers (what the agents' plans say)? As its
        prediction chose (predict_schedules: where the model finds it pays); unpredicted, as
        the transport offers."""
        return self.prediction.rendezvous if self.prediction is not None else self.rendezvous

    @property
    def ranks(self) -> int:
        return len(self.nodes)

    @property
    def transfer_count(self) -> int:
        """Transfers of one allreduce, all partitions (what holding this run costs)."""
        return sum(len(step) for _, schedule in self.schedules for step in schedule.steps)

    @property
    def smallest_transfer(self) -> int:
        """Bytes of its smallest transfer that moves any (what a lab sizes super-packets by)."""
        return smallest_transfer_bytes(self.schedules)

    @property
    def connection_ends(self) -> set[tuple[int, int, int | None]]:
        """The connections the agents open for it: one per (sender, receiver, NIC) it names."""
        return {(t.src, t.dst, t.nic) for _, schedule in self.schedules for _, t in schedule.transfers()}

    @property
    def connections(self) -> int:
        """How many connections the agents open for it (`connection_ends`)."""
        return len(self.connection_ends)

    def predicted(self, network: Network | None, topology: Topology | None, routes: Routes | None = None,
                  compute_s: float = 0.0, attribute: bool = False, compute=None, warmup: int = 0) -> "CompiledRun":
        """This run with the cost model's prediction on `topology` (no network or topology: none),
        over `routes` (default: the even ECMP spread; the driver passes the paths the
        connections took). ValueError when the model cannot take it (path work, ranks)."""
        if network is None or topology is None or not self.schedules:
            return dataclasses.replace(self, network=network)
        routes = routes or Routes(topology)
        prediction = predict_schedules(topology, self.schedules, list(self.nodes), network, self.chunk_bytes,
                                       self.credit_bytes, routes=routes, send_buffer_bytes=self.send_buffer_bytes,
                                       rendezvous=self.meets, choose=self.prediction is None,
                                       compute_s=compute_s, attribute=attribute, compute=compute, warmup=warmup)
        return dataclasses.replace(self, network=network, routes=routes, prediction=prediction)

    def timeline(self, iterations: int) -> Simulation:
        """`iterations` allreduces of this run back to back as its prediction models them (its
        routes, network and rendezvous choice): every transfer's times, to set beside a traced
        run's (experiment/timeline.py). ValueError before predicted(); ModelTooLarge past the
        event model's budget."""
        if self.prediction is None or self.routes is None or self.network is None:
            raise ValueError("a run's timeline comes from its prediction: call predicted() first")
        return simulate(self.routes, self.schedules, list(self.nodes), self.network, self.chunk_bytes,
                        self.credit_bytes, receive_buffer_bytes=DEFAULT_RECEIVE_BUFFER_BYTES,
                        send_buffer_bytes=self.send_buffer_bytes, iterations=iterations, rendezvous=self.meets)

    def shares(self, topology: Topology | None = None) -> dict:
        """The fair share of every connection over the routes predicted (agent/pacing.py);
        with `topology`, over the same paths on its links' rates (what a link-degrade left)."""
        if self.routes is None or self.network is None:
            raise ValueError("shares of a run come from its prediction: call predicted() first")
        routes = self.routes if topology is None else Routes(topology, self.routes.pinned, self.routes.underlay)
        return fair_shares(routes, self.schedules, list(self.nodes), self.network)


def smallest_transfer_bytes(schedules: Schedules, itemsize: int = 4) -> int:
    """Bytes of the smallest transfer of `schedules` that moves any (0: none moves any)."""
    return min((t.length for _, schedule in schedules for _, t in schedule.transfers() if t.length),
               default=0) * itemsize


def compile_run(algorithm: str, ctx: Context, elements: int, parts: Sequence[Partition], *,
                nodes: Sequence[str] | Callable[[int], Sequence[str]], given: Collection[int] | None = None,
                credit_bytes: int = 0, chunk_bytes: int | Callable[[Schedules, int], int] | None = None,
                send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES, rendezvous: bool = False,
                prediction_only: bool = False) -> CompiledRun:
    """The schedules of `algorithm` over `ctx` for `elements` gradient elements in `parts`.

    `nodes`: the server of every rank (or a function of the rank count that gives them).
    `given`: the ranks that have an agent (default: as many as the schedules need, up to the
    nodes there are). `chunk_bytes`: the agents' message size, or a function of (schedules,
    credit_bytes) giving it (the agents': agent.plan.chunk_bytes). `prediction_only`: the
    run is only predicted, never run, so it may hold registry.PREDICTION_TRANSFERS transfers
    (the step-level model's budget), not MAX_TRANSFERS (the agents'). ValueError from the
    algorithm; collectives.schedule.RankMismatch when the ranks do not fit."""
    limit, holder = (registry.PREDICTION_TRANSFERS, "prediction") if prediction_only else (registry.MAX_TRANSFERS, "run")
    schedules = registry.schedules(algorithm, ctx, elements, parts, limit, holder)
    wanted = schedules[0][1].ranks if schedules else len(given or ())
    placed = list(nodes(wanted) if callable(nodes) else nodes)
    given = set(range(min(wanted, len(placed))) if given is None else given)
    ranks = check_ranks(algorithm, schedules, given, len(placed))
    if callable(chunk_bytes):
        chunk_bytes = chunk_bytes(schedules, credit_bytes)
    return CompiledRun(algorithm, schedules, tuple(placed[:ranks]), chunk_bytes or DEFAULT_CHUNK_BYTES, credit_bytes,
                       send_buffer_bytes, rendezvous)


def over_servers(topology: Topology, algorithm: str, size_bytes: int, workers: int | None = None,
                 options: dict | None = None, partition_bytes: int | None = None, itemsize: int = 4,
                 **compiling) -> CompiledRun:
    """The run the driver would compile over `topology`'s servers: workers first, in server
    order, then parameter servers. `compiling`: compile_run's credit_bytes, chunk_bytes,
    send_buffer_bytes, rendezvous and prediction_only. ValueError for an unknown algorithm, options it
    refuses, or too few servers."""
    servers = [s.name for s in topology.servers]
    workers = len(servers) if workers is None else workers
    if not 1 <= workers <= len(servers):
        raise ValueError(f"workers must lie between 1 and the {len(servers)} servers, got {workers}")
    ctx = Context(workers, topology, tuple(servers), dict(options or {}))
    elements = max(1, size_bytes // itemsize)
    try:
        return compile_run(algorithm, ctx, elements, partitions([elements], partition_bytes, itemsize), nodes=servers,
                           **compiling)
    except RankMismatch as exc:
        raise ValueError(f"{algorithm} with {workers} workers needs {exc.ranks} servers (workers and parameter "
                         f"servers); this {topology.kind} has {len(servers)}: pass fewer workers or other options") from None


def build_schedules(topology: Topology, algorithm: str, size_bytes: int, workers: int | None = None,
                    options: dict | None = None, partition_bytes: int | None = None,
                    itemsize: int = 4) -> tuple[Schedules, list[str]]:
    """The schedules of `over_servers`' run, and the server of every rank."""
    run = over_servers(topology, algorithm, size_bytes, workers, options, partition_bytes, itemsize)
    return run.schedules, list(run.nodes)


def predict(
    topology: Topology,
    algorithm: str,
    size_bytes: int,
    network: Network,
    workers: int | None = None,
    options: dict | None = None,
    partition_bytes: int | None = None,
    credit_bytes: int = 0,
    chunk_bytes: int | Callable[[Schedules, int], int] = DEFAULT_CHUNK_BYTES,
    itemsize: int = 4,
    rendezvous: bool = False,
) -> Prediction:
    """Predict `algorithm` allreducing `size_bytes` over the servers of `topology`.

    `chunk_bytes` is the agents' message size, or a function of (schedules, credit_bytes)
    giving it (the driver's: `agent.plan.chunk_bytes`). `rendezvous`: as the tcp transport
    sends (a step's send waits for its receiver to enter the step)."""
    run = over_servers(topology, algorithm, size_bytes, workers, options, partition_bytes, itemsize,
                       credit_bytes=credit_bytes, chunk_bytes=chunk_bytes)
    return predict_schedules(topology, run.schedules, list(run.nodes), network, run.chunk_bytes, credit_bytes, itemsize,
                             rendezvous=rendezvous)
