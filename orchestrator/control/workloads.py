"""Workloads: the gradient layout of a real model (scaled), a custom tensor list, or the
digits model trained for real; with emulated compute as a time or from a FLOP rate; or
NCCL-tests' back-to-back loop, for the collective's own bandwidth."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

import numpy as np

MODELS = ("resnet50", "vgg19", "alexnet", "bert-base", "gpt2-small")


@cache
def _models() -> dict:
    return json.loads(resources.files("orchestrator.data").joinpath("models.json").read_text())["models"]


def model_tensors(name: str, scale: float = 1.0) -> list[int]:
    """Element counts of a model's gradient tensors, input to output, times `scale`
    (each tensor keeps at least one element)."""
    try:
        tensors = _models()[name]["tensors"]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None
    return [max(1, round(t["elements"] * scale)) for t in tensors]


def emulated(tensors: list[int], compute_seconds: float = 0.0, flops_per_second: float | None = None,
             batch: int = 32) -> dict:
    """An emulated workload. With `flops_per_second`, compute time is the usual estimate of
    6 FLOPs per parameter per sample (forward 2, backward 4) for a batch."""
    if flops_per_second:
        compute_seconds = 6 * sum(tensors) * batch / flops_per_second
    return {"kind": "emulated", "tensors": tensors, "compute_seconds": compute_seconds}


def back_to_back(tensors: list[int]) -> dict:
    """Allreduces with nothing in between, as NCCL-tests' timed loop: for busbw in its sense
    (`RunResult.back_to_back_times`). The first iteration is the warm-up, checked exactly;
    the rest reduce a zeroed buffer in place (see orchestrator.agent.workload)."""
    return {"kind": "back-to-back", "tensors": tensors}


def digits(workers: int, rank: int, hidden: int = 32, lr: float = 0.5, batch: int = 32, seed: int = 0) -> dict:
    """The real workload for one worker: the digits MLP and this worker's share of the data."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    from orchestrator.agent.workload import DigitsMLP

    data = load_digits()
    order = np.random.default_rng(seed).permutation(len(data.target))
    mine = order[rank::workers]
    return {
        "kind": "real", "model": "digits-mlp", "hidden": hidden, "lr": lr, "batch": batch, "seed": seed,
        "tensors": DigitsMLP.tensor_sizes(hidden),
        "data": {"x": data.data[mine].tolist(), "y": data.target[mine].tolist()},
    }
