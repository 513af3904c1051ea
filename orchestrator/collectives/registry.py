"""Algorithms by name: one table of registered records, the built-ins' and a user's alike.

    register(name, build, *, options=NoOptions, transfers=None) -> Algorithm

`build(ctx, size, offset=0, length=None) -> Schedule` is the algorithm; `options` the
pydantic model of its options (unknown keys and bad values are refused before anything is
built); `transfers(ctx, length) -> int` an upper bound of the transfers one schedule of
`length` elements holds, so a plan too big to build is refused from arithmetic alone. With
or without it, every build runs under a budget of MAX_TRANSFERS transfers (schedule.py's
guard), so no algorithm can grow without bound.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.collectives import algorithms as _builtins  # noqa: F401  registers the built-ins
from orchestrator.collectives.context import Context
from orchestrator.collectives.membership import Membership
from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, ScheduleError, TooManyTransfers, transfer_budget  # noqa: F401  re-exported
from orchestrator.collectives.table import ALGORITHMS, Algorithm, Builder, Estimate, register  # noqa: F401  re-exported

# Transfers of one allreduce (all partitions) a plan may hold. Each is a flow the model keeps
# up to ~8 KB for (its dependencies, ranges and path shares: torus,8,3's HiPS, 129,000
# transfers, took 1.3 GB and 59 s), and a message stream in the agents: 60,000 keep a
# prediction within 1 GiB and ~30 s on this project's 2-core machines.
MAX_TRANSFERS = 60_000
# Transfers one allreduce may hold when it is only predicted (`testbed predict`): the
# step-level model (cost/stepwise.py) keeps ~250 B per transfer with its schedule, so a ring
# over 1,024 servers (2,095,104) predicts in ~5 s and ~0.5 GB; past it a plan is refused
PREDICTION_TRANSFERS = 2_200_000


def get(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}: choose one of {', '.join(sorted(ALGORITHMS))}") from None


def reform(name: str, ctx: Context, workers: list[str], servers: list[str], dead: set[str]) -> Membership:
    """The membership of algorithm `name` over all but `dead` (workers, servers: node names
    in their original rank order). ValueError when the algorithm cannot lose these servers."""
    return get(name).reform(ctx, workers, servers, dead)


def builder(name: str) -> Builder:
    return get(name).build


def check_options(name: str, options: dict | None) -> dict:
    return get(name).check_options(options or {})


def estimate(name: str, ctx: Context, parts: list[Partition]) -> int | None:
    """The algorithm's bound of the transfers of these partitions, or None if it gives none."""
    algorithm = get(name)
    if algorithm.transfers is None:
        return None
    if parts and all(p.length == parts[0].length for p in parts):
        return algorithm.transfers(ctx, parts[0].length) * len(parts)
    return sum(algorithm.transfers(ctx, p.length) for p in parts)


def _built(algorithm: Algorithm, ctx: Context, size: int, part: Partition) -> Schedule:
    """One partition's schedule, named as the algorithm was asked for. A build that raises
    anything but ValueError (its way to decline: a rank count, a topology) or returns
    something else than a Schedule is a bug of the algorithm: ScheduleError, one line
    naming it and where it was registered from."""
    try:
        schedule = algorithm.build(ctx, size, part.offset, part.length)
    except ValueError:
        raise
    except Exception as exc:
        raise ScheduleError(f"{algorithm.name} ({algorithm.origin}): building raised {type(exc).__name__}: {exc}") \
            from None
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"{algorithm.name} ({algorithm.origin}): build returned {type(schedule).__name__}, not a "
                            "Schedule")
    schedule.algorithm = algorithm.name  # closed forms, reports and plans go by the name asked for
    return schedule


def schedules(name: str, ctx: Context, size: int, parts: list[Partition], limit: int = MAX_TRANSFERS,
              holder: str = "run") -> list[tuple[Partition, Schedule]]:
    """One schedule per partition, in priority order, after the options and the transfer
    budget are checked (ValueError, saying the figure and the limit, before building).
    `holder`: what the limit is for, as the refusal names it ("run", "prediction")."""
    algorithm = get(name)
    ctx = replace(ctx, options=algorithm.check_options(ctx.options))
    bound = estimate(name, ctx, parts)
    if bound is not None and bound > limit:
        split = f" in {len(parts):,} partitions" if len(parts) > 1 else ""
        raise TooManyTransfers(name, f"over {ctx.workers} workers{split} is {bound:,} transfers per allreduce", limit,
                               holder)
    with transfer_budget(limit, name):
        built = [(part, _built(algorithm, ctx, size, part)) for part in parts]
    held = sum(len(step) for _, schedule in built for step in schedule.steps)
    if held > limit:
        raise TooManyTransfers(name, f"over {ctx.workers} workers holds {held:,} transfers per allreduce", limit,
                               holder)
    return built

