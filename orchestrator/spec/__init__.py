"""Spec files (lab, experiment): pydantic models validated once, with one-line errors."""

from orchestrator.spec.lab import TOPOLOGY_KINDS, LabSpec
from orchestrator.spec.loader import load, read_yaml, validate

__all__ = ["LabSpec", "TOPOLOGY_KINDS", "lab_from_argument", "load", "load_lab", "read_yaml", "validate"]


def load_lab(path) -> LabSpec:
    """Read and validate a lab file; raises SpecError with one line on any problem."""
    return load(LabSpec, path)


def lab_from_argument(argument: str, **overrides) -> LabSpec:
    """A lab from a file path, or from a shorthand like `bcube,4,1` (named `bcube-4-1`).

    `overrides` are dotted keys (`servers.runtime="netns"`) applied before validation.
    """
    from pathlib import Path

    from orchestrator.errors import SpecError
    from orchestrator.topology import SHORTHAND

    kind, *values = argument.split(",")
    if kind in SHORTHAND and not Path(argument).exists():
        names = SHORTHAND[kind]
        if len(values) != len(names):
            raise SpecError(f"{argument}: {kind} takes {len(names)} numbers: {kind},{','.join(n.upper() for n in names)}")
        try:
            numbers = [int(v) for v in values]
        except ValueError:
            raise SpecError(f"{argument}: parameters must be whole numbers") from None
        data = {"name": "-".join([kind, *values]), "topology": {"kind": kind, **dict(zip(names, numbers))}}
        source = argument
    else:
        data, source = read_yaml(argument), argument
    for dotted, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        target = data
        for key in parents:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise SpecError(f"{source}: {key}: expected a mapping")
        target[leaf] = value
    return validate(LabSpec, data, source)
