"""Spec files (lab, experiment): pydantic models validated once, with one-line errors."""

from orchestrator.spec.lab import TOPOLOGY_KINDS, LabSpec
from orchestrator.spec.loader import load, read_yaml, validate

__all__ = ["LabSpec", "TOPOLOGY_KINDS", "load", "load_lab", "read_yaml", "validate"]


def load_lab(path) -> LabSpec:
    """Read and validate a lab file; raises SpecError with one line on any problem."""
    return load(LabSpec, path)
