"""`register_topology`: a new kind of topology in one call — its lab-file model and its record
(builder, drawing, NIC facts, groups) — the way the built-ins are registered.

    from pydantic import BaseModel, Field
    from typing import Literal
    from orchestrator.spec import register_topology

    class RingSpec(BaseModel):
        kind: Literal["ring"]
        servers: int = Field(ge=3, le=64)

    register_topology(RingSpec, lambda spec, data, links: build_ring(spec.servers, data, links))

Afterwards `topology: {kind: ring, servers: 6}` is a lab file, `ring,6` a shorthand, and
`testbed topology`, `up`, inventories and the cost model take it like any built-in kind.
"""

from __future__ import annotations

from typing import Callable

from orchestrator.errors import SpecError
from orchestrator.spec import lab
from orchestrator.topology.kinds import KINDS, TopologyKind, register_kind


def register_topology(spec: type, build: Callable, *, title: str = "", layout: Callable | None = None,
                      nic_addresses: Callable | None = None, groups: Callable | None = None,
                      shorthand: tuple[str, ...] | None = None, blocks: Callable | None = None) -> TopologyKind:
    """Register a topology kind: `spec` (a pydantic model with `kind: Literal["name"]`) is what
    lab files write; `build(spec, data, links) -> Topology` makes it (topology/kinds.py says
    what the other parts are). `shorthand` defaults to the model's whole-number fields, in
    order, when it has no other fields. A taken name or a malformed model is a SpecError."""
    try:
        name = lab.kind_name(spec)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if name in lab.TOPOLOGY_SPECS or name in KINDS:
        owner = KINDS[name].origin if name in KINDS else "built-in"
        raise SpecError(f"topology kind {name} is registered already ({owner}): pick another name")
    if shorthand is None:
        shorthand = _whole_number_fields(spec)
    record = register_kind(TopologyKind(name, build, tuple(shorthand), title, layout, nic_addresses, groups,
                                         blocks))
    lab.TOPOLOGY_SPECS[name] = spec
    try:
        _rebuild()
    except Exception:
        del lab.TOPOLOGY_SPECS[name], KINDS[name]
        _rebuild()
        raise
    return record


def unregister_topology(name: str) -> None:
    """Forget a registered kind (tests, a plugin that failed half way); built-ins stay."""
    if name in KINDS and KINDS[name].origin == "built-in":
        raise SpecError(f"topology kind {name} is built in: it cannot be removed")
    lab.TOPOLOGY_SPECS.pop(name, None)
    KINDS.pop(name, None)
    _rebuild()


def _rebuild() -> None:
    """Rebuild the models whose schema holds a `topology:` union, innermost first."""
    from orchestrator.spec import experiment  # pulls in the workloads' models: only when needed

    for model in (lab.LabSpec, experiment.SweepSpec, experiment.ExperimentSpec):
        model.model_rebuild(force=True)


def _whole_number_fields(spec: type) -> tuple[str, ...]:
    fields = {name: field for name, field in spec.model_fields.items() if name != "kind"}
    return tuple(fields) if fields and all(field.annotation is int for field in fields.values()) else ()


def plugin_of(kind: str) -> str | None:
    """The plugin file a registered kind came from (None: built in, or not from a file), kept
    with a live lab so that later commands can load it again (`require`)."""
    record = KINDS.get(kind)
    where = record.origin if record is not None else ""
    return where if where.endswith(".py") and where.startswith("/") else None


def require(kind: str, plugin: str | None) -> None:
    """Make sure `kind` is registered, loading the plugin file a live lab recorded for it."""
    if kind in lab.TOPOLOGY_SPECS:
        return
    if plugin is None:
        raise SpecError(f"topology kind {kind} is not registered: pass the plugin that registers it with --plugin")
    from orchestrator import plugins
    from orchestrator.errors import PluginError

    try:
        plugins.load_file(plugin)
    except PluginError as exc:
        raise SpecError(f"topology kind {kind}: {exc}") from None
    if kind not in lab.TOPOLOGY_SPECS:
        raise SpecError(f"topology kind {kind}: plugin {plugin} no longer registers it")
