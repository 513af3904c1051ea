"""A link direction's queue discipline (`links.discipline`, or `links.queue` as a mapping).

    links: {queue: 1000}                                            # tail-drop FIFO (default)
    links: {queue: {packets: 1000, discipline: red, min: 30KB, max: 30KB, probability: 1}}
    links: {queue: {packets: 1000, discipline: fq_codel, ce_threshold: 1ms}}

`red` marks ECN-capable packets (drops the others) once the averaged queue passes `min`, all
of them past `max`: min = max with probability 1 is DCTCP's step marking at K. A threshold is
bytes with a unit (`30KB`) or packets as a bare number (of the links' MTU). `codel` and
`fq_codel` mark by sojourn time: `ce_threshold` marks every ECN-capable packet that waited
longer (DCTCP's use of them), `target`/`interval` are CoDel's own. The queue length is the
hard limit: for RED in bytes (packets × MTU, as RED counts), for the FIFO and CoDel in the
kernel's packets, which on veths may be GSO super-packets of up to 64 KiB each (a FIFO of
1000 then holds more bytes than RED's limit). A discipline needs its qdisc in the kernel
(features.require names the kernel option); a link with netem delay, jitter or loss keeps netem
as its queue, so neither goes with a marking discipline.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from orchestrator import units

DISCIPLINES = ("fifo", "red", "codel", "fq_codel")
# the kernel option each discipline's qdisc needs (what a refusal names)
KERNEL_OPTIONS = {"red": "CONFIG_NET_SCH_RED", "codel": "CONFIG_NET_SCH_CODEL", "fq_codel": "CONFIG_NET_SCH_FQ_CODEL"}
MAX_CODEL_TIME = 4.0  # CoDel's times are u32 microseconds; seconds of standing queue is no target


def _threshold(value: Any) -> Any:
    """A RED threshold: packets as a bare whole number, bytes with a unit (`30KB`, `64k`)."""
    if isinstance(value, bool):
        raise ValueError("must be packets (e.g. 20) or bytes with a unit (e.g. 30KB)")
    if isinstance(value, int):
        return {"packets": value}
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return {"packets": int(text)}
        return {"bytes": units.parse_size(text)}
    return value


class Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    packets: int | None = Field(None, ge=1, le=1_000_000)
    bytes: int | None = Field(None, ge=1, le=1 << 30)

    def in_bytes(self, mtu: int) -> int:
        return self.bytes if self.bytes is not None else self.packets * mtu

    def __str__(self) -> str:
        return f"{self.packets}" if self.packets is not None else f"{self.bytes}B"


QueueThreshold = Annotated[Threshold, BeforeValidator(_threshold), PlainSerializer(str)]
CodelTime = Annotated[
    float,
    BeforeValidator(lambda v: units.parse_duration(v) if v is not None else v),
    Field(gt=0, le=MAX_CODEL_TIME),
    PlainSerializer(lambda s: f"{s * 1000:g}ms"),
]


class _Discipline(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def marks(self) -> bool:
        """Whether it marks ECN-capable packets rather than drop them."""
        return False


class Fifo(_Discipline):
    """Tail drop at the queue's length (the kernel's pfifo)."""

    kind: Literal["fifo"] = "fifo"


class Red(_Discipline):
    """RED on the averaged queue: probability rising from 0 at `min` to `probability` at `max`,
    every packet from `max` on; ECN-capable packets marked, not dropped, with `ecn`."""

    kind: Literal["red"]
    min: QueueThreshold = Field(description="bytes with a unit (30KB) or packets (20)")
    max: QueueThreshold = Field(description="at least min; min = max marks as a step (DCTCP's K)")
    probability: float = Field(1.0, gt=0, le=1, description="marking probability at max, e.g. 0.1")
    ecn: bool = True
    # DCTCP's setting: its pure ACKs are not ECN-capable, and RED would drop them early on a
    # link that carries data both ways (Linux 5.10+)
    nodrop: bool = Field(False, description="with ecn, queue what cannot be marked (up to the limit) rather "
                                            "than drop it early")

    @property
    def marks(self) -> bool:
        return self.ecn


class Codel(_Discipline):
    """CoDel on each packet's sojourn time; with `ce_threshold`, every ECN-capable packet
    that waited longer is marked CE (what DCTCP reacts to)."""

    kind: Literal["codel", "fq_codel"]
    target: CodelTime = Field(0.005, description="acceptable standing delay, e.g. 5ms")
    interval: CodelTime = Field(0.1, description="CoDel's window, e.g. 100ms")
    ce_threshold: CodelTime | None = Field(None, description="mark CE beyond this sojourn, e.g. 1ms")
    ecn: bool = True

    @property
    def marks(self) -> bool:
        return self.ecn or self.ce_threshold is not None


Discipline = Annotated[Union[Fifo, Red, Codel], Field(discriminator="kind")]


def _setting(value: Any) -> Any:
    """A sweep's queue as links.queue is written: packets, or a mapping with a discipline."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"packets": value}
    if isinstance(value, dict) and "discipline" in value:
        rest = {k: v for k, v in value.items() if k not in ("packets", "discipline")}
        return {**({"packets": value["packets"]} if "packets" in value else {}),
                "discipline": {"kind": value["discipline"], **rest}}
    return value


