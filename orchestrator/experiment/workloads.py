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
        lambda spec, tensors, workers: runner_workloads.emulated(tensors, spec.compute)),
    "tensors": WorkloadKind(
        lambda spec: list(spec.tensors),
        lambda spec, tensors, workers: runner_workloads.emulated(tensors, spec.compute)),
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


def build(spec, tensors: list[int], workers: int) -> dict | list[dict]:
    return WORKLOADS[spec.kind].build(spec, tensors, workers)
