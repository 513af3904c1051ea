"""Spec files (lab, experiment): pydantic models validated once, with one-line errors."""

from orchestrator.spec.kinds import register_topology, unregister_topology
from orchestrator.spec.lab import LabSpec, topology_kinds
from orchestrator.spec.loader import load, read_yaml, validate

__all__ = ["LabSpec", "lab_from_argument", "load", "load_lab", "read_yaml", "register_topology", "topology_kinds",
           "unregister_topology", "validate"]


def load_lab(path) -> LabSpec:
    """Read and validate a lab file; raises SpecError with one line on any problem."""
    return load(LabSpec, path)


def lab_from_argument(argument: str, **overrides) -> LabSpec:
    """A lab from a file path, or from a shorthand like `bcube,4,1` (named `bcube-4-1`).

    `overrides` are dotted keys (`servers.runtime="netns"`) applied before validation.
    """
    import re

    from orchestrator.errors import SpecError
    from orchestrator.spec.lab import NAME_PATTERN
    from orchestrator.spec.loader import display_path
    from orchestrator.topology.kinds import shorthand

    kind, *values = argument.split(",")
    if kind in shorthand() and not _is_file(argument):
        names = shorthand()[kind]
        shown = display_path(argument)
        if len(values) != len(names):
            raise SpecError(f"{shown}: {kind} takes {len(names)} numbers: {kind},{','.join(n.upper() for n in names)}")
        try:
            numbers = [int(v) for v in values]
        except ValueError:
            raise SpecError(f"{shown}: parameters must be whole numbers") from None
        name = "-".join([kind, *values])
        data = {"name": name, "topology": {"kind": kind, **dict(zip(names, numbers))}}
        source = argument
        if not re.fullmatch(NAME_PATTERN, name):  # only numbers out of range make it so: say which
            validate(LabSpec, {**data, "name": kind}, source)
    elif values and re.fullmatch(r"[a-z][a-z0-9]*", kind) and not _is_file(argument):
        raise SpecError(f"{display_path(argument)}: unknown topology kind {kind}: use one of "
                        f"{', '.join(shorthand())}, or load the plugin that registers it with --plugin")
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
                raise SpecError(f"{display_path(source)}: {key}: expected a mapping")
        target[leaf] = value
    return validate(LabSpec, data, source)


def _is_file(argument: str) -> bool:
    """Whether a file of that name exists; a name the OS cannot even look up is no file."""
    from pathlib import Path

    try:
        return Path(argument).exists()
    except (OSError, ValueError):  # ENAMETOOLONG, a NUL
        return False
