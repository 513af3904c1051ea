"""Whether this machine can carry a run: the CPU an emulated allreduce needs, from the
prediction and what `testbed calibrate` measured here. Pure arithmetic.

Every byte that crosses a link direction of the lab costs the kernel a veth crossing, its
HTB shaper and the switch's forwarding (`hop`: core-seconds per byte and link direction,
measured with iperf3 in a ring's pattern, whose sockets' own copies it includes). Every
byte an agent sends costs its transport on top (`agent[transport]`: core-seconds per byte
sent, beyond the hops, measured with the agents' ring on the same lab). So an allreduce
that the model times at t seconds needs

    cores = (Σ link-direction bytes × hop + Σ bytes servers send × agent) / t

and its verdict stays ok while that leaves the verdict's idle share (verdict.MIN_IDLE) of
the machine's cores free. Both terms scale with the link rate (t ∝ 1 / rate while the
links, not latency, set the time), so the highest rate that stays ok is the rate × what
the machine has / what the run needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.cost.predict import Prediction


@dataclass(frozen=True)
class Calibration:
    cores: int
    hop: float  # core-seconds per byte per link direction crossed
    agent: dict[str, float]  # transport → core-seconds per byte an agent sends, beyond the hops
    rate: float  # link rate (bit/s) it was measured at
    measured_at: str = ""
    machine: str = ""

    def to_json(self) -> dict:
        return {"cores": self.cores, "hop_core_s_per_gb": self.hop * 1e9,
                "agent_core_s_per_gb": {t: v * 1e9 for t, v in self.agent.items()},
                "rate_bit_s": self.rate, "measured_at": self.measured_at, "machine": self.machine}

    @classmethod
    def from_json(cls, raw: object) -> "Calibration":
        """From what `to_json` wrote (a file read back: checked, ValueError naming the field)."""
        if not isinstance(raw, dict):
            raise ValueError("expected an object")

        def number(key: str, value: object, low: float = 0.0) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
                raise ValueError(f"{key}: expected a finite number >= {low}, got {value!r}")
            return float(value)

        agent = raw.get("agent_core_s_per_gb")
        if not isinstance(agent, dict) or not agent:
            raise ValueError("agent_core_s_per_gb: expected an object of transport: core-seconds per GB")
        cores = number("cores", raw.get("cores"), 1)
        return cls(int(cores), number("hop_core_s_per_gb", raw.get("hop_core_s_per_gb")) / 1e9,
                   {str(t): number(f"agent_core_s_per_gb.{t}", v) / 1e9 for t, v in agent.items()},
                   number("rate_bit_s", raw.get("rate_bit_s"), 1), str(raw.get("measured_at", ""))[:64],
                   str(raw.get("machine", ""))[:200])


@dataclass(frozen=True)
class CpuNeed:
    cores: float  # the run needs, at its link rate
    available: float  # cores it may take and keep its verdict ok (cores × (1 − MIN_IDLE))
    rate: float  # the run's link rate, bit/s
    transport: str

    @property
    def share(self) -> float:
        return self.cores / self.available if self.available else math.inf

    @property
    def fits(self) -> bool:
        return self.cores <= self.available

    @property
    def max_rate(self) -> float:
        """The highest link rate at which the verdict should stay ok (bit/s)."""
        return self.rate / self.share if self.cores else math.inf


def cpu_need(prediction: Prediction, calibration: Calibration, transport: str, servers: set[str],
             min_idle: float) -> CpuNeed:
    """What `prediction`'s allreduce asks of this machine's CPU; `servers`: the lab's server
    names (the bytes on link directions leaving them are what agents send)."""
    if transport not in calibration.agent:
        raise KeyError(f"transport {transport} was not calibrated: run testbed calibrate again")
    hops = sum(load.bytes for load in prediction.links)
    sent = sum(load.bytes for load in prediction.links if load.link.split("→", 1)[0] in servers)
    work = hops * calibration.hop + sent * calibration.agent[transport]
    cores = work / prediction.per_run if prediction.per_run > 0 else 0.0
    return CpuNeed(cores, calibration.cores * (1 - min_idle), prediction.network.bandwidth, transport)
