"""`testbed calibrate`: what an emulated byte costs this machine's CPU, measured, and kept.

On a star of 4 netns servers at 1 Gbit (fast enough that the CPU, not the link, is what a
second costs): the kernel alone, with iperf3 flows in a ring's pattern (each server to the
next, at once), then the agents' ring over each transport, back to back. Busy core-seconds
come from /proc/stat around each; cost/cpu.py says how they become a run's CPU need.
The machine should be quiet: what else runs is charged to the bytes.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from orchestrator.cost.cpu import Calibration
from orchestrator.emulation.journal import state_root, write_inside
from orchestrator.errors import TestbedError

LAB = "star,4"
RATE = "1Gbit"
IPERF_SECONDS = 4
AGENT_MBYTES = 32
AGENT_ITERATIONS = 6
FILE = "calibration.json"


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


def _cpu() -> tuple[int, int]:
    fields = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return sum(fields), fields[3] + fields[4]


def _busy_core_seconds(before: tuple[int, int], after: tuple[int, int]) -> float:
    return ((after[0] - before[0]) - (after[1] - before[1])) / os.sysconf("SC_CLK_TCK")


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
    from orchestrator.runner import driver, lab_agents, workloads
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
        finally:
            lab_agents.stop(endpoints)
    return Calibration(os.cpu_count() or 1, hop, agent, float(spec.links.bandwidth),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"), _machine())


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
    from orchestrator.experiment.verdict import MIN_IDLE

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
    return {p.point.id: need(p.prediction, topology.from_lab(p.point.lab), transport, calibration) for p in plan.points}
