"""What the test tiers build before they can run, built beside the unit tier.

`scripts/run-tests.sh` runs this in the background while the unit tier runs (neither times
anything) and waits for it before the tiers that do: the lab images, PyTorch's image on top
(the docker tier runs gloo in it), the vm tier's copy of Docker's state for its guest, and the
vm tier's kernels (downloaded and unpacked once per package). On a fresh machine these take
minutes of downloads, debootstrap and `docker build`. Whatever fails here is only said: the
tier that needs it builds it again, or skips, with its own reason.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


def _timed(what: str, step: Callable[[], object]) -> bool:
    """Run one step and say how it went; True when it did."""
    started = time.monotonic()
    try:
        outcome = step()
    except Exception as exc:  # noqa: BLE001 - said, and left to the tier that needs it
        print(f"  {what}: not prepared ({type(exc).__name__}: {exc})", flush=True)
        return False
    print(f"  {what}: {outcome or 'ready'} in {time.monotonic() - started:.0f} s", flush=True)
    return True


def _images() -> bool:
    """The lab images and PyTorch's; True when they are there (the engine is started as a
    lab's first use would; without one, _timed says why)."""
    from orchestrator.emulation import images

    return _timed("lab images and PyTorch's", lambda: "built" if images.build_torch(lambda line: None) else "up to date")


def _kernels() -> bool:
    """The vm tier's kernels; True when the one its Docker servers boot (the RDMA suite's) is ready."""
    from tests.vm import qemu
    from tests.vm.test_vm_tier import RDMA_SUITE

    _timed("vm kernel of this machine", lambda: qemu.prepare().package)
    return bool(RDMA_SUITE) and _timed(f"vm kernel of {RDMA_SUITE}", lambda: qemu.prepare(suite=RDMA_SUITE).package)


def _disk() -> None:
    """The copy of Docker's state the vm tier's RDMA guest boots with (GBs: only for a guest that boots)."""
    from tests.vm.test_vm_tier import docker_disk

    def disk() -> str:
        path, why = docker_disk()
        if path is None:
            raise RuntimeError(why)
        return str(path)
    _timed("the vm tier's copy of Docker's state", disk)


def main() -> None:
    ready: dict[str, bool] = {}
    steps = [threading.Thread(target=lambda: ready.update(images=_images())),
             threading.Thread(target=lambda: ready.update(kernels=_kernels()))]
    for step in steps:
        step.start()
    for step in steps:
        step.join()
    if ready.get("images") and ready.get("kernels"):
        _disk()


if __name__ == "__main__":
    main()
