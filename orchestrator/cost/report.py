"""`testbed predict`: a prediction for a lab, beside its closed form, as text or JSON.

The lab comes in validated (anything with `name`, `topology`, `addressing`, `links`); this
module only builds, predicts and formats, so the command stays a thin layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from orchestrator import topology as topology_lib
from orchestrator.collectives import registry
from orchestrator.collectives.partition import check_gradient_bytes
from orchestrator.cost.closed_forms import Form, closed_form
from orchestrator.cost.compiled import CompiledRun, over_servers
from orchestrator.cost.network import Network
from orchestrator.cost.predict import Prediction, Schedules
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import DEFAULT_CHUNK_BYTES, DEFAULT_SEND_BUFFER_BYTES
from orchestrator.errors import BadUsage
from orchestrator.topology.partition import check_mtu, place


@dataclass(frozen=True)
class Report:
    lab: str
    kind: str
    params: dict
    prediction: Prediction
    form: Form | None
    chunk_bytes: int
    credit_bytes: int
    partitions: int

    @property
    def form_seconds(self) -> float | None:
        if self.form is None:
            return None
        network = self.prediction.network
        return self.form.seconds(self.prediction.size_bytes, network.payload_rate, network.latency)

    def to_json(self) -> dict:
        return {
            "lab": self.lab, "topology": {"kind": self.kind, **self.params},
            **self.prediction.to_json(),
            "closed_form": None if self.form is None else {
                "seconds": self.form_seconds, "factor": self.form.factor, "alpha_terms": self.form.steps,
                "source": self.form.source},
            "chunk_bytes": self.chunk_bytes, "credit_bytes": self.credit_bytes, "partitions": self.partitions,
        }


def parse_options(pairs: Sequence[str]) -> dict:
    """Algorithm options from KEY=VALUE strings; values are JSON where they parse as JSON
    (4, true, [3, 4]), else strings."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadUsage(f"--option {pair!r}: write KEY=VALUE, e.g. --option shards=4")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def predict_lab(
    lab,
    algorithm: str,
    size_bytes: int,
    workers: int | None = None,
    options: dict | None = None,
    partition_bytes: int | None = None,
    credit_bytes: int = 0,
    chunk_bytes: int | Callable[[Schedules, int], int] = DEFAULT_CHUNK_BYTES,
    efficiency: float | None = None,
    latency: float = 0.0,
    cores: int | None = None,
    peer_latency: float = 0.0,
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
    rendezvous: bool = False,
    hosts: list | None = None,
) -> Report:
    """Predict `algorithm` over `lab`'s servers; BadUsage (one line) for what cannot run.
    `hosts` (topology.partition.Host): the lab split over them, each host's NIC a shared
    resource of the model where its rate is known."""
    if algorithm not in registry.ALGORITHMS:
        raise BadUsage(f"unknown algorithm {algorithm!r}: choose one of {', '.join(sorted(registry.ALGORITHMS))}")
    try:
        check_gradient_bytes(size_bytes)
    except ValueError as exc:
        raise BadUsage(f"--size: {exc}: give a gradient size such as 25MB or 1G") from None
    try:
        options = registry.check_options(algorithm, options)
    except ValueError as exc:
        raise BadUsage(f"--option: {exc}") from None
    topology = topology_lib.from_lab(lab)

    def compiled(partition: int | None) -> CompiledRun:
        return over_servers(topology, algorithm, size_bytes, workers, options, partition, credit_bytes=credit_bytes,
                            chunk_bytes=chunk_bytes, send_buffer_bytes=send_buffer_bytes,
                            rendezvous=rendezvous, prediction_only=True)

    routes = None
    if hosts:
        placement = place(topology, hosts, default_bps=lab.links.bandwidth)
        check_mtu(placement, lab.links.mtu)
        routes = Routes(topology, underlay=placement.underlay(lab.links.mtu))
    try:
        network = Network.from_links(lab.links, efficiency, latency, cores, peer_latency=peer_latency)
        run = compiled(partition_bytes).predicted(network, topology, routes=routes)
        whole = compiled(None).schedules if partition_bytes else run.schedules
        form = closed_form(whole[0][1], topology) if whole else None
    except (ValueError, TypeError) as exc:  # options, the work budget (registry, simulate), too few servers
        raise BadUsage(f"{algorithm} on {lab.name}: {exc}") from None
    return Report(lab.name, topology.kind, dict(topology.params), run.prediction, form, run.chunk_bytes, credit_bytes,
                  len(run.schedules))


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _rate(bytes_per_second: float) -> str:
    bits = bytes_per_second * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.4g} bit/s"


def render(report: Report, top: int = 8) -> str:
    """The report as lines of text for people."""
    p, network = report.prediction, report.prediction.network
    params = " ".join(f"{k}={v}" for k, v in report.params.items())
    lines = [
        f"{report.lab} ({report.kind} {params}): {p.algorithm}, {_size(p.size_bytes)} over {p.workers} workers"
        + (f" in {report.partitions} partitions" if report.partitions > 1 else ""),
        f"links {_rate(network.bandwidth / 8)} × efficiency {network.efficiency:.4f} = {_rate(network.payload_rate)} "
        f"payload; α {network.latency * 1e6:g} µs" + (f" ({network.cores} cores shared)" if network.cores else "")
        + f", delay {network.delay * 1e6:g} µs per link; "
        f"messages of {_size(report.chunk_bytes)}",
        f"time per allreduce  {p.seconds:.6g} s  ({p.seconds * network.payload_rate / p.size_bytes:.4f} S/B)"
        + ("" if p.back_to_back is None else
           f"; back to back {p.back_to_back:.6g} s ({p.back_to_back * network.payload_rate / p.size_bytes:.4f} S/B)"),
        f"algbw {_rate(p.algbw)}   busbw {_rate(p.busbw)}",
    ]
    if p.model == "steps":
        lines.append("model               step by step (cost/stepwise.py): the plan is past what the event simulation "
                     "takes; where both run, rings and HiPS come out as it says, halving-doubling at 0.74-1.08 of it")
    if report.form is None:
        lines.append("closed form         none applies")
    else:
        ratio = p.seconds / report.form_seconds if report.form_seconds else float("nan")
        lines.append(f"closed form         {report.form_seconds:.6g} s  ({report.form.factor:.4f} S/B"
                     + (f" + {report.form.steps} α" if network.latency else "") + f"; predicted / form {ratio:.3f})")
        lines.append(f"                    {report.form.source}")
    bottlenecks = p.bottlenecks()
    if bottlenecks:
        same = len({round(load.bytes) for load in bottlenecks}) == 1
        lines.append(f"bottlenecks: {len(bottlenecks)} of the {len(p.links)} link directions in use are the busiest "
                     f"for their rate" + (f", {_size(bottlenecks[0].bytes)} each" if same else "")
                     + f"; the busiest {min(top, len(p.links))}:")
    for load in sorted(p.links, key=lambda load: (-load.utilisation, -load.bytes, load.link))[:top]:
        lines.append(f"  {load.link:<28} {_size(load.bytes):>11}  {load.utilisation:6.1%}")
    return "\n".join(lines)
