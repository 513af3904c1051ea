"""The table of algorithms: one record per name, the built-ins' and a user's alike, added by
`register` (public as `orchestrator.collectives.register`). It imports no algorithm (algorithms/__init__.py registers the built-ins through
the same call a plugin uses); registry.py is the face the rest of the package uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from pydantic import ValidationError

from orchestrator.origins import Origin
from orchestrator.collectives.context import Context
from orchestrator.collectives.forms import ClosedForm
from orchestrator.collectives.membership import Reform, keep_ranks, renumber
from orchestrator.collectives.options import AlgorithmOptions, NoOptions
from orchestrator.collectives.schedule import Schedule

Builder = Callable[..., Schedule]
Estimate = Callable[[Context, int], int]
NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


@dataclass(frozen=True)
class Algorithm:
    name: str
    build: Builder
    options: type[AlgorithmOptions] = NoOptions
    transfers: Estimate | None = None
    closed_form: ClosedForm | None = None  # REFERENCE-style formula to set beside a prediction
    reform: Reform = renumber  # how it re-forms over the survivors of a failure (membership.py)
    origin: str = "built-in"  # where it was registered from: a plugin's file or entry point

    def check_options(self, options: dict | None) -> dict:
        """The options validated by the algorithm's model, as given (no defaults added);
        ValueError naming the option otherwise."""
        if not isinstance(options, dict):
            raise ValueError(f"options must be a mapping of names to values, e.g. {{shards: 4}}")
        try:
            model = self.options.model_validate(options)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                known = ", ".join(self.options.model_fields) or "none"
                message = f"{self.name} has no such option (its options: {known})"
            raise ValueError(f"option {where}: {message}") from None
        return model.model_dump(exclude_unset=True)


ALGORITHMS: dict[str, Algorithm] = {}


def register(name: str, build: Builder, *, options: type[AlgorithmOptions] = NoOptions,
             transfers: Estimate | None = None, closed_form: ClosedForm | None = None,
             reform: Reform | None = None) -> Algorithm:
    """Add an algorithm to the table; ValueError for a bad or taken name or a part that is
    not what it must be.

    build(ctx, size, offset=0, length=None) -> Schedule   the algorithm (collectives/schedule.py)
    options      its pydantic options model (a subclass of AlgorithmOptions)
    transfers    (ctx, length) -> an upper bound of one schedule's transfers, checked before building
    closed_form  (Case) -> Form | None: its formula, shown beside the model's prediction
    reform       (ctx, workers, servers, dead) -> Membership after a failure (default: renumber
                 the survivors; membership.keep_ranks keeps the topology's ranks)
    """
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"algorithm name {name!r}: lower case letters, digits and -, starting with a letter")
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name} is registered already ({ALGORITHMS[name].origin}): give yours another name")
    if not callable(build):
        raise ValueError(f"algorithm {name}: build must be callable")
    if not (isinstance(options, type) and issubclass(options, AlgorithmOptions)):
        raise ValueError(f"algorithm {name}: options must be a subclass of AlgorithmOptions")
    for part, value in (("transfers", transfers), ("closed_form", closed_form), ("reform", reform)):
        if value is not None and not callable(value):
            raise ValueError(f"algorithm {name}: {part} must be callable or None")
    if reform is keep_ranks and "failed" not in options.model_fields:
        raise ValueError(f"algorithm {name}: reform=keep_ranks names the dead servers in option `failed`: give its "
                         "options model a field `failed: list[str] = []`")
    ALGORITHMS[name] = Algorithm(name, build, options, transfers, closed_form, reform or renumber, _origin.get())
    return ALGORITHMS[name]


# where registrations come from while a plugin loads (orchestrator/plugins.py sets it)
_origin = Origin("algorithm_origin")
origin = _origin.within  # `with table.origin(file):` — algorithms registered within record it
