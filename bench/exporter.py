#!/usr/bin/env python3
"""The fabric exporter's cost on a large lab, and its Prometheus's memory over a run.

    sudo .venv/bin/python bench/exporter.py [--lab fattree,8] [--minutes 10] [--scrapes 30]

Brings the lab up in bare namespaces (fattree,8: 128 servers, 80 switches, 384 links) and
starts its Prometheus and fabric exporter as `testbed monitor up` does. Measured:
- a scrape: wall time of GET /metrics, median and max of `--scrapes` (goal ≤ 100 ms), beside
  two figures of the same run: the kernel floor (the netlink link and qdisc dumps of every
  namespace on open sockets, nothing parsed or built) and the library's rendering of the same
  collector (prometheus_client's generate_latest, which the exporter's own text replaces);
- the exporter's CPU while Prometheus scrapes it every second for the run (goal ≤ 5 % of a
  core), from its /proc/PID/stat;
- Prometheus's resident memory at the end of `--minutes` minutes (and every minute).
No agents run: the series are the fabric's (14 per link direction, plus per server).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.emulation import Lab, cleanup, kernel  # noqa: E402
from orchestrator.emulation.plan import namespace_name  # noqa: E402
from orchestrator.monitoring import monitor_down, monitor_up  # noqa: E402
from orchestrator.monitoring.exporter import FabricCollector, process_usage  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from orchestrator.spec import lab_from_argument  # noqa: E402

SCRAPE_GOAL_S = 0.100
CPU_GOAL = 0.05


def kernel_floor(lab: Lab, nl: kernel.Netlink) -> float:
    """The netlink dumps a scrape needs, alone: one link and one qdisc dump per namespace."""
    started = time.perf_counter()
    live = set(kernel.list_namespaces(namespace_name(lab.name, "")))
    for ns in lab.plan.namespaces.values():
        if ns in live:
            nl.dump(ns, kernel.GET_QDISCS, f"qdiscs of {ns}")
            nl.dump(ns, kernel.GET_LINKS, f"links of {ns}")
    return time.perf_counter() - started


def library_rendering(collector: FabricCollector) -> float:
    registry = CollectorRegistry()
    registry.register(collector)
    started = time.perf_counter()
    generate_latest(registry)
    return time.perf_counter() - started


def scrape(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read()
    return time.perf_counter() - started, body.count(b"\ntestbed_")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="fattree,8")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()

    spec = lab_from_argument(args.lab, name="benchexp", **{"servers.runtime": "netns"})
    print(f"bringing up {args.lab} ...", flush=True)
    lab = Lab.up(spec)
    try:
        monitor = monitor_up(lab)
        state = json.loads((lab.state.dir / "monitoring" / "prometheus.json").read_text())
        exporter = state["exporters"][0]
        exporter_pid, exporter_url = exporter["pid"], f"http://127.0.0.1:{exporter['port']}/metrics"
        for _ in range(100):  # the exporter may still be importing when Prometheus is ready
            try:
                scrape(exporter_url)  # and the first scrape opens the netlink socket
                break
            except OSError:
                time.sleep(0.2)
        # Prometheus scrapes every second meanwhile: these measure a scrape under that load
        timings, floors, library, series = [], [], [], 0
        nl, collector = kernel.Netlink(), FabricCollector(lab)
        kernel_floor(lab, nl)  # opens the sockets
        for _ in range(args.scrapes):
            took, series = scrape(exporter_url)
            timings.append(took)
            floors.append(kernel_floor(lab, nl))
            library.append(library_rendering(collector))
            time.sleep(0.3)
        nl.close()
        cpu0, wall0 = process_usage(exporter_pid)[0], time.monotonic()
        memory = []
        deadline = wall0 + args.minutes * 60
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(60.0, left))
            memory.append(round(process_usage(monitor.pid)[1] / 2**20, 1))
            print(f"  {(time.monotonic() - wall0) / 60:4.1f} min: prometheus {memory[-1]} MiB", flush=True)
        cpu_share = (process_usage(exporter_pid)[0] - cpu0) / (time.monotonic() - wall0)
        scrapes_seen = monitor.query('count_over_time(up{job="fabric"}[1h])')
        monitor_down(lab)
    finally:
        cleanup.clean_lab(lab.name)

    median, worst, floor = statistics.median(timings), max(timings), statistics.median(floors)
    generic = statistics.median(library)
    links = len(lab.topology.links)
    print(f"\n{args.lab}: {links} links, {series} testbed_ series per scrape")
    print(f"scrape       median {median * 1e3:6.1f} ms  max {worst * 1e3:6.1f} ms  (goal ≤ {SCRAPE_GOAL_S * 1e3:.0f} ms: "
          f"{median / SCRAPE_GOAL_S:.2f} of it)")
    print(f"kernel floor median {floor * 1e3:6.1f} ms  (the same dumps, nothing parsed): scrape/floor {median / floor:.2f}")
    print(f"library      median {generic * 1e3:6.1f} ms  (generate_latest of the same collector, in-process): "
          f"scrape/library {median / generic:.2f}")
    print(f"exporter CPU {cpu_share * 100:5.2f} % of a core at 1 s scrapes over {args.minutes:g} min "
          f"(goal ≤ {CPU_GOAL * 100:.0f} %)")
    print(f"prometheus   {memory[-1] if memory else float('nan')} MiB resident after {args.minutes:g} min "
          f"(per minute: {memory}); fabric scrapes {scrapes_seen[0]['value'][1] if scrapes_seen else '?'}")
    print(json.dumps({"lab": args.lab, "links": links, "scrape_median_s": round(median, 4),
                      "scrape_max_s": round(worst, 4), "floor_median_s": round(floor, 4), "library_median_s": round(generic, 4),
                      "exporter_cpu_share": round(cpu_share, 4), "prometheus_mib": memory}))
    return 0 if median <= SCRAPE_GOAL_S and cpu_share <= CPU_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
