#!/usr/bin/env python3
"""Fault injection latency and reroute time on fattree,4 (netns), each against a bare
`ip link set` measured in the same run.

    sudo .venv/bin/python bench/faults.py [--repeats 7]

1. injection latency: `Injector.inject("link-down", AGG-CORE)` from call to return, by
   which time both ends are down and the routes around them are in (a link-down's undo is
   timed too). Goal: ≤ 50 ms. Baseline: `ip netns exec NS ip link set dev X down` of one
   end (a fork and exec, no rerouting).
2. reroute time: a UDP stream, one datagram every 0.5 ms carrying its send time, from a
   host in pod 1 to a host in pod 0 whose path crosses the cut aggregation-core link (the
   kernel's L3 multipath hash keeps a pair on one path; traceroute finds which). Reroute
   time = send time of the first datagram that arrives after the last lost one, minus the
   moment the fault was asked for: fault to restored reachability. Goal: ≤ 100 ms.
3. BML on bcube,4,1 (`--bml`): GST (NCCL-tests' time per allreduce, as bench/fidelity.py;
   the slowest agent's mean GST beside it) with no failure and with one crashed server (the run
   survives it: driver.run(survive=True) re-forms BML with the server `failed`), beside the
   seed's closed forms for BCube(m,2), m = 4: (m²−1)/m²·T healthy, m²/(m²−1)·T with one
   failure (T = P/B; REFERENCE.md), and the cost model's prediction of the same schedules.
   Goal: each within 15 % of its closed form.
Each figure is the median of --repeats runs. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.collectives.context import Context  # noqa: E402
from orchestrator.cost import Network  # noqa: E402
from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.faults import Injector  # noqa: E402
from orchestrator.monitoring.exporter import host_cpu  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.control import driver, workloads  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

BML_GOAL = 0.15

SENDER = """
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
seq, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s.sendto(struct.pack("!Id", seq, time.monotonic()), (sys.argv[1], 9999))
    seq += 1
    time.sleep(0.0005)
"""
RECEIVER = """
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 9999)); s.settimeout(1.0)
got = []
try:
    while True:
        got.append(struct.unpack("!Id", s.recv(64)))
except socket.timeout:
    pass
