"""Marking queue disciplines under a link end's HTB class (spec/queues.py says what each is):
their netlink requests (kernel.root_qdiscs reads the marks the kernel counts for them).

Encoded here rather than through pyroute2, which has no RED and logs a warning per CoDel
option. RED's parameters are derived as tc(8) derives them (iproute2's tc_red.c): the EWMA
weight from the burst it allows, Plog from the probability's slope, and the idle-time table
that lets the average decay while the queue is empty.
"""

from __future__ import annotations

import math
import socket
import struct
from functools import lru_cache
from pathlib import Path

from orchestrator.emulation import kernel
from orchestrator.spec.queues import red_wlog

TCA_RED_PARMS, TCA_RED_STAB, TCA_RED_MAX_P, TCA_RED_FLAGS = 1, 2, 3, 4
TC_RED_ECN, TC_RED_NODROP, TC_RED_FLAGS_SELECTOR = 1, 8, 0x0F  # the flags tc (iproute2 6.1) may set
# attribute numbers, in the order pyroute2 writes them (tests compare bytes)
CODEL = {"limit": 2, "ecn": 4, "target": 1, "ce_threshold": 5, "interval": 3}
FQ_CODEL = {"limit": 2, "ecn": 4, "target": 1, "ce_threshold": 7, "interval": 3}


def leaf_message(index: int, command: str, discipline, packets: int, mtu: int, rate_bps: int) -> bytes:
    """The request that puts `discipline` (a spec/queues.py model, not fifo) under the HTB
    class of interface `index`; `packets` is its hard limit."""
    flags = kernel.REPLACE if command == "replace" else kernel.CREATE
    header = struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, kernel.LEAF, kernel.HTB_CLASS, 0)
    kind = discipline.kind
    if kind == "red":
        options = red_options(discipline, packets, mtu, rate_bps)
    else:
        table = CODEL if kind == "codel" else FQ_CODEL
        values = {"limit": packets, "ecn": int(discipline.ecn), "target": _us(discipline.target),
                  "ce_threshold": discipline.ce_threshold and _us(discipline.ce_threshold),
                  "interval": _us(discipline.interval)}
        options = b"".join(kernel._attr(number, struct.pack("=I", values[key])) for key, number in table.items()
                           if values[key] is not None)
    body = (header + kernel._attr(kernel.TCA_KIND, kind.encode() + b"\0")
            + kernel._attr(kernel.TCA_OPTIONS, options))
    return kernel._message(kernel.RTM_NEWQDISC, flags, body)


def _us(seconds: float) -> int:
    return max(1, round(seconds * 1e6))


def red_options(red, packets: int, mtu: int, rate_bps: int) -> bytes:
    """TCA_OPTIONS of a RED qdisc: limit (bytes) = packets × mtu, thresholds in bytes, the
    average packet the links' MTU, the burst tc's default ((2·min + max) / 3 packets)."""
    low, high = red.min.in_bytes(mtu), red.max.in_bytes(mtu)
    wlog, plog, scell_log, stab = red_parameters(low, high, mtu, red.probability, rate_bps)
    qopt = struct.pack("=IIIBBBB", packets * mtu, low, high, wlog, plog, scell_log, 0)
    max_p = int(red.probability * 2**32) % 2**32  # as tc: probability 1 is 0, "derive it from Plog"
    flags = struct.pack("=II", (TC_RED_ECN if red.ecn else 0) | (TC_RED_NODROP if red.nodrop else 0),
                        TC_RED_FLAGS_SELECTOR)  # nla_bitfield32
    return (kernel._attr(TCA_RED_PARMS, qopt) + kernel._attr(TCA_RED_STAB, stab)
            + kernel._attr(TCA_RED_MAX_P, struct.pack("=I", max_p)) + kernel._attr(TCA_RED_FLAGS, flags))


def red_parameters(low: int, high: int, avpkt: int, probability: float, rate_bps: int) -> tuple[int, int, int, bytes]:
    """(Wlog, Plog, Scell_log, stab) as tc computes them for these thresholds (bytes); the
    spec refuses thresholds with no averaging weight (spec/queues.red_wlog)."""
    wlog = red_wlog(low, high, avpkt) or 31
    plog = _plog(low, high, probability)
    scell_log, stab = _idle_damping(wlog, avpkt, rate_bps / 8)
    return wlog, plog, scell_log, stab


def _plog(low: int, high: int, probability: float) -> int:
    span = high - low
    if span <= 0:
        return 0
    slope = probability / span
    for plog in range(32):
        if slope > 1.0:
            return plog
        slope *= 2
    return 31


@lru_cache(maxsize=1)
def _tick_in_usec() -> float:
    """The kernel's packet-scheduler clock, as tc reads it from /proc/net/psched."""
    try:
        t2us, us2t, clock_res = (int(word, 16) for word in Path("/proc/net/psched").read_text().split()[:3])
    except (OSError, ValueError):
        return 15.625  # 64 ns ticks: every kernel since 2.6.24
    if clock_res == 1_000_000_000:
        t2us = us2t
    return t2us / us2t * (clock_res / 1_000_000)


def _idle_damping(wlog: int, avpkt: int, bytes_per_s: float) -> tuple[int, bytes]:
    """(Scell_log, the 256-entry table) by which the average decays over an idle period, as if
    packets of `avpkt` had kept leaving at the link's rate."""
    # tc's tc_calc_xmittime: whole microseconds, then whole ticks (its unsigned arithmetic)
    xmit_time = max(1, int(int(1e6 * avpkt / bytes_per_s) * _tick_in_usec()))
    decay = -math.log(1.0 - 1.0 / (1 << wlog)) / xmit_time
    longest = 31 / decay
    scell_log = next((c for c in range(32) if longest / (1 << c) < 512), 31)
    table = bytearray(256)
    for i in range(1, 255):
        table[i] = min(31, int((i << scell_log) * decay))
    table[255] = 31
    return scell_log, bytes(table)
