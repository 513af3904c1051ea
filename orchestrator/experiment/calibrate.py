"""`testbed calibrate`: what an emulated byte costs this machine's CPU, and what a message
costs the agents in time (α), measured, and kept.

On a star of 4 netns servers at 1 Gbit (fast enough that the CPU, not the link, is what a
second costs): the kernel alone, with iperf3 flows in a ring's pattern (each server to the
next, at once), then the agents' ring over each transport, back to back. Busy core-seconds
come from /proc/stat around each; cost/cpu.py says how they become a run's CPU need.
The machine should be quiet: what else runs is charged to the bytes.

α (the model's per-message latency, cost.Network.latency) is measured per lab and transport:
a zero-byte ring over every server of the lab, back to back (every agent busy at once, as in
a run: on a machine with fewer cores than servers, the agents' per-message work queues for
the CPU), and α is what makes the model's time for that ring equal the measured one
(cost/latency.py). A ping-pong between two servers (a ring of two) is kept beside it: the
cost of a message on a quiet pair. `testbed calibrate` measures star,4 and any `--lab`;
`testbed run` measures a lab it has not seen before its first point, so that its
predictions carry the α of the lab they are held against (latency.json).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, NamedTuple

from orchestrator.cost.cpu import Calibration
from orchestrator.emulation.journal import state_root, write_inside
from orchestrator.errors import TestbedError
from orchestrator.experiment.verdict import MAX_STEAL, MIN_IDLE

LAB = "star,4"
RATE = "1Gbit"
IPERF_SECONDS = 4
AGENT_MBYTES = 32
AGENT_ITERATIONS = 6
FILE = "calibration.json"
LATENCY_FILE = "latency.json"
# A zero-byte allreduce is timed back to back for about LATENCY_SECONDS (as the model times it
# at a guessed α), between LATENCY_TIMED's bounds, after LATENCY_WARMUP that open connections
LATENCY_SECONDS = 1.0
LATENCY_TIMED = (10, 50)
LATENCY_WARMUP = 10
_GUESSED_ALPHA = 1e-3
LATENCY_ELEMENTS_PER_RANK = 16  # 64 bytes a rank: the bytes' own time is noise beside α
_MAX_LATENCY_FILE = 256 * 1024
MAX_CORES = 4096


class NotCalibrated(TestbedError):
    """No calibration of this machine (or an unreadable one)."""


def path() -> Path:
    return state_root() / FILE


def load() -> Calibration:
    """This machine's calibration, or NotCalibrated saying what to do."""
    where = path()
    try:
        raw = where.read_bytes() if where.stat().st_size <= 64 * 1024 else b""
        return Calibration.from_json(json.loads(raw))
    except FileNotFoundError:
        raise NotCalibrated("this machine has not been calibrated: run `testbed calibrate` (root, ~1 minute)") from None
    except (OSError, ValueError) as exc:
        raise NotCalibrated(f"{where}: unreadable calibration ({exc}): run `testbed calibrate` again") from None


def _cpu() -> dict[str, float]:
    """The host's idle and busy CPU seconds, read as `testbed run`'s verdict reads them."""
    from orchestrator.monitoring.exporter import host_cpu

    return host_cpu()


def _busy_core_seconds(before: dict[str, float], after: dict[str, float]) -> float:
    return after["busy"] - before["busy"]


def _iperf3_ring(lab) -> tuple[float, float]:
    """(busy core-seconds, bytes delivered) of iperf3 flows h_i → h_i+1, all at once."""
    names = [s.name for s in lab.topology.servers]
    listeners = [lab.popen(n, ["iperf3", "-s", "-1"], stdout=-1, stderr=-1) for n in names]
    try:
        time.sleep(0.5)  # listening: iperf3 -s says nothing we could wait on
        before = _cpu()
        clients = [lab.popen(n, ["iperf3", "-c", str(lab.topology.address_of(names[(i + 1) % len(names)])),
                                 "-t", str(IPERF_SECONDS), "-J"], stdout=-1, stderr=-1, text=True)
                   for i, n in enumerate(names)]
        reports = [json.loads(c.communicate(timeout=IPERF_SECONDS + 30)[0]) for c in clients]
        after = _cpu()
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait()
    return _busy_core_seconds(before, after), sum(r["end"]["sum_received"]["bytes"] for r in reports)


