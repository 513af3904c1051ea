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


def _timed(what: str, step: Callable[[], object]) -> None:
    started = time.monotonic()
    try:
        outcome = step()
    except Exception as exc:  # noqa: BLE001 - said, and left to the tier that needs it
        print(f"  {what}: not prepared ({type(exc).__name__}: {exc})", flush=True)
        return
    print(f"  {what}: {outcome or 'ready'} in {time.monotonic() - started:.0f} s", flush=True)


def _images() -> None:
    from orchestrator.emulation import docker_engine, images
    from tests.vm.test_vm_tier import docker_disk

    try:
        docker_engine.client(start=False)
    except Exception as exc:  # noqa: BLE001 - the docker tier says why too
        print(f"  lab images: not prepared ({exc})", flush=True)
        return
    _timed("lab images and PyTorch's", lambda: "built" if images.build_torch(lambda line: None) else "up to date")

    def disk() -> str:
        path, why = docker_disk()
        if path is None:
            raise RuntimeError(why)
        return str(path)
    _timed("the vm tier's copy of Docker's state", disk)


def _kernels() -> None:
    from tests.vm import qemu
    from tests.vm.test_vm_tier import RDMA_SUITE

    for suite in [None] + ([RDMA_SUITE] if RDMA_SUITE else []):
        _timed(f"vm kernel of {suite or 'this machine'}", lambda: qemu.prepare(suite=suite).package)


def main() -> None:
    steps = [threading.Thread(target=_images), threading.Thread(target=_kernels)]
    for step in steps:
        step.start()
    for step in steps:
        step.join()


if __name__ == "__main__":
    main()