class QueueSetting(BaseModel):
    """One value of `sweep.queues`: a queue length (packets; None keeps the lab's) and its
    discipline, written as `links.queue` is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    packets: int | None = Field(None, strict=True, ge=1, le=1_000_000)
    discipline: Discipline = Field(default_factory=Fifo)

    @property
    def label(self) -> str:
        """What point ids, results and plots call it: every field it sets apart from the
        defaults, e.g. fifo1000, red20-20-q500-nodrop, fq_codel-ce1ms-t2ms."""
        d = self.discipline
        parts = [d.kind + (f"{d.min}-{d.max}".lower() if isinstance(d, Red) else f"{self.packets or ''}"
                           if d.kind == "fifo" else "")]
        if d.kind != "fifo" and self.packets:
            parts.append(f"q{self.packets}")
        defaults = type(d)(**{"kind": d.kind, **({"min": d.min, "max": d.max} if isinstance(d, Red) else {})})
        short = {"probability": "p", "ecn": "ecn", "nodrop": "nodrop", "target": "t", "interval": "i",
                 "ce_threshold": "ce"}
        for field, name in short.items():
            value = getattr(d, field, None)
            if value is None or value == getattr(defaults, field, None):
                continue
            if isinstance(value, bool):
                parts.append(name if value else f"no{name}")
            elif field == "probability":
                parts.append(f"p{value:g}")
            else:
                parts.append(f"{name}{value * 1000:g}ms")
        return "-".join(parts)


Setting = Annotated[QueueSetting, BeforeValidator(_setting)]


def hoist_queue(data: Any) -> Any:
    """`links.queue` as a mapping ({packets, discipline, ...}) into `queue` (the packets) and
    `discipline` (the rest); a plain number stays the FIFO's length."""
    if not isinstance(data, dict) or not isinstance(data.get("queue"), dict):
        return data
    queue = dict(data["queue"])
    if "discipline" in data:
        raise ValueError("give the discipline once: in links.queue or in links.discipline, not both")
    out = {key: value for key, value in data.items() if key != "queue"}
    if "packets" in queue:
        out["queue"] = queue.pop("packets")
    kind = queue.pop("discipline", "fifo")
    out["discipline"] = {"kind": kind, **queue}
    return out


def red_wlog(low: int, high: int, avpkt: int) -> int | None:
    """RED's averaging weight 2^-Wlog, as tc derives it (iproute2's tc_red_eval_ewma): the
    one that lets tc's default burst ((2·min + max) / 3 packets; one more than min's packets
    where that is too few, tc's own advice) in before the average reaches min. None: no
    weight does (min of one packet or less with a burst of two or more)."""
    burst = max(1, (2 * low + high) // (3 * avpkt))
    allowed = burst + 1 - low / avpkt
    if allowed < 1.0:
        burst = 1 + low // avpkt
        allowed = burst + 1 - low / avpkt
    weight = 0.5
    for wlog in range(1, 32):
        if allowed <= (1 - (1 - weight) ** burst) / weight:
            return wlog
        weight /= 2
    return None


def check(discipline: Fifo | Red | Codel, queue: int, mtu: int, netem: bool, where: str = "links") -> None:
    """What the fields alone cannot: thresholds within the queue, no netem on a marking queue
    (ValueError, one line)."""
    if discipline.kind == "fifo":
        return
    if netem:
        raise ValueError(f"{where}.discipline {discipline.kind}: a link with delay, jitter or loss keeps netem as "
                         "its queue: set them to 0, or use discipline fifo")
    if isinstance(discipline, Red):
        if discipline.nodrop and not discipline.ecn:
            raise ValueError(f"{where}.discipline: red's nodrop keeps what it would mark: it needs ecn: true")
        low, high, limit = discipline.min.in_bytes(mtu), discipline.max.in_bytes(mtu), queue * mtu
        if low > high:
            raise ValueError(f"{where}.discipline: red's min ({discipline.min}) is above its max ({discipline.max}): "
                             "swap them")
        if high >= limit:
            raise ValueError(f"{where}.discipline: red's max ({high} bytes) must stay below the queue's length "
                             f"({queue} packets × mtu {mtu} = {limit} bytes): raise the queue or lower max")
        wlog = red_wlog(low, high, mtu)
        if wlog is None:
            raise ValueError(f"{where}.discipline: red's min ({discipline.min}) leaves its average no weight to "
                             f"work with (tc finds none either): give min more than one packet ({mtu} bytes)")
        if max(low, high).bit_length() + wlog >= 32:  # the kernel's red_check_params
            raise ValueError(f"{where}.discipline: red's max ({high} bytes) is too far above its min ({low} bytes) "
                             f"for the kernel's fixed point (its average weight is 2^-{wlog}): bring them closer, or raise min")