def measure(transports: list[str], progress: Callable[[str], None] = lambda _: None) -> Calibration:
    """Bring up the calibration lab, measure, take it down."""
    from orchestrator.emulation import Lab
    from orchestrator.deploy import lab_agents
    from orchestrator.control import driver, workloads
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument(LAB, name="calibrate", **{"servers.runtime": "netns", "links.bandwidth": RATE})
    progress(f"lab {LAB} at {RATE}")
    with Lab.up(spec) as lab:
        progress("kernel: iperf3 in a ring's pattern")
        busy, delivered = _iperf3_ring(lab)
        # each byte crossed two link directions (up to the switch, down to the next server)
        hop = busy / (2 * delivered)
        endpoints = lab_agents.start(lab)
        agent = {}
        try:
            elements = AGENT_MBYTES * 2**20 // 4
            for transport in transports:
                progress(f"agents: ring over {transport}")
                driver.run(endpoints, "ring", [elements], workloads.back_to_back([elements]), iterations=1,
                           transport=transport)  # connections and buffers warm
                before = _cpu()
                result = driver.run(endpoints, "ring", [elements], workloads.back_to_back([elements]),
                                    iterations=AGENT_ITERATIONS, transport=transport)
                spent = _busy_core_seconds(before, _cpu())
                sent = sum(r.bytes_sent for res in result.results for r in res.records)
                agent[transport] = max(0.0, spent / sent - 2 * hop)
            _latencies(lab, endpoints, transports, progress)
        finally:
            lab_agents.stop(endpoints)
    return Calibration(os.cpu_count() or 1, hop, agent, float(spec.links.bandwidth),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"), _machine())


def lab_key(lab) -> str:
    """A lab spec's name in latency.json: its topology and runtime (`bcube-2-1 netns`)."""
    from orchestrator.experiment.sweep import LabVariant

    return f"{LabVariant(0, lab).topology} {lab.servers.runtime}"


def load_latency() -> dict[str, dict[str, dict[str, float]]]:
    """{lab key: {transport: {"alpha_s", "pingpong_s", ...}}} as kept (a file read back:
    checked, NotCalibrated naming the field)."""
    where = state_root() / LATENCY_FILE
    try:
        if where.stat().st_size > _MAX_LATENCY_FILE:
            raise ValueError(f"larger than {_MAX_LATENCY_FILE} bytes")
        raw = json.loads(where.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise NotCalibrated(f"{where}: unreadable ({exc}): remove it, or run `testbed calibrate` again") from None
    try:
        return _checked_latency(raw)
    except ValueError as exc:
        raise NotCalibrated(f"{where}: {exc}: remove it, or run `testbed calibrate` again") from None


def _checked_latency(raw: object) -> dict[str, dict[str, dict[str, float]]]:
    labs = raw.get("labs") if isinstance(raw, dict) else None
    if not isinstance(labs, dict):
        raise ValueError("labs: expected an object of lab: {transport: {alpha_s, pingpong_s}}")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, by_transport in labs.items():
        if not isinstance(by_transport, dict) or len(key) > 200:
            raise ValueError(f"labs.{key[:200]}: expected an object of transport: {{alpha_s, pingpong_s}}")
        for transport, values in by_transport.items():
            where = f"labs.{key}.{transport[:50]}"
            if not isinstance(values, dict):
                raise ValueError(f"{where}: expected an object")
            checked = {}
            for name in ("alpha_s", "pingpong_s", "allreduce_s", "peer_s", "mesh_s"):
                if name in ("peer_s", "mesh_s") and name not in values:  # files kept before they were measured
                    continue
                value = values.get(name)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
                    raise ValueError(f"{where}.{name}: expected seconds between 0 and 10, got {value!r}"[:300])
                checked[name] = float(value)
            cores = values.get("cores")
            if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= MAX_CORES:
                raise ValueError(f"{where}.cores: expected a count of cores from 1 to {MAX_CORES}, got {cores!r}"[:300])
            checked["cores"] = cores
            for name in ("cpu_idle_share", "cpu_steal_share"):
                if name in values:  # files kept before it was recorded have none
                    share = values[name]
                    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
                        raise ValueError(f"{where}.{name}: expected a share from 0 to 1, got {share!r}"[:300])
                    checked[name] = float(share)
            agents = values.get("agents")
            if agents is not None:  # files kept before it was recorded have none
                if not isinstance(agents, str) or len(agents) > 64:
                    raise ValueError(f"{where}.agents: expected a digest of up to 64 characters, got {agents!r}"[:300])
                checked["agents"] = agents
            out.setdefault(key, {})[transport] = checked
    return out


class Latency(NamedTuple):
    alpha: float  # seconds per message (cost.Network.latency)
    cores: int  # the cores the agents shared when it was measured (cost.Network.cores)
    peer: float = 0.0  # seconds more per message for each further peer (cost.Network.peer_latency)

    @classmethod
    def of(cls, measured: dict) -> "Latency":
        """From what measure_latency returns and latency.json keeps."""
        return cls(measured["alpha_s"], int(measured["cores"]), measured.get("peer_s", 0.0))


def agents_fingerprint() -> str:
    """Which agents an α is theirs: a digest of the agent package's code (engine, transports,
    native data path) and of whether the native data path is in use. The per-message cost is
    the agents' own: star,8 kept 155 µs measured on the Python data path, which the native
    one brought to about 90."""
    from orchestrator.agent import native

    return hashlib.sha256((b"native" if native.available() else b"python") + _agent_code()).hexdigest()[:16]


@functools.cache
def _agent_code() -> bytes:
    """A digest of the agent package's sources (read once: every planned point asks)."""
    root = Path(__file__).resolve().parents[1] / "agent"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c") and path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.digest()


def trusted(measured: dict) -> bool:
    """Was this α measured by these agents, with the CPU to spare? One measured by other
    agents (an upgrade, a checkout without the native data path: `agents_fingerprint`), or
    kept before that was recorded (or before the per-peer cost was), is measured again. On a
    busy machine the agents wait for a core, that wait is fitted as latency, and it was kept
    and reused by every later run on the lab (bcube,2,1 had 451 µs kept, from a moment
    nothing recorded; 209-275 µs measured on a quiet machine): one measured with less than
    the verdict's idle share (MIN_IDLE), or with more of the CPU's time held by a hypervisor
    than the verdict lets by (MAX_STEAL), is measured again too; one kept before the share was
    recorded is taken as it is."""
    return distrust(measured) is None


def distrust(measured: dict) -> str | None:
    """Why a kept α is not `trusted` ("measured while a hypervisor held 6 % of the CPU"), or
    None: what a dry run says of an α it will measure again."""
    if measured.get("agents") != agents_fingerprint():
        return "measured by other agents than these"
    if "peer_s" not in measured:
        return "kept without its per-peer cost"
    return _busy(measured)


def _busy(measured: dict) -> str | None:
    """How busy the machine was while it measured, when too busy to trust it (else None)."""
    idle, stolen = measured.get("cpu_idle_share", 1.0), measured.get("cpu_steal_share", 0.0)
    if idle < MIN_IDLE:
        return f"measured with the CPU {idle:.0%} idle (< {MIN_IDLE:.0%})"
    if stolen > MAX_STEAL:
        return f"measured while a hypervisor held {stolen:.0%} of the CPU (> {MAX_STEAL:.0%})"
    return None


def _quiet(measured: dict) -> bool:
    return _busy(measured) is None


def latency_for(lab, transport: str) -> Latency | None:
    """The α kept for `lab` (a LabSpec) over `transport`; None when it was not measured, or
    measured on a busy machine (`trusted`)."""
    kept, key = load_latency(), lab_key(lab)
    measured = kept.get(key, {}).get(transport)
    if measured is None or not trusted(measured):
        # the same topology under the other runtime: the agents' work is about the same
        # (bcube,2,1 measured back to back: netns 209-243 µs, Docker 271-275)
        topology = key.rsplit(" ", 1)[0]
        measured = next((by[transport] for other, by in sorted(kept.items())
                         if other.rsplit(" ", 1)[0] == topology and transport in by and trusted(by[transport])), None)
    return None if measured is None else Latency.of(measured)


def save_latency(lab, transport: str, measured: dict[str, float]) -> Path:
    """Keep `measured` (measure_latency's) for `lab` and `transport`, beside what is kept."""
    try:
        kept = load_latency()
    except NotCalibrated:
        kept = {}  # unreadable: measured anew, so written anew
    kept.setdefault(lab_key(lab), {})[transport] = {"agents": agents_fingerprint(), **measured}
    root = state_root()
    root.mkdir(parents=True, exist_ok=True)
    write_inside(root, LATENCY_FILE, json.dumps({"labs": kept}, indent=1, sort_keys=True) + "\n")
    return root / LATENCY_FILE


def measure_latency(lab, endpoints, transport: str) -> dict[str, float]:
    """α on `lab` over `transport` with its running agents `endpoints` (one per server): a
    zero-byte ring over all of them, and a ping-pong between the first two, each back to
    back; each fitted to the model (cost/latency.py). {"alpha_s", "pingpong_s", "allreduce_s", "cores",
    "cpu_idle_share", "cpu_steal_share", "agents"}: the machine's idle share while it measured,
    the share a hypervisor held (where the kernel counts it), and which agents measured it (see
    `trusted`)."""
    import dataclasses

    from orchestrator.collectives.context import Context
    from orchestrator.monitoring.exporter import idle_share, steal_share
    from orchestrator.cost import Network
    from orchestrator.cost.latency import fit_alpha
    from orchestrator.cost.predict import predict_schedules
    from orchestrator.cost.simulate import BASE_PEERS
    from orchestrator.agent import transports
    from orchestrator.agent.plan import chunk_bytes
    from orchestrator.collectives import registry
    from orchestrator.collectives.partition import partitions
    from orchestrator.experiment.results import sync_times
    from orchestrator.deploy import lab_agents

    from orchestrator.control import driver, workloads

    if len(endpoints) < 2:
        raise ValueError("α needs at least two servers to send between")
    links = Network.from_links(lab.spec.links)
    send_buffer = transports.get(transport).send_buffer
    cores = os.cpu_count() or 1

    def timed(eps: list, algorithm: str = "ring", alpha: float | None = None) -> tuple[float, float]:
        """A zero-byte `algorithm` over `eps`, back to back: its mean time, and α fitted to
        it (or, given α, the per-peer cost fitted beside it)."""
        eps = [dataclasses.replace(e, rank=i, role="worker") for i, e in enumerate(eps)]
        nodes = tuple(e.node for e in eps)
        elements = LATENCY_ELEMENTS_PER_RANK * len(eps)
        ctx = Context(len(eps), lab.topology, nodes, {})
        schedules = registry.schedules(algorithm, ctx, elements, partitions([elements], None))
        chunk = chunk_bytes(schedules, transport=transport)

        def model(value: float) -> float:
            costs = {"latency": value} if alpha is None else {"latency": alpha, "peer_latency": value}
            network = dataclasses.replace(links, cores=cores, **costs)
            return predict_schedules(lab.topology, schedules, list(nodes), network, chunk,
                                     send_buffer_bytes=send_buffer,
                                     rendezvous=transports.get(transport).rendezvous).per_run

        low, high = LATENCY_TIMED
        repeat = max(low, min(high, int(LATENCY_SECONDS / max(model(_GUESSED_ALPHA), 1e-6))))
        result = driver.run(eps, algorithm, [elements], workloads.back_to_back([elements]),
                            iterations=LATENCY_WARMUP + repeat, ctx=ctx, network=links,
                            flow_paths=lab_agents.flow_paths(lab, transport), transport=transport)
        sync = sync_times(result.records())[LATENCY_WARMUP:]
        measured = sum(sync) / len(sync)
        return fit_alpha(model, measured), measured

    before = _cpu()
    alpha, allreduce = timed(list(endpoints))
    pingpong, _ = timed(list(endpoints[:2]))
    # a mesh: every rank's messages to all the others in one step, each rank holding a
    # connection to every other; what its messages cost beyond the ring's α is per peer past
    # a ring's two (cost/simulate.py BASE_PEERS: with 3 servers a mesh has no more)
    peer, mesh = timed(list(endpoints), "mesh", alpha) if len(endpoints) > BASE_PEERS + 1 else (0.0, 0.0)
    after = _cpu()
    share, stolen = idle_share(before, after), steal_share(before, after)
    return {"alpha_s": alpha, "pingpong_s": pingpong, "allreduce_s": allreduce, "peer_s": peer, "mesh_s": mesh,
            "cores": cores, "cpu_idle_share": round(share, 4) if share is not None else 1.0,
            **({"cpu_steal_share": round(stolen, 4)} if stolen is not None else {}), "agents": agents_fingerprint()}


def _latencies(lab, endpoints, transports: list[str], progress: Callable[[str], None]) -> None:
    for transport in transports:
        progress(f"α: zero-byte ring and ping-pong over {transport}")
        measured = measure_latency(lab, endpoints, transport)
        save_latency(lab.spec, transport, measured)
        progress(f"α over {transport} on {lab_key(lab.spec)}: {describe_latency(measured)}")


def describe_latency(measured: dict[str, float]) -> str:
    idle, stolen = measured.get("cpu_idle_share"), measured.get("cpu_steal_share")
    cpu = "" if idle is None else f"; CPU {idle:.0%} idle" + (f", {stolen:.0%} held by the hypervisor" if stolen else "") + (
        "" if _quiet(measured) else ": too busy to keep trusting it, measured again next time")
    peer = "" if "peer_s" not in measured else (
        f", and {measured['peer_s'] * 1e6:,.0f} µs more per further peer (fitted to a zero-byte mesh of "
        f"{measured.get('mesh_s', 0.0) * 1e3:.2f} ms)")
    return (f"{measured['alpha_s'] * 1e6:,.0f} µs per message, the agents sharing {measured['cores']} cores "
            f"(fitted to a zero-byte ring of {measured['allreduce_s'] * 1e3:.2f} ms; a ping-pong between two "
            f"servers says {measured['pingpong_s'] * 1e6:,.0f} µs){peer}{cpu}")


def measure_lab_latency(argument: str, transports: list[str], progress: Callable[[str], None] = lambda _: None) -> str:
    """Bring up the lab `argument` names (netns), measure α on it over each transport, keep
    it, take the lab down. Its key in latency.json."""
    from orchestrator.emulation import Lab
    from orchestrator.deploy import lab_agents
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument(argument, name="calibrate-alpha", **{"servers.runtime": "netns"})
    progress(f"lab {argument}")
    with Lab.up(spec) as lab:
        endpoints = lab_agents.start(lab)
        try:
            _latencies(lab, endpoints, transports, progress)
        finally:
            lab_agents.stop(endpoints)
    return lab_key(spec)


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def save(calibration: Calibration) -> Path:
    where = path()
    where.parent.mkdir(parents=True, exist_ok=True)
    write_inside(where.parent, FILE, json.dumps(calibration.to_json(), indent=1) + "\n")
    return where


def need(prediction, topology, transport: str, calibration: Calibration):
    """cost.cpu.CpuNeed of one allreduce on `topology`, with the verdict's idle share kept."""
    from orchestrator.cost.cpu import cpu_need

    return cpu_need(prediction, calibration, transport, {s.name for s in topology.servers}, MIN_IDLE)


def describe(cpu) -> str:
    """One line: what a run needs of this machine and the rate it stays ok up to."""
    verdict = "fits" if cpu.fits else "too much for this machine: the verdict would read degraded"
    return (f"CPU: needs {cpu.cores:.2f} of the {cpu.available:.2f} cores a faithful run may take "
            f"({cpu.share:.0%}, {cpu.transport}): {verdict}; ok up to {rate_floor(cpu.max_rate)} links")


def rate_floor(bits_per_second: float) -> str:
    """`bits_per_second` rounded down to two significant figures, as a rate people write."""
    from orchestrator.units import format_rate

    if not math.isfinite(bits_per_second):
        return "any rate of"
    step = 10 ** max(0, math.floor(math.log10(max(bits_per_second, 1))) - 1)
    return format_rate(math.floor(bits_per_second / step) * step)


def plan_needs(plan) -> dict:
    """{point id: CpuNeed} of an experiment plan on this machine (NotCalibrated if unknown)."""
    from orchestrator import topology

    calibration = load()
    transport = plan.spec.agents.transport
    needs = {p.point.id: need(p.prediction, topology.from_lab(p.point.lab), transport, calibration) for p in plan.points}
    groups: dict[tuple, list[str]] = {}  # jobs that run together load the machine together
    for p in plan.points:
        if p.point.group is not None:
            groups.setdefault(p.point.group, []).append(p.point.id)
    for ids in groups.values():
        cores = sum(needs[i].cores for i in ids)
        for i in ids:
            needs[i] = dataclasses.replace(needs[i], cores=cores)
    return needs
