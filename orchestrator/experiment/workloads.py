"""Workload kinds of an experiment file, in one table: each gives the gradient layout
(element counts, input to output) and what the driver hands the workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orchestrator.control import workloads as runner_workloads

ITEMSIZE = 4  # float32 / fixed-point int32 elements


@dataclass(frozen=True)
class WorkloadKind:
    tensors: Callable[[object], list[int]]
    # (spec, tensors, workers) → one workload for all workers or one per worker
    build: Callable[[object, list[int], int], dict | list[dict]]
    # what the history checker can do with its runs: recompute a lost worker's contribution
    # ("emulated": it depends on identity and iteration only), check what agents reported
    # ("reported": real training), or nothing (None: a timed loop carries no gradient)
    checked: str | None = "emulated"


def _model_tensors(spec) -> list[int]:
    scale = spec.scale
    if scale is None:  # the scale that gives `size` bytes
        scale = spec.size / (ITEMSIZE * sum(runner_workloads.model_tensors(spec.model, 1.0)))
    return runner_workloads.model_tensors(spec.model, scale)


def _digits_tensors(spec) -> list[int]:
    from orchestrator.agent.workload import DigitsMLP

    return DigitsMLP.tensor_sizes(spec.hidden)


WORKLOADS: dict[str, WorkloadKind] = {
    "back-to-back": WorkloadKind(
        lambda spec: [max(1, spec.size // ITEMSIZE)],
        lambda spec, tensors, workers: runner_workloads.back_to_back(tensors), checked=None),
    "model": WorkloadKind(
        _model_tensors,
        lambda spec, tensors, workers: runner_workloads.emulated(tensors, spec.compute.seconds)),
    "tensors": WorkloadKind(
        lambda spec: list(spec.tensors),
        lambda spec, tensors, workers: runner_workloads.emulated(tensors, spec.compute.seconds)),
    "digits": WorkloadKind(
        _digits_tensors,
        lambda spec, tensors, workers: [runner_workloads.digits(workers, rank, spec.hidden, spec.lr, spec.batch,
                                                                spec.seed) for rank in range(workers)],
        checked="reported"),
}


def checked(spec) -> str | None:
    return WORKLOADS[spec.kind].checked


def tensors(spec) -> list[int]:
    return WORKLOADS[spec.kind].tensors(spec)


def build(spec, tensors: list[int], workers: int, drawn: list[list[float]] | None = None) -> dict | list[dict]:
    """What the driver hands the workers; with stragglers (`drawn`: `drawn_compute`'s table),
    one workload per worker carrying its compute per iteration."""
    built = WORKLOADS[spec.kind].build(spec, tensors, workers)
    if drawn is None:
        return built
    per_worker = built if isinstance(built, list) else [built] * workers
    return [{**w, "compute_seconds": [row[rank] for row in drawn]} for rank, w in enumerate(per_worker)]


def drawn_compute(spec, workers: int, iterations: int) -> list[list[float]] | None:
    """The workload's compute per [iteration][worker] when it varies (stragglers), else None."""
    compute = getattr(spec, "compute", None)
    if compute is None or not compute.varies:
        return None
    return compute.draw(workers, iterations)


def compute_seconds(spec) -> float:
    """The workload's mean compute per iteration (0 for kinds without)."""
    compute = getattr(spec, "compute", None)
    return compute.seconds if compute is not None else 0.0
