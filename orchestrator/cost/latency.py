"""α from a measurement: the per-message latency that makes the model's time of a
latency-bound run (a near-zero-byte allreduce) equal what the agents measured. Pure.

The model's time grows with α without bound and continuously, so α is found by bisection
on [0, hi], hi doubled until it overshoots: no closed form of the schedule is needed, and
what the model does with α (messages of one step queued behind each other, overlapping
iterations) is what the fit accounts for.
"""

from __future__ import annotations

from typing import Callable

MAX_ALPHA = 1.0  # seconds: beyond this a "latency" is a hang, not a cost
PRECISION = 1e-3  # relative: far below a measurement's own noise (a few %), in about 10 model runs


def fit_alpha(model_seconds: Callable[[float], float], measured: float, first_guess: float = 1e-4) -> float:
    """The α ≥ 0 at which `model_seconds(α)` equals `measured` (0 when the model is already
    as slow as the measurement). ValueError when even MAX_ALPHA falls short."""
    if not measured > 0:
        raise ValueError(f"a measured time must be positive, got {measured!r}")
    if model_seconds(0.0) >= measured:
        return 0.0
    lo, hi = 0.0, first_guess
    while model_seconds(hi) < measured:
        lo, hi = hi, hi * 2
        if hi > MAX_ALPHA:
            raise ValueError(f"the model needs more than {MAX_ALPHA} s per message to take {measured:.6f} s: "
                             "the run was not latency-bound (or hung)")
    while hi - lo > PRECISION * hi:
        mid = (lo + hi) / 2
        if model_seconds(mid) < measured:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
