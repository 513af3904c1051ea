#!/usr/bin/env python3
"""The agents' data plane against iperf3 on the same shaped link, in the same run.

    sudo .venv/bin/python bench/agent_dataplane.py [--mbytes 100] [--iterations 20]

1. goodput: star,2 at 1 Gbit; iperf3 TCP h0 → h1 while h1 → h0 (--bidir), then the agents
   moving the same bytes each way at once: a 2-rank ring, where each agent sends S (its
   half, then the other half reduced, chunk by chunk) while receiving as much; goodput per
   direction is S/GST. (A 2-rank tree no longer serves: its broadcast now overlaps its
   reduce, so "two transfers in turn" would be counted twice.) Goal: agent ≥ 0.97 × iperf3.
2. busbw: ring allreduce on 8 servers of a star at 1 Gbit, NCCL-tests' definition: busbw =
   S/t · 2(n−1)/n, t timed as NCCL-tests times it — a warm-up, then `--iterations`
   allreduces back to back, each agent's time over the loop divided by their number, the
   mean over agents (its default; the slowest agent's is shown too). Goal: ≥ 0.9 × link
   rate. At MTU 1500 headers take 4.4 % of an Ethernet link, so TCP's goodput cannot pass
   0.956 × link. Shown beside it, as a training run sees it: a gradient filled before
   every allreduce, t = GST (the slowest agent's time in the allreduce, including its wait
   for peers still filling: 8 agents filling 50 MB on 2 cores skew their entries).
   Baseline in the same run: 8 iperf3 flows in the ring's pattern (h_i → h_i+1) at once,
   with the CPU each takes. The ring is also run at `--slow-rate`, where the CPU is not the
   bound, to show the schedule's efficiency, each ring once more pipelined (ByteScheduler
   partitions, two in flight), and the 1 Gbit ring once more with jumbo frames.
3. memory: agents' peak RSS beyond their gradient buffer. Goal: ≤ 80 MB.
4. with --scaling: the same 1 Gbit ring on 2 and 4 servers as well, i.e. with more CPU per
   agent; shows how much of the 8-server figure the machine's core count takes.
5. with --algorithms mesh,ps,...: those algorithms on the same star at both rates, for their
   busbw (same formula) and memory (ps: shards colocated on the servers).
Every ring case runs once per agent transport (`--transports tcp,grpc`) on the same lab
against the same iperf3 baseline, and gives the agents' CPU per byte (busy core-seconds from
/proc/stat over the whole back-to-back run ÷ bytes the agents sent) against iperf3's (÷ bytes
delivered), and the same in steady state: CPU per GB the servers' fabric NICs received,
from 5 s after the traffic began to its end (SteadyState), for iperf3 (20 s, before the
agents and again after them: the mean of the two) and the agents alike. The goal (≤ 1.3 ×
at the slow rate) is read window by window (`--pairs`): iperf3's window and an agents'
window in turn, a few times, each pair's steady ratio, and their median. The machine's own
cost per byte moved by 0.56-0.82 core-s/GB within an hour, far more than the goal's margin,
while two windows side by side share what it was doing. With torch installed, PyTorch's
gloo allreduce runs on the same lab too (bench/gloo_allreduce.py) and each unpipelined ring
prints its ratio to gloo's busbw.
Agents run in bare namespaces (netns runtime) from this venv. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.collectives.context import Context  # noqa: E402
from orchestrator.emulation import Lab, kernel  # noqa: E402
from orchestrator.deploy import lab_agents  # noqa: E402
from orchestrator.control import driver, workloads  # noqa: E402
from orchestrator.monitoring.exporter import host_cpu  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402
from tests.netns.probes import iperf3_mbit  # noqa: E402


def goodput(mbytes: int, iterations: int, transport: str = "tcp") -> dict:
    spec = lab_from_argument("star,2", name="bench-goodput", **{"servers.runtime": "netns", "links.bandwidth": "1Gbit"})
    with Lab.up(spec) as lab:
        iperf = statistics.median(iperf3_mbit(lab, "h0", "h1", seconds=5, extra=["--bidir"]) for _ in range(3))
        endpoints = lab_agents.start(lab)
        try:
            elements = mbytes * 2**20 // 4
            result = driver.run(endpoints, "ring", [elements], workloads.emulated([elements]), iterations=iterations,
                                transport=transport)
            rates = [elements * 4 * 8 / gst / 1e6 for gst in result.gst()]  # each way, at once
            agent = statistics.median(rates[1:] or rates)
            memory = max(r.peak_rss_mib - r.buffer_mib for r in result.results)
        finally:
            lab_agents.stop(endpoints)
    return {"iperf3_mbit": round(iperf, 1), "agent_mbit": round(agent, 1), "ratio": round(agent / iperf, 3),
            "goal": 0.97, "rss_beyond_buffer_mib": round(memory, 1)}


def cpu_counters() -> tuple[float, float]:
    """(all, idle) CPU seconds of the host, as `testbed run`'s verdict reads them."""
    cpu = host_cpu()
    return cpu["idle"] + cpu["busy"], cpu["idle"]


