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

from orchestrator.emulation import kernel
from orchestrator.errors import EmulationError, HostError, MissingFeature

KERNEL_FEATURES = ("veth", "bridge", "htb", "netem", "rdma_rxe", "openvswitch")


@functools.cache
def kernel_features() -> dict[str, bool]:
    """{feature: available} for every entry of KERNEL_FEATURES (needs root)."""
    found = dict.fromkeys(KERNEL_FEATURES, False)
    probe = f"tb-probe-{os.getpid()}"
    kernel.create_namespaces([probe])
    try:
        with kernel.Netlink() as nl:
            found["veth"] = _try(lambda: kernel.add_veth(nl, probe, "p0", probe, "p1", 10))
            found["bridge"] = _try(lambda: kernel.add_bridge(nl, probe, "pbr"))
            if found["veth"]:
                found["htb"] = _try(lambda: kernel.shape(nl, probe, "p0", 10**8, 10))
                found["netem"] = _try(lambda: kernel.shape(nl, probe, "p1", 10**8, 10, delay_s=0.001))
    finally:
        kernel.delete_namespace(probe)
    found["rdma_rxe"] = _module("rdma_rxe")
    found["openvswitch"] = _module("openvswitch")
    return found


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
    if spec.links.needs_netem and not features["netem"]:
        asked = ", ".join(
            f"{key}={value}"
            for key, value in spec.links.model_dump(mode="json").items()
            if key in ("delay", "jitter", "loss") and value not in ("0ms", 0, 0.0)
        )
        raise MissingFeature(
            f"lab {spec.name} asks for links {asked}, which needs sch_netem; this kernel "
            f"({release}) lacks it: set delay, jitter and loss to 0, or run on a kernel with "
            "sch_netem (the vm test tier and the Vagrantfile have one)"
        )
    if spec.rdma == "softroce" and not features["rdma_rxe"]:
        raise MissingFeature(
            f"lab {spec.name} asks for rdma: softroce, which needs the rdma_rxe module; this "
            f"kernel ({release}) lacks it: set rdma: none, or run on a kernel with rdma_rxe "
            "(the vm test tier and the Vagrantfile have one)"
        )
