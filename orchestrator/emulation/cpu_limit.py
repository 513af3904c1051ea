"""A CPU quota on a netns server's processes (the `server-slow` fault): a cgroup of their
own with the kernel's CFS bandwidth limit, in whichever hierarchy holds the cpu controller
(cgroup v2's cpu.max; v1's cpu.cfs_quota_us, as on hosts still mounting the hybrid layout).

The group is named after the lab and the fault (`testbed-<lab id>-<fault id>`), so lab
cleanup finds what a fault left behind. Undo moves the processes back to the groups they
came from and removes the group.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import EmulationError, MissingFeature

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
PREFIX = "testbed-"


def hierarchy() -> tuple[Path, int]:
    """(mount point of the hierarchy with the cpu controller, its cgroup version)."""
    controllers = ROOT / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return ROOT, 2
    for name in ("cpu", "cpu,cpuacct"):
        path = ROOT / name
        if (path / "cpu.cfs_quota_us").is_file():
            return path, 1
    raise MissingFeature("server-slow needs the cpu cgroup controller with CFS bandwidth control "
                         "(CONFIG_CFS_BANDWIDTH), which this host does not offer")


def group_name(lab_id: str, key: str) -> str:
    return f"{PREFIX}{lab_id}-{key}"


def current_groups(pids: list[int]) -> dict[str, str]:
    """Each process's group in the cpu hierarchy (path from its root), as /proc says; keyed
    by the pid as text, as a journal keeps it; none where no hierarchy has the controller."""
    try:
        _, version = hierarchy()
    except MissingFeature:
        return {}
    found = {}
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if (version == 2 and controllers == "") or (version == 1 and "cpu" in controllers.split(",")):
                found[str(pid)] = path
                break
    return found


def throttle(lab_id: str, key: str, pids: list[int], cpus: float) -> Path:
    """Put `pids` in a group of their own limited to `cpus` of one core."""
    root, version = hierarchy()
    group = root / group_name(lab_id, key)
    group.mkdir(exist_ok=True)
    quota = max(1000, round(cpus * PERIOD_US))
    if version == 2:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
    else:
        (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    for pid in pids:
        _move(group, pid)
    return group


def release(lab_id: str, key: str, back: dict[str, str]) -> None:
    """Every process still in the fault's group back where it came from (`back`: pid → its
    former group; else the hierarchy's root), then the group removed."""
    root, _ = hierarchy()
    group = root / group_name(lab_id, key)
    if not group.is_dir():
        return
    for line in (group / "cgroup.procs").read_text().split():
        pid = int(line)
        former = (root / back.get(str(pid), "/").lstrip("/")).resolve()
        _move(former if former.is_dir() and former.is_relative_to(root) else root, pid)  # a journal is read back
    _remove(group)


def remove_lab_groups(lab_id: str) -> int:
    """Groups a lab's faults left (the lab is going): their processes to the root, the groups
    removed. How many there were."""
    try:
        root, _ = hierarchy()
    except MissingFeature:
        return 0
    removed = 0
    for group in root.glob(f"{PREFIX}{lab_id}-*"):
        if group.is_dir() and not group.is_symlink():
            for line in (group / "cgroup.procs").read_text().split():
                _move(root, int(line))
            _remove(group)
            removed += 1
    return removed


def _move(group: Path, pid: int) -> None:
    try:
        (group / "cgroup.procs").write_text(f"{pid}\n")
    except ProcessLookupError:
        pass  # it ended meanwhile
    except OSError as exc:
        if exc.errno != 3:  # ESRCH
            raise EmulationError(f"cannot move process {pid} into {group}: {exc.strerror}") from None


def _remove(group: Path) -> None:
    try:
        os.rmdir(group)
    except OSError as exc:
        raise EmulationError(f"cannot remove {group}: {exc.strerror}") from None
