#!/usr/bin/env python3
"""A link between hosts against a link within one: goodput of one TCP stream (iperf3) over a
VXLAN wire between two fake hosts (namespaces on an underlay bridge, orchestrator/hosts) and
over a veth on one host, both shaped by the same HTB and queue, pair by pair in one run.

    sudo .venv/bin/python bench/multihost.py [--rates 100Mbit,1Gbit] [--pairs 3] [--seconds 5]

Prints each pair and the median ratio per rate, then one JSON line; exits 1 when a rate's
median ratio (wire / veth) is below 0.98 (issue 31's goal). Fake hosts share this machine's
cores: the ratio says what the encapsulation costs, not what a real NIC between machines does.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator import units  # noqa: E402
from orchestrator.emulation import kernel  # noqa: E402
from orchestrator.hosts.fake import fake_hosts  # noqa: E402

GOAL = 0.98
QUEUE = 1000


def goodput(client: str, server: str, address: str, seconds: float) -> float:
    """bits/s the receiver got from one iperf3 stream of `seconds` (after 1 s of slow start)."""
    daemon = subprocess.Popen(kernel.in_netns(server) + ["iperf3", "-s", "-1", "-B", address],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # wait for it to listen
            probe = subprocess.run(kernel.in_netns(server) + ["ss", "-Hltn", "sport = :5201"],
                                   capture_output=True, text=True)
            if probe.stdout.strip():
                break
            time.sleep(0.05)
        done = subprocess.run(kernel.in_netns(client) + ["iperf3", "-c", address, "-t", str(seconds), "-O", "1",
                                                         "-J"], capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]
    finally:
        daemon.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100Mbit,1Gbit")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    rates = [units.parse_rate(r) for r in args.rates.split(",")]
    prefix = f"tbm{uuid.uuid4().hex[:4]}"
    nodes = {name: f"{prefix}-{name}" for name in ("va", "vb", "wa", "wb")}
    rows, failed = [], False
    with fake_hosts(prefix, ["x", "y"]) as hosts:
        kernel.create_namespaces(list(nodes.values()))
        try:
            with kernel.Netlink() as nl:
                nl.open([*nodes.values(), *(hosts.namespace(h) for h in hosts.names)])
                kernel.add_veth(nl, nodes["va"], "eth0", nodes["vb"], "eth0", QUEUE, mtu=1500)  # same host
                kernel.add_vxlan(nl, hosts.namespace("x"), "eth0", 4096, hosts.address("x"), hosts.address("y"),
                                 nodes["wa"], QUEUE, 1500)
                kernel.add_vxlan(nl, hosts.namespace("y"), "eth0", 4096, hosts.address("y"), hosts.address("x"),
                                 nodes["wb"], QUEUE, 1500)
                for index, name in enumerate(("va", "vb", "wa", "wb")):
                    kernel.set_up(nl, nodes[name], "eth0")
                    kernel.set_up(nl, nodes[name], "lo")
                    kernel.add_address(nl, nodes[name], "eth0", ipaddress.IPv4Interface(f"10.98.0.{index % 2 + 1}/24"))
                for name in nodes.values():
                    kernel.shape(nl, name, "eth0", rates[0], QUEUE)
            for rate in rates:
                with kernel.Netlink() as nl:
                    for name in nodes.values():
                        kernel.set_rate(nl, name, "eth0", rate)
                ratios = []
                for pair in range(args.pairs):
                    veth = goodput(nodes["va"], nodes["vb"], "10.98.0.2", args.seconds)
                    wire = goodput(nodes["wa"], nodes["wb"], "10.98.0.2", args.seconds)
                    ratios.append(wire / veth)
                    print(f"{units.format_rate(rate):>8} pair {pair + 1}: veth {veth / 1e6:8.1f} Mbit/s   "
                          f"VXLAN wire {wire / 1e6:8.1f} Mbit/s   wire / veth {wire / veth:.3f}", flush=True)
                median = statistics.median(ratios)
                failed |= median < GOAL
                rows.append({"rate": units.format_rate(rate), "ratios": [round(r, 4) for r in ratios],
                             "median": round(median, 4)})
                print(f"{units.format_rate(rate):>8} median wire / veth {median:.3f} (goal ≥ {GOAL})", flush=True)
        finally:
            for space in nodes.values():
                kernel.delete_namespace(space)
    print(json.dumps({"bench": "multihost", "goal": GOAL, "rates": rows}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
