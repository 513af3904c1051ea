"""`testbed doctor`: one line per thing a lab needs, whether it is here, and what to do if not."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SETUP = "run ./setup.sh (it installs everything)"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # needed by the default lab (docker runtime, no netem, no rdma)


def run_checks() -> list[Check]:
    from orchestrator.emulation import docker_engine, features
    from orchestrator.spec.queues import KERNEL_OPTIONS

    checks: list[Check] = []
    root = features.is_root()
    checks.append(Check("root", root, "running as root" if root else "not root", "run as root (sudo)"))
    mnexec = shutil.which("mnexec")
    checks.append(Check("mnexec", bool(mnexec), mnexec or "missing", "apt-get install mininet, or " + SETUP))
    for tool in ("nsenter", "ip", "tc"):
        path = shutil.which(tool)
        checks.append(Check(tool, bool(path), path or "missing", SETUP))

    reachable = docker_engine.engine_reachable()
    if reachable:
        version = docker_engine.client().version().get("Version", "?")
        detail = f"engine {version} reachable"
    else:
        detail = "engine not reachable" + ("" if shutil.which("dockerd") else " (docker.io not installed)")
    checks.append(Check("docker", reachable, detail, "start it: dockerd & (./setup.sh does this idempotently)"))

    if root:
        found = features.kernel_features()
        release = platform.release()
        why = {
            "netem": "labs with delay, jitter or loss are refused; the vm test tier has it",
            "rdma_rxe": "labs with rdma: softroce are refused; the vm test tier has it",
            "rdma_rxe_netns": "labs with rdma: softroce are refused: they need an rdma_rxe that "
            "serves every network namespace (Debian 12's 6.1/6.12 serve only the initial one; "
            "trixie-backports' kernel does)",
            "openvswitch": "only needed for OVS switches",
            **{kind: f"only needed for links.discipline {kind} (a kernel built with {option})"
               for kind, option in KERNEL_OPTIONS.items()},
            "big_tcp": "optional (Linux 6.3+): labs' veths then carry 256 KiB IPv4 super-packets, "
            "which cuts the kernel's per-packet CPU",
        }
        for feature in (*features.KERNEL_FEATURES, "rdma_rxe_netns"):
            required = feature in ("veth", "bridge", "htb")
            ok = found[feature]
            detail = f"kernel {release}: " + ("available" if ok else "missing")
            fix = why.get(feature, "use a kernel with it (e.g. Debian's stock kernel)")
            checks.append(Check(feature, ok, detail, fix, required=required))
    else:
        checks.append(Check("kernel", False, "cannot probe kernel features without root", "run as root"))

    checks.append(_tcp_congestion())
    checks.append(_docker_firewall())
    for tool in ("prometheus", "promtool", "debootstrap"):
        path = shutil.which(tool)
        checks.append(Check(tool, bool(path), path or "missing", f"apt-get install {tool if tool != 'promtool' else 'prometheus'}, or {SETUP}"))
    has_runner = importlib.util.find_spec("ansible_runner") is not None
    checks.append(
        Check(
            "ansible",
            has_runner,
            "ansible-runner importable" if has_runner else "ansible-runner missing",
            "pip install ansible-runner ansible-core (the venv from ./setup.sh has them)",
        )
    )
    return checks


def _tcp_congestion() -> Check:
    """Labs pin their servers' congestion control (servers.tcp_congestion, default cubic)."""
    from orchestrator.emulation import features
    from orchestrator.spec.lab import ServersSpec

    default = ServersSpec().tcp_congestion
    available = features.available_tcp_congestion()
    host = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    return Check(
        "tcp congestion", default in available,
        f"labs use {default} (servers.tcp_congestion); host default {host}; available {' '.join(available)}",
        f"modprobe tcp_{default}, or set servers.tcp_congestion to one of those",
    )


def _docker_firewall() -> Check:
    """Docker's FORWARD DROP + br_netfilter silences root-namespace bridges. Ours are not there."""
    nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    bridged = nf.exists() and nf.read_text().strip() == "1"
    policy = "unknown"
    iptables = shutil.which("iptables")
    if iptables:
        result = subprocess.run([iptables, "-S", "FORWARD"], capture_output=True, text=True)
        if "-P FORWARD DROP" in result.stdout:
            policy = "DROP"
        elif "-P FORWARD ACCEPT" in result.stdout:
            policy = "ACCEPT"
    hazard = bridged and policy == "DROP"
    detail = (
        f"br_netfilter {'on' if bridged else 'off'}, FORWARD policy {policy}: "
        + ("root-namespace bridges would be silenced; " if hazard else "")
        + "handled: lab switches live in their own namespaces, the management bridge "
        "carries only host-to-server traffic (INPUT/OUTPUT, not FORWARD)"
    )
    return Check("docker-firewall", True, detail, required=False)


def healthy(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)
