"""The table of algorithms: one record per name, the built-ins' and a user's alike, added by
`register`. It imports no algorithm (algorithms/__init__.py registers the built-ins through
the same call a plugin uses); registry.py is the face the rest of the package uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from pydantic import ValidationError

from orchestrator.collectives.context import Context
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
             transfers: Estimate | None = None) -> Algorithm:
    """Add an algorithm to the table; ValueError for a bad or taken name."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"algorithm name {name!r}: lower case letters, digits and -, starting with a letter")
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name} is registered already (known: {', '.join(ALGORITHMS)})")
    if not callable(build):
        raise ValueError(f"algorithm {name}: build must be callable")
    if not (isinstance(options, type) and issubclass(options, AlgorithmOptions)):
        raise ValueError(f"algorithm {name}: options must be a subclass of AlgorithmOptions")
    ALGORITHMS[name] = Algorithm(name, build, options, transfers)
    return ALGORITHMS[name]
