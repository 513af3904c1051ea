#!/usr/bin/env python3
"""The agents' data plane against iperf3 on the same shaped link, in the same run.

    sudo .venv/bin/python bench/agent_dataplane.py [--mbytes 100] [--iterations 5]

1. goodput: star,2 at 1 Gbit; iperf3 TCP h0 → h1, then the agents moving the same bytes
   (a 2-rank binomial tree: one transfer each way per iteration). Goal: agent ≥ 0.97 × iperf3.
2. busbw: ring allreduce on 8 servers of a star at 1 Gbit, NCCL-tests definition
   (busbw = S/t · 2(n−1)/n). Goal: ≥ 0.9 × link rate.
3. memory: agents' peak RSS beyond their gradient buffer. Goal: ≤ 80 MB.
Agents run in bare namespaces (netns runtime) from this venv. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.emulation import Lab  # noqa: E402
from orchestrator.runner import driver, lab_agents, workloads  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402
from tests.netns.probes import iperf3_mbit  # noqa: E402


def goodput(mbytes: int, iterations: int) -> dict:
    spec = lab_from_argument("star,2", name="bench-goodput", **{"servers.runtime": "netns", "links.bandwidth": "1Gbit"})
    with Lab.up(spec) as lab:
        iperf = statistics.median(iperf3_mbit(lab, "h0", "h1", seconds=5) for _ in range(3))
        endpoints = lab_agents.start(lab)
        try:
            elements = mbytes * 2**20 // 4
            result = driver.run(endpoints, "tree", [elements], workloads.emulated([elements]), iterations=iterations)
            # each iteration moves the buffer once each way, one transfer at a time
            rates = [2 * elements * 4 * 8 / gst / 1e6 for gst in result.gst()]
            agent = statistics.median(rates[1:] if len(rates) > 1 else rates)
            memory = max(r.peak_rss_mib - r.buffer_mib for r in result.results)
        finally:
            lab_agents.stop(endpoints)
    return {"iperf3_mbit": round(iperf, 1), "agent_mbit": round(agent, 1), "ratio": round(agent / iperf, 3),
            "goal": 0.97, "rss_beyond_buffer_mib": round(memory, 1)}


def ring_busbw(servers: int, mbytes: int, iterations: int) -> dict:
    spec = lab_from_argument(f"star,{servers}", name="bench-ring", **{"servers.runtime": "netns", "links.bandwidth": "1Gbit"})
    with Lab.up(spec) as lab:
        endpoints = lab_agents.start(lab)
        try:
            elements = mbytes * 2**20 // 4
            result = driver.run(endpoints, "ring", [elements], workloads.emulated([elements]), iterations=iterations)
            gst = statistics.median(result.gst()[1:] if iterations > 1 else result.gst())
            memory = max(r.peak_rss_mib - r.buffer_mib for r in result.results)
        finally:
            lab_agents.stop(endpoints)
    algbw = elements * 4 * 8 / gst
    busbw = algbw * 2 * (servers - 1) / servers
    return {"servers": servers, "mbytes": mbytes, "gst_s": round(gst, 3), "algbw_gbit": round(algbw / 1e9, 3),
            "busbw_gbit": round(busbw / 1e9, 3), "ratio_to_link": round(busbw / 1e9, 3), "goal": 0.9,
            "rss_beyond_buffer_mib": round(memory, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mbytes", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--servers", type=int, default=8)
    args = parser.parse_args()
    one = goodput(args.mbytes, args.iterations)
    ring = ring_busbw(args.servers, args.mbytes, args.iterations)
    print(f"goodput   iperf3 {one['iperf3_mbit']} Mbit/s, agent {one['agent_mbit']} Mbit/s: ratio {one['ratio']} (goal >= 0.97)")
    print(f"ring      {ring['servers']} servers, {ring['mbytes']} MB: busbw {ring['busbw_gbit']} Gbit/s on 1 Gbit links: "
          f"ratio {ring['ratio_to_link']} (goal >= 0.9)")
    print(f"memory    agent RSS beyond buffers: {max(one['rss_beyond_buffer_mib'], ring['rss_beyond_buffer_mib'])} MiB (goal <= 80)")
    print(json.dumps({"goodput": one, "ring": ring}))


if __name__ == "__main__":
    main()
