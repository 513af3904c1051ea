"""A workload's emulated compute per iteration: one duration for every rank, or stragglers.

    compute: 50ms                                                   # every rank, every iteration
    compute: {distribution: lognormal, mean: 50ms, sd: 20ms, seed: 1}
    compute: {distribution: normal, mean: 50ms, sd: 5ms}            # below 0 counts as 0
    compute: {per_rank: [50ms, 50ms, 50ms, 80ms]}                   # one slow worker
    compute: {per_rank: [50ms, 80ms], distribution: normal, sd: 2ms}  # and noise around each

`draw` gives the seconds of every (iteration, worker), the same for the same file: the
agents wait them out and the cost model predicts with them (the skew's cost, measured beside
predicted). A lognormal is given by the mean and standard deviation of the time itself.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_serializer, model_validator

from orchestrator import units

MAX_COMPUTE_S = 3600.0
MAX_DRAWN = 10_000_000  # (iteration, worker) draws one run may hold: 80 MB of float64


def _duration(value: Any) -> float:
    seconds = units.parse_duration(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_COMPUTE_S:
        raise ValueError(f"{units.shown(value)} is out of range: give 0 to {MAX_COMPUTE_S:.0f}s, e.g. 50ms")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration)]


class ComputeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    distribution: Literal["fixed", "normal", "lognormal"] = "fixed"
    mean: Duration = Field(0.0, description="seconds per iteration (every rank), e.g. 50ms")
    sd: Duration = Field(0.0, description="standard deviation of a normal or lognormal, e.g. 10ms")
    per_rank: Optional[list[Duration]] = Field(None, min_length=1, max_length=4096,
                                               description="each worker's mean, in rank order (instead of mean)")
    seed: int = Field(0, strict=True, ge=0, le=2**63 - 1)

    @model_validator(mode="before")
    @classmethod
    def _scalar(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else {"mean": value}

    @model_validator(mode="after")
    def _consistent(self) -> "ComputeSpec":
        if self.per_rank is not None and self.mean:
            raise ValueError("give mean or per_rank, not both")
        if self.distribution == "fixed" and self.sd:
            raise ValueError("sd needs distribution: normal or lognormal")
        return self

    @model_serializer
    def _dump(self) -> Any:  # durations with their unit, so that a dump reads back the same
        if self.distribution == "fixed" and self.per_rank is None:
            return f"{self.mean!r}s"
        out: dict[str, Any] = {"distribution": self.distribution}
        if self.per_rank is not None:
            out["per_rank"] = [f"{s!r}s" for s in self.per_rank]
        else:
            out["mean"] = f"{self.mean!r}s"
        if self.sd:
            out["sd"] = f"{self.sd!r}s"
        if self.seed:
            out["seed"] = self.seed
        return out

    @property
    def varies(self) -> bool:
        """Whether ranks or iterations compute for different times (stragglers)."""
        return self.distribution != "fixed" or (self.per_rank is not None and len(set(self.per_rank)) > 1)

    @property
    def seconds(self) -> float:
        """The mean seconds of one rank's compute (over ranks, for per_rank)."""
        return float(np.mean(self.per_rank)) if self.per_rank is not None else self.mean

    def means(self, workers: int) -> list[float]:
        if self.per_rank is None:
            return [self.mean] * workers
        if len(self.per_rank) != workers:
            raise ValueError(f"per_rank lists {len(self.per_rank)} times for {workers} workers: give one per worker")
        return list(self.per_rank)

    def draw(self, workers: int, iterations: int) -> list[list[float]]:
        """Seconds of compute before each iteration, per worker: [iteration][rank]."""
        if workers * iterations > MAX_DRAWN:
            raise ValueError(f"{iterations:,} iterations × {workers:,} workers are more compute times than the "
                             f"{MAX_DRAWN:,} one run may draw: use fewer iterations")
        means = np.array(self.means(workers), dtype=float)
        if self.distribution == "fixed" or not self.sd:
            return np.broadcast_to(means, (iterations, workers)).tolist()
        rng = np.random.default_rng(self.seed)
        if self.distribution == "normal":
            return np.maximum(0.0, rng.normal(means, self.sd, size=(iterations, workers))).tolist()
        # lognormal with this mean and sd of the time itself: σ² = ln(1 + sd²/m²), μ = ln m − σ²/2
        safe = np.where(means > 0, means, 1.0)
        sigma = np.sqrt(np.log1p((self.sd / safe) ** 2))
        drawn = rng.lognormal(np.log(safe) - sigma**2 / 2, sigma, size=(iterations, workers))
        return np.where(means > 0, drawn, 0.0).tolist()
