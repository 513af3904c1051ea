"""What this kernel and machine can do, found by trying it, not by reading config files.

Each kernel probe builds the object for real in a throwaway namespace (a veth, a bridge, an
HTB or netem qdisc) and removes it: a module that would auto-load does, a feature compiled
out fails the way a lab would. `require(spec)` turns a lab's needs into one refusal line
before anything is built.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path

from orchestrator.emulation import kernel, queues
from orchestrator.errors import EmulationError, HostError, MissingFeature
from orchestrator.spec.queues import KERNEL_OPTIONS, Codel, Red

_PROBE_QUEUES = {"red": Red(kind="red", min=2, max=4), "codel": Codel(kind="codel"),
                 "fq_codel": Codel(kind="fq_codel")}

KERNEL_FEATURES = ("veth", "bridge", "htb", "netem", "red", "codel", "fq_codel", "big_tcp", "rdma_rxe",
                   "openvswitch")
# a probe's namespace is named after its process, so `testbed clean` can tell a leftover of a
# killed probe from one still running
PROBE_PREFIX = "tb-probe-"


@functools.cache
def kernel_features() -> dict[str, bool]:
    """{feature: available} for every entry of KERNEL_FEATURES, and rdma_rxe_netns: whether
    soft-RoCE carries traffic from inside a network namespace (needs root)."""
    found = dict.fromkeys(KERNEL_FEATURES, False)
    found["rdma_rxe"] = _module("rdma_rxe")
    found["openvswitch"] = _module("openvswitch")
    probe = f"{PROBE_PREFIX}{os.getpid()}"
    kernel.create_namespaces([probe])
    try:
        with kernel.Netlink() as nl:
            found["veth"] = _try(lambda: kernel.add_veth(nl, probe, "p0", probe, "p1", 10))
            found["bridge"] = _try(lambda: kernel.add_bridge(nl, probe, "pbr"))
            found["big_tcp"] = _big_tcp(nl, probe)
            if found["veth"]:
                found["htb"] = _try(lambda: kernel.shape(nl, probe, "p0", 10**8, 10))
                found["netem"] = _try(lambda: kernel.shape(nl, probe, "p1", 10**8, 10, delay_s=0.001))
            if found["htb"]:
                for kind, probe_queue in _PROBE_QUEUES.items():  # each in turn under p0's HTB class
                    leaf = functools.partial(queues.leaf_message, discipline=probe_queue, packets=10, mtu=1500,
                                             rate_bps=10**8)
                    found[kind] = _try(lambda: kernel.set_leaf(nl, probe, "p0", 10, leaf=leaf))
        found["rdma_rxe_netns"] = found["rdma_rxe"] and found["veth"] and _rxe_serves_namespace(probe, "p0")
    finally:
        kernel.delete_namespace(probe)
    return found


ROCE_V2_PORT = 4791


def _rxe_serves_namespace(ns: str, netdev: str) -> bool:
    """Does rdma_rxe listen for RoCE v2 (UDP 4791) inside a network namespace?

    Before per-namespace soft-RoCE (Linux 6.1 and 6.12, Debian 12's kernels) rxe has one
    socket and one routing table, the initial namespace's: a device on a namespaced netdev
    still comes up ACTIVE, but no RoCE packet can reach or leave it. Newer kernels open the
    socket in the netdev's namespace when the first device there is added.
    """
    if shutil.which("rdma") is None:
        return False
    enter = [*kernel.in_netns(ns), "rdma", "link"]
    device = f"tbprobe{os.getpid()}"
    if subprocess.run([*enter, "add", device, "type", "rxe", "netdev", netdev], capture_output=True).returncode:
        return False
    try:
        udp = kernel.in_namespaces([ns], lambda _: Path("/proc/thread-self/net/udp").read_text())[ns]
    finally:
        subprocess.run([*enter, "delete", device], capture_output=True)
    local = (line.split()[1] for line in udp.splitlines()[1:] if line.strip())
    return any(address.endswith(f":{ROCE_V2_PORT:04X}") for address in local)


def _big_tcp(nl: kernel.Netlink, ns: str) -> bool:
    """Do veths take IPv4 super-packets of BIG_GSO_BYTES (Linux 6.3)? An older kernel
    ignores the attribute, or refuses the size."""
    if not _try(lambda: kernel.add_veth(nl, ns, "g0", ns, "g1", 10, gso_bytes=kernel.BIG_GSO_BYTES)):
        return False
    ends = kernel.links_in(nl, ns)
    return ends["g0"]["gso_ipv4_bytes"] == ends["g1"]["gso_ipv4_bytes"] == kernel.BIG_GSO_BYTES


def _try(action) -> bool:
    try:
        action()
        return True
    except EmulationError:
        return False


def _module(name: str) -> bool:
    """Loaded, built in, or loadable now (modprobe asks the kernel; absent modules fail)."""
    if Path(f"/sys/module/{name}").exists():
        return True
    modprobe = shutil.which("modprobe")
    if modprobe:
        subprocess.run([modprobe, "-q", name], capture_output=True, check=False)
    return Path(f"/sys/module/{name}").exists()


def available_tcp_congestion() -> list[str]:
    return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()


def tcp_congestion_available(name: str) -> bool:
    """Registered with the kernel: built in, or its module tcp_<name> loaded (here, if the
    kernel has it: a route naming it would load it too)."""
    return name in available_tcp_congestion() or (_module(f"tcp_{name}") and name in available_tcp_congestion())


def is_root() -> bool:
    return os.geteuid() == 0


def require(spec) -> None:
    """Refuse, with one line, a lab this machine cannot build. Builds nothing."""
    if not is_root():
        raise HostError("testbed needs root to build labs: run it with sudo or as root")
    features = kernel_features()
    release = platform.release()
    for basic in ("veth", "bridge", "htb"):
        if not features[basic]:
            raise MissingFeature(f"this kernel ({release}) cannot create {basic}: testbed needs it for every lab")
    if spec.needs_netem and not features["netem"]:
        asked = ", ".join(
            f"{key}={value}"
            for key, value in spec.links.model_dump(mode="json").items()
            if key in ("delay", "jitter", "loss") and value not in ("0ms", 0, 0.0)
        ) or "with delays of their own"
        raise MissingFeature(
            f"lab {spec.name} asks for links {asked}, which needs sch_netem; this kernel "
            f"({release}) lacks it: set delay, jitter and loss to 0, or run on a kernel with "
            "sch_netem (the vm test tier and the Vagrantfile have one)"
        )
    discipline = spec.links.discipline.kind
    if discipline != "fifo" and not features[discipline]:
        raise MissingFeature(
            f"links.discipline: {discipline} needs the {discipline} qdisc, which this kernel ({release}) lacks "
            f"({KERNEL_OPTIONS[discipline]}): use discipline fifo, or run on a kernel built with it (Debian's "
            "stock kernels are; the vm test tier boots one)"
        )
    congestion = spec.servers.tcp_congestion
    if not tcp_congestion_available(congestion):
        raise MissingFeature(
            f"servers.tcp_congestion: {congestion!r} is not available in this kernel ({release}; "
            f"it has {' '.join(available_tcp_congestion())}): choose one of those, load its "
            f"module (modprobe tcp_{congestion}), or run on a kernel built with "
            f"CONFIG_TCP_CONG_{congestion.upper()} (Debian's stock kernels have dctcp; the vm test tier boots one)"
        )
    if spec.rdma == "softroce" and not features["rdma_rxe"]:
        raise MissingFeature(
            f"lab {spec.name} asks for rdma: softroce, which needs the rdma_rxe module; this "
            f"kernel ({release}) lacks it: set rdma: none, or run on a kernel whose rdma_rxe "
            "serves network namespaces (e.g. Debian trixie-backports' linux-image-amd64; the vm "
            "test tier boots one)"
        )
    if spec.rdma == "softroce" and not features["rdma_rxe_netns"]:
        raise MissingFeature(
            f"lab {spec.name} asks for rdma: softroce, but this kernel's rdma_rxe ({release}) "
            "serves only the initial network namespace and every lab server has its own, so no "
            "RoCE packet could pass between servers: set rdma: none, or run on a kernel with "
            "per-namespace rdma_rxe (e.g. Debian trixie-backports' linux-image-amd64; the vm "
            "test tier boots one)"
        )
