"""The table of frameworks: code users train with, run on the lab's servers in place of the
project's agents for a point whose algorithm names one, and measured beside them.

    register_framework(name, run, *, runs, missing=None, runtimes=("netns",), workloads=..., image=None)

A framework says which of the project's algorithms its collective executes (`runs`: the
schedule the cost model prices its points with), the runtimes and workload kinds it takes,
what this machine lacks for it (`missing() -> reason | None`), the image a Docker lab's
servers need for it (`image`: built on demand when it is one of ours), and how to run one point
(`run(job) -> FrameworkResult`). The built-in (PyTorch's gloo, torch_gloo.py) registers
through this call as a user's would. Pure: no I/O, nothing imported beyond this package."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from orchestrator.origins import Origin

NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
WORKLOAD_KINDS = ("back-to-back", "model", "tensors", "digits")


@dataclass(frozen=True)
class Job:
    """One point to run: its servers in rank order, the gradient layout and workload, the
    compute each worker spends per iteration ([iteration][worker]; None: none or the
    workload's own), and what the run reports back as iterations pass."""

    lab: object  # a live lab: its topology, spec and start_module(node, module, env, **popen)
    nodes: list[str]
    tensors: list[int]
    workload: object  # the experiment's workload spec (spec/experiment.py)
    compute: list[list[float]] | None
    iterations: int
    timeout: float
    on_iteration: Callable[[int], None] = lambda iteration: None


@dataclass
class FrameworkResult:
    """Per rank and iteration, records as the agents report theirs (rank, node, iteration,
    gst_s, compute_s, start_time, verified, loss, param_digest, bytes_sent, bytes_received),
    and the check of what the ranks ended with (clean, summary)."""

    records: list[dict]
    checker: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Framework:
    name: str
    run: Callable[[Job], FrameworkResult]
    runs: tuple[str, ...]  # the project's algorithms its collective executes (what predicts it)
    missing: Callable[[], str | None] = lambda: None
    runtimes: tuple[str, ...] = ("netns",)
    workloads: tuple[str, ...] = WORKLOAD_KINDS
    origin: str = "built-in"
    image: str | None = None  # a Docker lab's servers run this image (which holds the framework) unless the lab names its own


FRAMEWORKS: dict[str, Framework] = {}


def register_framework(name: str, run: Callable[[Job], FrameworkResult], *, runs: tuple[str, ...] | list[str],
                       missing: Callable[[], str | None] | None = None, runtimes: tuple[str, ...] = ("netns",),
                       workloads: tuple[str, ...] = WORKLOAD_KINDS, origin: str | None = None,
                       image: str | None = None) -> Framework:
    """Add a framework; ValueError for a bad or taken name or a part that is not what it must be."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"framework name {name!r}: lower case letters, digits and -, starting with a letter")
    if name in FRAMEWORKS:
        raise ValueError(f"framework {name} is registered already ({FRAMEWORKS[name].origin}): give yours another name")
    if not callable(run) or (missing is not None and not callable(missing)):
        raise ValueError(f"framework {name}: run and missing must be callable")
    if not runs or not all(isinstance(r, str) for r in runs):
        raise ValueError(f"framework {name}: runs must name the algorithms its collective executes, e.g. ('ring',)")
    if origin == "built-in" and not getattr(run, "__module__", "").startswith("orchestrator.frameworks."):
        raise ValueError(f"framework {name}: origin built-in is the project's own: leave origin out")
    unknown = [w for w in workloads if w not in WORKLOAD_KINDS]
    if unknown:
        raise ValueError(f"framework {name}: no workload kind {unknown[0]}: use some of {', '.join(WORKLOAD_KINDS)}")
    FRAMEWORKS[name] = Framework(name, run, tuple(runs), missing or (lambda: None), tuple(runtimes), tuple(workloads),
                                 origin or _loading(run), image)
    return FRAMEWORKS[name]


# where registrations come from while a plugin loads (orchestrator/plugins.py sets it)
_origin = Origin("framework_origin")
origin = _origin.within


def _loading(run: Callable) -> str:
    """Where a registration without an explicit origin comes from: the plugin being loaded,
    else the module of its run (never "built-in": only the built-ins say so)."""
    where = _origin.get()
    return where if where != "built-in" else getattr(run, "__module__", None) or "?"


def unregister_framework(name: str) -> None:
    """Forget a registered framework (tests, a plugin that failed half way); built-ins stay."""
    if name in FRAMEWORKS and FRAMEWORKS[name].origin == "built-in":
        raise ValueError(f"framework {name} is built in: it cannot be removed")
    FRAMEWORKS.pop(name, None)


def get(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown framework {name!r}: choose one of {', '.join(sorted(FRAMEWORKS))}") from None
