"""What every algorithm's options model shares: unknown keys refused, values checked.

An algorithm's options are a pydantic model (`Options` beside its `build`), registered with
it; `registry.check_options` validates a user's mapping through it before any schedule is
built, so `shards: 1000000000`, `colocated: maybe` or `bogus: 1` are refused in one line
naming the option, not read as something else or used to size an allocation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# No lab has more servers than this (spec/lab.py's largest kinds stay below it): a count of
# ranks, shards, groups or widths beyond it is a typo, refused before anything is sized by it.
MAX_RANKS = 4096


class AlgorithmOptions(BaseModel):
    """Base of every algorithm's options: no keys but the declared ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NoOptions(AlgorithmOptions):
    """An algorithm that takes no options."""