print("\\n".join(f"{q} {t}" for q, t in got))
"""


def traced(lab: Lab, src: str, address: str) -> list[str]:
    proc = lab.popen(src, ["traceroute", "-n", "-I", "-q", "1", "-w", "1", "-m", "8", address], stdout=-1, text=True)
    out, _ = proc.communicate(timeout=60)
    hops = []
    for line in out.splitlines()[1:]:
        match = re.match(r"\s*\d+\s+(\d+\.\d+\.\d+\.\d+)", line)
        owner = lab.topology.owner(match.group(1)) if match else None
        hops.append(owner.node if owner else "*")
    return hops


def crossing_link(lab: Lab, src: str, dst: str) -> str:
    """The aggregation-core link (AGG-CORE) the routed path src → dst goes down through."""
    path = traced(lab, src, str(lab.topology.address_of(dst)))
    core = next(n for n in path if re.fullmatch(r"c\d+", n))
    agg = path[path.index(core) + 1]
    return f"{agg}-{core}"


def reroute_once(lab: Lab, injector: Injector, src: str, dst: str, link: str) -> tuple[float, float]:
    """(reroute seconds, inject seconds) for one cut of `link` under a stream src → dst."""
    address = str(lab.topology.address_of(dst))
    receiver = lab.popen(dst, [sys.executable, "-c", RECEIVER, address], stdout=-1, text=True)
    time.sleep(0.3)
    sender = lab.popen(src, [sys.executable, "-c", SENDER, address, "1.2"])
    time.sleep(0.4)
    asked = time.monotonic()
    done = injector.inject("link-down", link)
    sender.wait(timeout=30)
    out, _ = receiver.communicate(timeout=30)
    injector.undo(done.fault.id)
    got = sorted((int(q), float(t)) for q, t in (line.split() for line in out.splitlines() if line))
    seqs = {q for q, _ in got}
    lost = [q for q in range(max(seqs) + 1) if q not in seqs]
    if not lost:
        return 0.0, done.seconds
    restored = min(t for q, t in got if q > max(lost))
    return max(0.0, restored - asked), done.seconds


def bare_link_set(lab: Lab, node: str, interface: str) -> float:
    ns = lab.namespace(node)
    started = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "dev", interface, "down"], check=True)
    seconds = time.perf_counter() - started
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "dev", interface, "up"], check=True)
    return seconds


def bml_gst(lab: Lab, network: Network, elements: int, iterations: int, warmup: int,
            failed: str | None) -> dict:
    """BML's mean GST over `iterations` timed ones, every server's agent asked to take part;
    with `failed`, that server crashed first (its agent killed, its links cut)."""
    endpoints = lab_agents.start(lab, via="exec")
    injector = Injector(lab)
    applied = injector.inject("server-crash", failed).fault if failed else None
    cpu_before = host_cpu()
    try:
        ctx = Context(len(endpoints), lab.topology, tuple(e.node for e in endpoints))
        result = driver.run(endpoints, "bml", [elements], workloads.back_to_back([elements]),
                            iterations=warmup + iterations, ctx=ctx, network=network, survive=True)
    finally:
        if applied:
            injector.undo(applied.id)
        driver.shutdown(endpoints)
    cpu = {mode: host_cpu()[mode] - cpu_before[mode] for mode in ("idle", "busy")}
    members = result.history[-1].nodes if result.history else tuple(e.node for e in endpoints)
    # NCCL-tests' time per allreduce (bench/fidelity.py's figure), and the slowest agent's GST
    return {"gst_s": statistics.fmean(result.back_to_back_times(warmup)),
            "slowest_gst_s": statistics.fmean(result.gst()[-iterations:]), "predicted_s": result.predicted.seconds if result.predicted else None,
            "servers": len(members), "failed": failed, "cpu_idle": cpu["idle"] / (cpu["idle"] + cpu["busy"])}


def bml_section(iterations: int, warmup: int, mbytes: float, rate: str) -> dict:
    spec = lab_from_argument("bcube,4,1", name="ftbml", **{"servers.runtime": "netns", "links.bandwidth": rate})
    network = Network.from_links(spec.links)
    elements = int(mbytes * 1e6) // 4
    t = elements * 4 / (network.bandwidth / 8)  # T = P/B
    m = 4
    forms = {None: (m * m - 1) / (m * m) * t, "h11": (m * m) / (m * m - 1) * t}
    rows = []
    with Lab.up(spec) as lab:
        for failed, form in forms.items():
            row = bml_gst(lab, network, elements, iterations, warmup, failed)
            row |= {"closed_form_s": form, "ratio_to_form": row["gst_s"] / form}
            rows.append(row)
    print(f"\nBML on bcube,4,1 at {rate}, {mbytes:g} MB, mean GST of {iterations} iterations after {warmup}:")
    for row in rows:
        label = f"one failed server ({row['failed']})" if row["failed"] else "no failure"
        predicted = f"{row['predicted_s']:.3f}" if row["predicted_s"] else "?"
        print(f"  {label:28} {row['gst_s']:7.3f} s  closed form {row['closed_form_s']:.3f} s  "
              f"ratio {row['ratio_to_form']:.3f}  (goal ≤ {1 + BML_GOAL:.2f})  model {predicted} s  "
              f"slowest agent's GST {row['slowest_gst_s']:.3f} s  {row['servers']} servers  "
              f"CPU idle {row['cpu_idle']:.0%}")
    return {"bml": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bml", action="store_true", help="also BML's GST with and without a failed server")
    parser.add_argument("--bml-only", action="store_true", help="only BML's GST section")
    parser.add_argument("--bml-mbytes", type=float, default=12.5)
    parser.add_argument("--bml-rate", default="100Mbit")
    parser.add_argument("--bml-iterations", type=int, default=6)
    args = parser.parse_args()
    if args.bml or args.bml_only:
        print(json.dumps(bml_section(args.bml_iterations, 2, args.bml_mbytes, args.bml_rate)))
        if args.bml_only:
            return
    spec = lab_from_argument("fattree,4", name="ftbench", **{"servers.runtime": "netns"})
    with Lab.up(spec) as lab:
        injector = Injector(lab)
        src, dst = "p1e0h0", "p0e0h0"
        link = crossing_link(lab, src, dst)
        agg, core = link.split("-")
        (wire,) = lab.links_between(agg, core)
        end = wire.a if wire.a.node == agg else wire.b
        injections, undos, reroutes, baselines = [], [], [], []
        for _ in range(args.repeats):
            baselines.append(bare_link_set(lab, end.node, end.interface))
            lab.set_link(agg, core, True)  # the bare command left routes out: put them back
            time.sleep(0.2)
            done = injector.inject("link-down", link)
            injections.append(done.seconds)
            started = time.perf_counter()
            injector.undo(done.fault.id)
            undos.append(time.perf_counter() - started)
            time.sleep(0.2)
            reroute, _ = reroute_once(lab, injector, src, dst, link)
            reroutes.append(reroute)
            time.sleep(0.2)
        base = statistics.median(baselines)
        result = {
            "link": link, "pair": f"{src} → {dst}", "repeats": args.repeats,
            "baseline_ip_link_set_ms": round(base * 1000, 2),
            "inject_ms": round(statistics.median(injections) * 1000, 2),
            "undo_ms": round(statistics.median(undos) * 1000, 2),
            "reroute_ms": round(statistics.median(reroutes) * 1000, 2),
            "reroute_all_ms": [round(r * 1000, 1) for r in reroutes],
        }
        result["inject_ratio"] = round(result["inject_ms"] / result["baseline_ip_link_set_ms"], 2)
        result["reroute_ratio"] = round(result["reroute_ms"] / result["baseline_ip_link_set_ms"], 2)
    print(f"fattree,4 netns, cut {link} (path {src} → {dst}), median of {args.repeats}:")
    print(f"  bare `ip netns exec … ip link set down` (baseline) {result['baseline_ip_link_set_ms']:8.2f} ms")
    print(f"  inject link-down (both ends + reroute)             {result['inject_ms']:8.2f} ms"
          f"  ×{result['inject_ratio']} baseline   goal ≤ 50 ms")
    print(f"  undo (links up + routes restored)                  {result['undo_ms']:8.2f} ms")
    print(f"  reroute: fault asked → stream flows again          {result['reroute_ms']:8.2f} ms"
          f"  ×{result['reroute_ratio']} baseline   goal ≤ 100 ms   (all: {result['reroute_all_ms']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
