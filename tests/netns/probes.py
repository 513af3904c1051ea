"""Measuring a live lab from inside its nodes: reachability, traceroute paths, throughput."""

from __future__ import annotations

import json
import os
import re
import time

from orchestrator.emulation import Lab, kernel


def command_lines(containing: str, live_only: bool = False) -> list[str]:
    """Command lines of host processes that contain `containing` (with `live_only`, zombies
    left out: a process this test started and killed stays one until it is reaped)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            if live_only and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        if containing in args:
            found.append(args)
    return found


def tx_bytes(lab: Lab, nodes: list[str]) -> dict[str, dict[str, int]]:
    """node → interface → bytes it has sent (loopback left out), read over netlink."""
    with kernel.Netlink() as nl:
        return {node: {name: info["tx_bytes"] for name, info in kernel.links_in(nl, lab.namespace(node)).items()
                       if name != "lo"} for node in nodes}


def unreachable_pairs(lab: Lab, sources: list[str] | None = None, via: str = "data") -> list[tuple[str, str]]:
    """Ordered server pairs (src, dst) whose ping fails; one fping per source, all at once."""
    servers = [s.name for s in lab.topology.servers]
    targets = {
        name: str(lab.topology.address_of(name)) if via == "data" else str(lab.mgmt_address(name))
        for name in servers
    }
    by_address = {address: name for name, address in targets.items()}
    sources = sources or servers
    failed = []
    for start in range(0, len(sources), 32):  # 32 fpings at a time, each to every server
        batch = sources[start : start + 32]
        # -a: print the alive; -r 2: retries, so one ARP race cannot fail a pair;
        # -i 1: 1 ms between targets (fping's default 10 ms makes big labs crawl)
        procs = {
            src: lab.popen(
                src, ["fping", "-a", "-r", "2", "-t", "300", "-i", "1", *(targets[d] for d in servers if d != src)],
                stdout=-1, stderr=-1, text=True,
            )
            for src in batch
        }
        for src, proc in procs.items():
            out, _ = proc.communicate(timeout=120)
            alive = {by_address[line.strip()] for line in out.splitlines() if line.strip() in by_address}
            failed += [(src, d) for d in servers if d != src and d not in alive]
    return failed


def traced_hops(lab: Lab, src: str, address: str) -> list[str]:
    """Node names that answer a TTL-limited probe towards `address`, in order (ICMP, so
    every probe of one trace is one flow and ECMP keeps it on one path)."""
    proc = lab.popen(src, ["traceroute", "-n", "-I", "-q", "1", "-w", "1", "-m", "12", address], stdout=-1, stderr=-1, text=True)
    out, _ = proc.communicate(timeout=60)
    hops = []
    for line in out.splitlines()[1:]:
        match = re.match(r"\s*\d+\s+(\d+\.\d+\.\d+\.\d+)", line)
        if not match:
            hops.append("*")
            continue
        owner = lab.topology.owner(match.group(1))
        hops.append(owner.node if owner else match.group(1))
    return hops


def l3_hops(layered_path: list[tuple[str, str]]) -> list[str]:
    """The nodes of a routed path that answer traceroute: those that routed (not bridged)."""
    return [name for name, layer in layered_path[1:] if layer == "l3"]


def iperf3_mbit(lab: Lab, client: str, server: str, seconds: int = 3, extra: list[str] | None = None) -> float:
    """TCP goodput client → server in Mbit/s, as iperf3's receiver reports it."""
    address = str(lab.topology.address_of(server))
    srv = lab.popen(server, ["iperf3", "-s", "-1"], stdout=-1, stderr=-1, text=True)
    time.sleep(0.3)
    try:
        proc = lab.popen(client, ["iperf3", "-c", address, "-t", str(seconds), "-J", *(extra or [])], stdout=-1, stderr=-1, text=True)
        out, err = proc.communicate(timeout=seconds + 30)
        report = json.loads(out)
        if "error" in report:
            raise AssertionError(f"iperf3: {report['error']}")
        return report["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.kill()
        srv.wait()


def runs_as_predicted(lab: Lab, algorithm: str, tensors: list[int], what: str, iterations: int = 6) -> float:
    """`algorithm` back to back on the lab's agents through the faithful Python API: the first
    iteration verified, the median time within [0.90, 1.10] of the prediction; the ratio.
    Out of the band, it runs once more and prints what the CPU did in each attempt (idle, and
    held by a hypervisor): a fresh virtual machine measured a relayed ring at 1.36 × its model
    in every iteration once, where this machine measures 1.01 run after run. A model or lab
    that is wrong is wrong in both attempts."""
    ratios = []
    for attempt in range(2):
        ratio, cpu = _ratio_as_predicted(lab, algorithm, tensors, what, iterations)
        ratios.append((ratio, cpu))
        if 0.90 <= ratio <= 1.10:
            return ratio
    raise AssertionError(f"{algorithm} on {what}: measured/predicted out of [0.90, 1.10] twice: "
                         + "; ".join(f"{ratio:.3f} ({cpu})" for ratio, cpu in ratios))


def _ratio_as_predicted(lab: Lab, algorithm: str, tensors: list[int], what: str, iterations: int) -> tuple[float, str]:
    import statistics

    from orchestrator.control import workloads
    from orchestrator.deploy import lab_agents
    from orchestrator.monitoring.exporter import host_cpu, idle_share, steal_share

    agents = lab_agents.start(lab, via="exec")
    try:
        before = host_cpu()
        result = agents.run(algorithm, tensors, workloads.back_to_back(tensors), iterations=iterations)
        after = host_cpu()
    finally:
        lab_agents.stop(agents)
    assert all(r["verified"] for r in result.records() if r["iteration"] == 0)
    times = result.back_to_back_times()
    seconds = statistics.median(times)  # one iteration the machine held up is not the model
    idle, stolen = idle_share(before, after), steal_share(before, after)
    cpu = f"CPU {idle:.0%} idle, {stolen or 0:.0%} held by the hypervisor" if idle is not None else "CPU not read"
    print(f"{algorithm} on {what}: {seconds:.3f} s per allreduce (each: {', '.join(f'{t:.3f}' for t in times)}), "
          f"predicted {result.predicted.per_run:.3f} s; {cpu}")
    return seconds / result.predicted.per_run, cpu