def cpu_busy(before: tuple[float, float], after: tuple[float, float]) -> float:
    return round(1 - (after[1] - before[1]) / max(1e-9, after[0] - before[0]), 2)


# Steady state: CPU and the bytes the servers' fabric NICs received, sampled this often by a
# thread of the bench, from this long after the traffic began to the last sample that
# still carried it. Whole-window figures carried what a run starts and ends with (iperf3's
# eight process starts in a 5 s window: its core-s/GB read 0.52 to 0.84 on one machine in
# one afternoon; the agents' configure and warm-up), which is neither kernel's nor agents'
# cost per byte.
SAMPLE_S = 0.25
SETTLE_S = 5.0


class SteadyState:
    """Samples /proc/stat and the servers' fabric NIC receive counters (read over netlink
    in each server's namespace, as `testbed status` reads them: nothing is started while it
    samples) until stopped; then `figures()`: busy core-seconds per GB received on the wire
    (headers in: the same count for the agents and for iperf3) over the steady part, and
    that part's length."""

    def __init__(self, lab) -> None:
        self.nics = {lab.namespace(s.name): s.data_nics()[0].name for s in lab.topology.servers}
        self.samples: list[tuple[float, float, float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with kernel.Netlink() as nl:  # a Netlink is used by the thread that made it
            nl.open(self.nics)
            while not self.done.is_set():
                all_seconds, idle = cpu_counters()
                received = sum(kernel.links_in(nl, ns)[nic]["rx_bytes"] for ns, nic in self.nics.items())
                self.samples.append((time.monotonic(), all_seconds - idle, all_seconds, received))
                self.done.wait(SAMPLE_S)

    def __enter__(self) -> "SteadyState":
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.done.set()
        self.thread.join()

    def figures(self, link_bps: float) -> dict:
        moving = [i for i in range(1, len(self.samples))
                  if (self.samples[i][3] - self.samples[i - 1][3]) * 8 / (self.samples[i][0] - self.samples[i - 1][0])
                  > 0.5 * link_bps * len(self.nics)]
        if not moving:
            return {}
        began = self.samples[moving[0] - 1][0]
        first = next((i for i in moving if self.samples[i][0] >= began + SETTLE_S), None)
        last = moving[-1]
        if first is None or last - first < 4:
            return {}
        (t0, busy0, all0, rx0), (t1, busy1, all1, rx1) = self.samples[first], self.samples[last]
        core_s = busy1 - busy0
        return {"steady_cpu_s_per_gb": round(core_s / ((rx1 - rx0) / 1e9), 3), "steady_seconds": round(t1 - t0, 1),
                "steady_cpu_busy": round((busy1 - busy0) / max(1e-9, all1 - all0), 3)}


def iperf3_ring(lab, servers: int, seconds: int = 20) -> dict:
    """Every server sends to the next at once, as a ring step does: Mbit/s per flow, and
    the CPU (core-seconds) per GB delivered: over the whole window (process starts
    included) and in steady state (SteadyState)."""
    names = [s.name for s in lab.topology.servers]
    listeners = [lab.popen(n, ["iperf3", "-s", "-1"], stdout=-1, stderr=-1) for n in names]
    time.sleep(0.5)
    steady = SteadyState(lab)
    with steady:
        before = cpu_counters()
        clients = [
            lab.popen(n, ["iperf3", "-c", str(lab.topology.address_of(names[(i + 1) % servers])), "-t", str(seconds),
                          "-J"], stdout=-1, stderr=-1, text=True)
            for i, n in enumerate(names)
        ]
        reports = [json.loads(c.communicate()[0])["end"]["sum_received"] for c in clients]
        after = cpu_counters()
    busy = cpu_busy(before, after)
    for listener in listeners:
        listener.wait()
    rates = [r["bits_per_second"] / 1e6 for r in reports]
    delivered = sum(r["bytes"] for r in reports)
    return {"mbit_per_flow": round(statistics.median(rates), 1), "cpu_busy": busy,
            "cpu_s_per_gb": round(core_seconds(before, after) / (delivered / 1e9), 3),
            **steady.figures(lab.spec.links.bandwidth)}


def core_seconds(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Busy core-seconds between two readings of `cpu_counters`."""
    return (after[0] - before[0]) - (after[1] - before[1])


def ring_busbw(servers: int, mbytes: int, iterations: int, rate: str, partition_mbytes: int = 0,
               algorithm: str = "ring", mtu: int = 1500, transports: tuple[str, ...] = ("tcp",),
               pairs: int = 0) -> list[dict]:
    """The ring's (or `algorithm`'s) busbw; with `partition_mbytes`, pipelined: ByteScheduler
    partitions of that size, two in flight (credit window), so one partition's steps overlap
    the next's.

    busbw as NCCL-tests measures it: after a warm-up, `iterations` allreduces back to back
    (nothing in between), each agent's time over them divided by their number, the mean over
    agents (NCCL-tests' default; the max is shown too). And as a training run sees it: an
    emulated gradient filled before every iteration, t = GST (the slowest agent's time in
    the allreduce, waiting for peers still filling included; median over iterations after
    the first). One result per transport, on the same lab, against the same iperf3 baseline;
    with `pairs`, each also against iperf3 window by window (`paired_cpu`)."""
    spec = lab_from_argument(f"star,{servers}", name="bench-ring",
                             **{"servers.runtime": "netns", "links.bandwidth": rate, "links.mtu": mtu})
    with Lab.up(spec) as lab:
        first = iperf3_ring(lab, servers)
        gloo = gloo_ring(lab, servers, mbytes, iterations) if algorithm == "ring" and not partition_mbytes else None
        endpoints = lab_agents.start(lab)
        try:
            rings = [_ring_over(endpoints, lab, transport, servers, mbytes, iterations, rate, partition_mbytes,
                                algorithm, mtu) for transport in transports]
            for ring in rings if pairs else ():
                ring.update(paired_cpu(lab, endpoints, ring, pairs))
        finally:
            lab_agents.stop(endpoints)
        again = iperf3_ring(lab, servers)  # (_baseline says why)
    baseline = _baseline(first, again)
    for ring in rings:
        _against(ring, baseline)
    for ring in rings:
        if gloo:
            ring["gloo_ratio_to_link"] = gloo["ratio_to_link"]
            ring["ratio_to_gloo"] = round(ring["ratio_to_link"] / gloo["ratio_to_link"], 3)
    return rings


PAIRED_WINDOW_S = 20.0  # each agents' window's traffic, at least: SETTLE_S and 15 s of steady state


def paired_cpu(lab, endpoints, ring: dict, pairs: int) -> dict:
    """The agents' steady CPU per wire GB over iperf3's, window by window: `pairs` times,
    iperf3's ring pattern (`iperf3_ring`), then the agents' `ring` case again, back to back,
    for about PAIRED_WINDOW_S (its iterations from the time `ring` measured); each pair's
    ratio, and their median. The agents stay up, idle, while iperf3 runs, as they do between
    a run's iterations."""
    servers, elements = ring["servers"], ring["mbytes"] * 2**20 // 4
    ctx, pipelining = _run_options(servers, ring["algorithm"], ring["partition_mbytes"])
    iterations = max(2, math.ceil(PAIRED_WINDOW_S / max(ring["time_s"], 1e-3)))
    ratios = []
    for _ in range(pairs):
        kernel_cost = iperf3_ring(lab, servers).get("steady_cpu_s_per_gb")
        steady = SteadyState(lab)
        with steady:
            driver.run(endpoints, ring["algorithm"], [elements], workloads.back_to_back([elements]),
                       iterations=iterations + 1, ctx=ctx, transport=ring["transport"], **pipelining)
        agents_cost = steady.figures(lab.spec.links.bandwidth).get("steady_cpu_s_per_gb")
        if kernel_cost and agents_cost:
            ratios.append(round(agents_cost / kernel_cost, 3))
    return {"paired_ratios": ratios,
            "paired_cpu_per_byte_to_iperf3": round(statistics.median(ratios), 2) if ratios else None}


def gloo_ring(lab, servers: int, mbytes: int, iterations: int) -> dict | None:
    """PyTorch's gloo allreduce on the same lab, one process per server bound to its fabric
    NIC (bench/gloo_allreduce.py): NCCL-tests' busbw of the mean time per operation. None
    (and a line saying so) when torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("gloo      skipped: torch is not installed in this venv (pip install torch, CPU build)", flush=True)
        return None
    names = [s.name for s in lab.topology.servers]
    master = str(lab.topology.address_of(names[0]))
    elements = mbytes * 2**20 // 4
    script = str(Path(__file__).resolve().parent / "gloo_allreduce.py")
    procs = [lab.popen(n, ["env", f"GLOO_SOCKET_IFNAME={lab.topology.nodes[n].data_nics()[0].name}", sys.executable,
                           script, str(i), str(servers), master, str(elements), str(iterations)],
                       stdout=-1, stderr=-1, text=True) for i, n in enumerate(names)]
    times = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1])["seconds_per_op"] for p in procs]
    mean = statistics.fmean(times)
    busbw = elements * 4 * 8 / mean * 2 * (servers - 1) / servers
    return {"time_s": round(mean, 4), "ratio_to_link": round(busbw / lab.spec.links.bandwidth, 3)}


def _baseline(first: dict, again: dict) -> dict:
    """iperf3's figures as the mean of its two windows, before the agents' rings and after
    them (each kept, `windows`): one 15 s window before read 0.292 and 0.382 core-s per GB
    on the same machine an hour apart while the agents' own figure held (0.500, 0.495), and
    a window on one side of the agents' minutes also carried whatever the machine did then."""
    both = (first, again)

    def mean(key: str) -> float | None:
        values = [w[key] for w in both if w.get(key) is not None]
        return round(statistics.fmean(values), 3) if len(values) == len(both) else None

    return {"mbit_per_flow": mean("mbit_per_flow"), "cpu_busy": mean("cpu_busy"), "cpu_s_per_gb": mean("cpu_s_per_gb"),
            "steady_cpu_s_per_gb": mean("steady_cpu_s_per_gb"), "steady_seconds": mean("steady_seconds"),
            "windows": [{k: w.get(k) for k in ("cpu_s_per_gb", "steady_cpu_s_per_gb", "steady_seconds")} for w in both]}


def _against(ring: dict, baseline: dict) -> None:
    """The agents' figures over iperf3's (`_baseline`), into `ring`."""
    agents = ring["agents_steady_cpu_s_per_gb"]
    ring.update({
        "cpu_per_byte_to_iperf3": round(ring["agents_cpu_s_per_gb"] / baseline["cpu_s_per_gb"], 2),
        "iperf3_steady_cpu_s_per_gb": baseline["steady_cpu_s_per_gb"],
        "iperf3_steady_seconds": baseline["steady_seconds"], "iperf3_windows": baseline["windows"],
        "steady_cpu_per_byte_to_iperf3": round(agents / baseline["steady_cpu_s_per_gb"], 2)
        if agents and baseline["steady_cpu_s_per_gb"] else None,
        "iperf3_ring_mbit_per_flow": baseline["mbit_per_flow"], "iperf3_ring_cpu_busy": baseline["cpu_busy"],
        "ratio_to_iperf3_ring": round(ring["busbw_mbit"] / baseline["mbit_per_flow"], 3)})


def _run_options(servers: int, algorithm: str, partition_mbytes: int) -> tuple[Context | None, dict]:
    """driver.run's context and pipelining for a case: a PS's shards on the servers; with
    `partition_mbytes`, ByteScheduler partitions of that size, two in flight."""
    pipelining = {"partition_bytes": partition_mbytes * 2**20, "credit_bytes": 2 * partition_mbytes * 2**20} \
        if partition_mbytes else {}
    return (Context(servers, options={"colocated": True}) if algorithm == "ps" else None), pipelining


def _ring_over(endpoints, lab, transport: str, servers: int, mbytes: int, iterations: int, rate: str,
               partition_mbytes: int, algorithm: str, mtu: int) -> dict:
    elements = mbytes * 2**20 // 4
    ctx, pipelining = _run_options(servers, algorithm, partition_mbytes)
    steady = SteadyState(lab)
    with steady:
        before = cpu_counters()
        loop = driver.run(endpoints, algorithm, [elements], workloads.back_to_back([elements]),
                          iterations=iterations + 1, ctx=ctx, transport=transport, **pipelining)
        after = cpu_counters()
    state = steady.figures(lab.spec.links.bandwidth)
    busy = cpu_busy(before, after)
    sent = sum(r.bytes_sent for result in loop.results for r in result.records)
    training = driver.run(endpoints, algorithm, [elements], workloads.emulated([elements]),
                          iterations=iterations, ctx=ctx, transport=transport, **pipelining)
    per_op = loop.back_to_back_times()
    # iteration 1 opens the connections: the median of the rest
    gst = statistics.median(training.gst()[1:] or training.gst())
    memory = max(r.peak_rss_mib - r.buffer_mib for r in loop.results + training.results)
    link = lab.spec.links.bandwidth
    factor = 2 * (servers - 1) / servers  # NCCL-tests' allreduce bus factor

    def busbw(seconds: float) -> float:
        return elements * 4 * 8 / seconds * factor

    mean = statistics.fmean(per_op)
    cpu_per_gb = core_seconds(before, after) / (sent / 1e9)  # the whole run, configure and warm-up included
    return {"algorithm": algorithm, "transport": transport, "servers": servers, "mbytes": mbytes, "link": rate,
            "mtu": mtu, "partition_mbytes": partition_mbytes, "iterations": iterations,
            "time_s": round(mean, 4), "busbw_gbit": round(busbw(mean) / 1e9, 3), "busbw_mbit": round(busbw(mean) / 1e6, 2),
            "ratio_to_link": round(busbw(mean) / link, 3), "ratio_to_link_slowest_agent": round(busbw(max(per_op)) / link, 3),
            "training_gst_s": round(gst, 3), "training_ratio_to_link": round(busbw(gst) / link, 3),
            "goal": 0.9, "agents_cpu_busy": busy, "agents_cpu_s_per_gb": round(cpu_per_gb, 3),
            "agents_steady_cpu_s_per_gb": state.get("steady_cpu_s_per_gb"),
            "agents_steady_seconds": state.get("steady_seconds"),
            "rss_beyond_buffer_mib": round(memory, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mbytes", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed iterations per case (NCCL-tests' default: 20), after one warm-up")
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--slow-rate", default="200Mbit", help="a link rate where CPU is not the bound")
    parser.add_argument("--scaling", action="store_true", help="also run the 1 Gbit ring on 2 and 4 servers")
    parser.add_argument("--partition-mbytes", type=int, default=8, help="partition size of the pipelined ring")
    parser.add_argument("--algorithms", default="", help="comma-separated others to run too, e.g. mesh,ps")
    parser.add_argument("--jumbo-mtu", type=int, default=9000, help="MTU of one more 1 Gbit ring run (0: none)")
    parser.add_argument("--transports", default="tcp,grpc",
                        help="comma-separated agent transports, each on the same labs (the first is the goal's)")
    parser.add_argument("--no-goodput", action="store_true", help="skip the 2-server goodput case")
    parser.add_argument("--pairs", type=int, default=3,
                        help="iperf3 and agents' windows in turn at the slow rate, for the CPU goal (0: none)")
    args = parser.parse_args()
    chosen = tuple(filter(None, args.transports.split(",")))
    one = None if args.no_goodput else goodput(args.mbytes, args.iterations, chosen[0])
    rings = [r for partition in (0, args.partition_mbytes) for rate in ("1Gbit", args.slow_rate)
             for r in ring_busbw(args.servers, args.mbytes, args.iterations, rate, partition, transports=chosen,
                                 pairs=args.pairs if rate == args.slow_rate else 0)]
    if args.jumbo_mtu:
        rings += ring_busbw(args.servers, args.mbytes, args.iterations, "1Gbit", mtu=args.jumbo_mtu, transports=chosen)
    if one:
        print(f"goodput   {chosen[0]}: iperf3 {one['iperf3_mbit']} Mbit/s, agent {one['agent_mbit']} Mbit/s: "
              f"ratio {one['ratio']} (goal >= 0.97)")
    for ring in rings:
        kind = f"pipelined, {ring['partition_mbytes']} MiB partitions" if ring["partition_mbytes"] else "one partition"
        print(f"ring      {ring['transport']:<4} {ring['servers']} servers, {ring['mbytes']} MB, {ring['link']} links, "
              f"MTU {ring['mtu']}, {kind}: busbw {ring['busbw_gbit']} Gbit/s, ratio to link {ring['ratio_to_link']} "
              f"({ring['ratio_to_link_slowest_agent']} by the slowest agent); training run {ring['training_ratio_to_link']} "
              f"by GST; agents at {ring['agents_cpu_busy']:.0%} CPU, {ring['agents_cpu_s_per_gb']} core-s/GB = "
              f"{ring['cpu_per_byte_to_iperf3']} x iperf3's ({ring['iperf3_ring_mbit_per_flow']} Mbit/s per flow at "
              f"{ring['iperf3_ring_cpu_busy']:.0%} CPU); in steady state {ring['agents_steady_cpu_s_per_gb']} "
              f"core-s per wire GB over {ring['agents_steady_seconds']} s = {ring['steady_cpu_per_byte_to_iperf3']} x "
              f"iperf3's {ring['iperf3_steady_cpu_s_per_gb']} (the mean of "
              f"{' and '.join(str(w['steady_cpu_s_per_gb']) for w in ring['iperf3_windows'])}, before and after, "
              f"{ring['iperf3_steady_seconds']} s each)"
              + (f"; paired, window by window: {ring['paired_cpu_per_byte_to_iperf3']} x iperf3's (the median of "
                 f"{', '.join(map(str, ring['paired_ratios']))}) (goal <= 1.3)" if ring.get("paired_ratios") else "")
              + f"; RSS beyond buffer {ring['rss_beyond_buffer_mib']} MiB"
              + (f"; gloo {ring['gloo_ratio_to_link']} of the link, ours / gloo {ring['ratio_to_gloo']}"
                 if "ratio_to_gloo" in ring else ""))
    smaller = [n for n in (2, 4) if n < args.servers] if args.scaling else []
    scaling = [r for n in smaller for r in ring_busbw(n, args.mbytes, args.iterations, "1Gbit", transports=chosen)]
    for ring in scaling:
        print(f"scaling   {ring['transport']:<4} {ring['servers']} servers at 1Gbit: busbw ratio to link "
              f"{ring['ratio_to_link']} ({ring['training_ratio_to_link']} training run), "
              f"agents at {ring['agents_cpu_busy']:.0%} CPU")
    others = [r for name in filter(None, args.algorithms.split(",")) for rate in ("1Gbit", args.slow_rate)
              for r in ring_busbw(args.servers, args.mbytes, args.iterations, rate, algorithm=name, transports=chosen)]
    for other in others:
        print(f"{other['algorithm']:<9} {other['transport']:<4} {other['servers']} servers, {other['link']} links: busbw "
              f"ratio to link {other['ratio_to_link']} ({other['training_ratio_to_link']} training run), agents at "
              f"{other['agents_cpu_busy']:.0%} CPU, RSS beyond buffer {other['rss_beyond_buffer_mib']} MiB")
    memory = max(([one["rss_beyond_buffer_mib"]] if one else []) + [r["rss_beyond_buffer_mib"] for r in rings + scaling + others])
    print(f"memory    agent RSS beyond buffers: {memory} MiB (goal <= 80 MB = 76.3 MiB)")
    print(json.dumps({"goodput": one, "ring": rings, "scaling": scaling, "others": others}))


if __name__ == "__main__":
    main()
