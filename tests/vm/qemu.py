"""Boot Debian's stock kernel under qemu on this machine's own root filesystem; run one command.

Why: this machine's kernel lacks sch_netem and rdma_rxe, Debian's stock kernel has them. The
guest mounts the host root read-only over virtio-9p under a tmpfs overlay, so it runs exactly
this checkout with this venv and its writes stay in guest memory. A second 9p share, the job
directory, carries the command in and its output and exit code out.

Built once per kernel package and cached in /var/cache/testbed/vm/<package>/: the package
unpacked (vmlinuz, modules indexed by depmod) and a busybox initramfs that loads the virtio,
9p and overlay modules, builds the root, bind-mounts the modules into /lib/modules (so the
kernel's own module requests, e.g. crc32 for rdma_rxe, reach /sbin/modprobe) and
switch_roots into it. qemu runs in software emulation: KVM hangs on these machines.

The kernel is Debian's linux-image-amd64 of this machine's apt sources, or of another Debian
suite (`suite=`), whose index is kept apart under the cache: the machine's apt setup is not
touched.
"""

from __future__ import annotations

import ctypes
import fcntl
import gzip
import hashlib
import lzma
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("TESTBED_VM_CACHE", "/var/cache/testbed/vm"))
QEMU = "qemu-system-x86_64"
BUSYBOX = "/bin/busybox"
INITRD_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
READY = "testbed-vm: ready"
LAYOUT = "1"  # bump when the initramfs below changes: cached builds are then redone
ACCEL = os.environ.get("TESTBED_VM_ACCEL", "tcg")  # kvm where it works (it hangs on ours)
PR_SET_PDEATHSIG = 1


class VmUnavailable(Exception):
    """This machine cannot boot the test VM (no qemu, kernel package not fetchable)."""


@dataclass(frozen=True)
class Kernel:
    package: str
    release: str
    vmlinuz: Path
    modules: Path  # lib/modules/<release>, depmod'ed
    initrd: Path


@dataclass
class VmRun:
    returncode: int | None  # None: the command never reported (timeout, crash)
    output: str  # the command's stdout and stderr
    console: str  # the serial console (kernel and init messages)
    boot_seconds: float | None  # qemu start until the guest's root was ready
    seconds: float
    timed_out: bool
    files: dict[str, str]  # other files the command left in the job directory
    job: Path  # the job directory on the host, removed before run() returns


def _apt_options(suite: str | None) -> list[str]:
    """apt options for `suite`: None is this machine's own apt configuration; a Debian suite
    name (e.g. trixie-backports) gets a private source list and index under the cache, so
    the machine's apt setup is never touched."""
    if suite is None:
        return []
    home = CACHE / "apt" / suite
    (home / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (home / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = home / "sources.list"
    sources.write_text(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        f"http://deb.debian.org/debian {suite} main\n"
    )
    return [
        "-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={home / 'lists'}", "-o", f"Dir::Cache={home / 'cache'}",
        "-o", "APT::Architectures::=amd64",
    ]


def stock_kernel_package(suite: str | None = None) -> str:
    """The kernel package Debian's linux-image-amd64 points at, in this machine's apt sources
    or in `suite`."""
    options = _apt_options(suite)
    if suite is not None:
        _run(["apt-get", *options, "update"], f"apt-get update for {suite}", timeout=300)
    out = _run(["apt-cache", *options, "depends", "linux-image-amd64"], "apt-cache depends linux-image-amd64", timeout=60)
    found = re.search(r"Depends:\s+(linux-image-\d\S+)", out)
    if not found:
        raise VmUnavailable(f"apt knows no kernel behind linux-image-amd64{f' in {suite}' if suite else ''} (apt-get update?)")
    return found.group(1)


def prepare(package: str | None = None, suite: str | None = None) -> Kernel:
    """The cached kernel and initramfs for `package` (default: TESTBED_VM_KERNEL, else the
    stock kernel of this machine's apt sources, or of `suite`), built on first use."""
    if shutil.which(QEMU) is None:
        raise VmUnavailable(f"{QEMU} is not installed (apt-get install qemu-system-x86)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one session at a time builds, and updates apt indexes
        if package is None:
            override = os.environ.get("TESTBED_VM_KERNEL") if suite is None else None
            package = override or _resolve(suite)
        home = CACHE / package
        if not (home / f"ready-{LAYOUT}").exists():
            work = CACHE / f".{package}.building"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            try:
                _build(package, work, _apt_options(suite))
                shutil.rmtree(home, ignore_errors=True)
                work.rename(home)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            (home / f"ready-{LAYOUT}").touch()
        kernel = _kernel(package, home)
        if not kernel.initrd.exists():  # the init scripts changed since the kernel was cached
            for stale in home.glob("initrd-*.gz"):
                stale.unlink()
            _build_initrd(kernel, kernel.modules.parents[2], kernel.initrd)
        return kernel


def _resolve(suite: str | None) -> str:
    """The suite's current stock kernel, remembered per suite: the kernel it replaces is
    removed from the cache (~150-400 MB each), and offline the last one is used."""
    memo = CACHE / "apt" / (suite or "local") / "package"
    memo.parent.mkdir(parents=True, exist_ok=True)
    previous = memo.read_text().strip() if memo.exists() else None
    try:
        package = stock_kernel_package(suite)
    except VmUnavailable:
        if previous and (CACHE / previous / f"ready-{LAYOUT}").exists():
            return previous
        raise
    if previous and previous != package:
        in_use = {m.read_text().strip() for m in (CACHE / "apt").glob("*/package") if m != memo}
        if previous not in in_use:
            shutil.rmtree(CACHE / previous, ignore_errors=True)
    memo.write_text(package + "\n")
    return package


def _kernel(package: str, home: Path) -> Kernel:
    modules_dirs = [p for base in ("lib", "usr/lib") for p in (home / "root" / base / "modules").glob("*")]
    if len(modules_dirs) != 1:
        raise VmUnavailable(f"{package}: expected one modules directory, found {modules_dirs}")
    modules = modules_dirs[0]
    # Debian 12 ships /boot/vmlinuz-<release>; newer kernels keep it beside their modules
    vmlinuz = next(
        (p for p in (home / "root" / "boot" / f"vmlinuz-{modules.name}", modules / "vmlinuz") if p.exists()),
        modules / "vmlinuz",
    )
    return Kernel(package, modules.name, vmlinuz, modules, home / f"initrd-{_init_digest()}.gz")


def _init_digest() -> str:
    """Names the initramfs after its init scripts, so editing them rebuilds only it."""
    return hashlib.sha256((STAGE1 + STAGE2).encode()).hexdigest()[:12]


def _run(argv: list[str], what: str, cwd: Path | None = None, timeout: float = 600) -> str:
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VmUnavailable(f"{what}: {exc}") from None
    if result.returncode != 0:
        raise VmUnavailable(f"{what}: {result.stderr.strip()[-500:] or f'exit {result.returncode}'}")
    return result.stdout


def _build(package: str, work: Path, apt_options: list[str]) -> None:
    # Newer Debian kernels split the image into linux-{base,binary,modules}-<release> packages.
    parts = [package]
    for part in parts:
        depends = _run(["apt-cache", *apt_options, "depends", part], f"apt-cache depends {part}")
        parts += [p for p in re.findall(r"Depends:\s+(linux-(?:base|binary|modules)-\S+)", depends) if p not in parts]
    _run(["apt-get", *apt_options, "download", *parts], f"apt-get download {' '.join(parts)}", cwd=work)
    for deb in sorted(work.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(work / "root")], f"dpkg -x {deb.name}")
        deb.unlink()  # ~100 MB we no longer need
    kernel = _kernel(package, work)
    # depmod -b wants <base>/lib/modules/<release>
    base = kernel.modules.parents[2]
    _run(["depmod", "-b", str(base), kernel.release], "depmod")
    _build_initrd(kernel, base, kernel.initrd)


def _build_initrd(kernel: Kernel, base: Path, target: Path) -> None:
    tree = target.parent / "initrd"
    shutil.rmtree(tree, ignore_errors=True)  # a build killed half-way (tests/prepare.py's, say)
    for sub in ("bin", "mods", "proc", "sys", "dev", "lower", "rw", "newroot"):
        (tree / sub).mkdir(parents=True)
    shutil.copy2(BUSYBOX, tree / "bin" / "busybox")
    order: list[str] = []
    for module in INITRD_MODULES:
        out = _run(["modprobe", "-d", str(base), "-S", kernel.release, "--show-depends", module], f"modules of {module}")
        for line in out.splitlines():
            fields = line.split()
            if fields[:1] != ["insmod"]:
                continue  # "builtin <name>": nothing to load
            source = Path(fields[1])
            name = re.sub(r"\.ko(\.xz)?$", ".ko", source.name)
            if name in order:
                continue
            data = source.read_bytes()
            if source.suffix == ".xz":
                data = lzma.decompress(data)  # busybox insmod reads plain modules only
            elif source.suffix != ".ko":
                raise VmUnavailable(f"cannot unpack module {source.name}")
            (tree / "mods" / name).write_bytes(data)
            order.append(name)
    (tree / "mods" / "order").write_text("\n".join(order) + "\n")
    for name, text in (("init", STAGE1), ("stage2", STAGE2)):
        (tree / name).write_text(text)
        (tree / name).chmod(0o755)
    names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    archive = subprocess.run(
        ["cpio", "-o", "-H", "newc", "--quiet"], cwd=tree, input="\n".join(["."] + names).encode(),
        capture_output=True, check=True,
    ).stdout
    partial = target.with_name(target.name + ".part")  # whole or absent: prepare() trusts what exists
    partial.write_bytes(gzip.compress(archive, compresslevel=1))
    partial.rename(target)
    shutil.rmtree(tree)


# Stage 1, the initramfs's /init: build the root, then hand over to stage 2 inside it.
STAGE1 = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "testbed-vm: $*"; echo o > /proc/sysrq-trigger; sleep 30; }
for m in $(cat /mods/order); do insmod /mods/$m || fail "insmod $m"; done
modules=$(sed -n 's/.*tb.modules=\([^ ]*\).*/\1/p' /proc/cmdline)
project=$(sed -n 's/.*tb.project=\([^ ]*\).*/\1/p' /proc/cmdline)
# cache=loose: the host root does not change under a test run, and 9p without caching makes
# every Python import a round trip through an emulated virtio queue.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower || fail "mount host root"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail "overlay"
R=/newroot
mkdir -p $R/job
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job $R/job || fail "mount job"
umount /proc /sys /dev
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup 2>/dev/null
# fresh state where the host keeps its own: its namespaces, labs and temporary files; the
# checkout may live under one of them (CI's may be in /tmp): set it aside, then put it back
mkdir -p /keep
mount --bind $R$project /keep || fail "bind project"
for d in /run /tmp /var/tmp /var/lib/testbed; do mkdir -p $R$d; mount -t tmpfs tmpfs $R$d; done
mkdir -p $R$project
mount --move /keep $R$project || fail "move project"
release=$(uname -r)
mkdir -p $R/lib/modules/$release
mount --bind $R$modules $R/lib/modules/$release || fail "bind modules"
mkdir -p $R/run/testbed-vm
cp /bin/busybox /stage2 $R/run/testbed-vm/
exec switch_root $R /run/testbed-vm/busybox sh /run/testbed-vm/stage2
"""

# Stage 2, PID 1 inside the root: run the job, record its exit code, power off.
STAGE2 = r"""B=/run/testbed-vm/busybox
$B hostname testbed-vm
echo "testbed-vm: ready $($B cut -d' ' -f1 /proc/uptime)"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TESTBED_VM_GUEST=1
cd /
/bin/sh /job/run.sh > /job/output 2>&1 < /dev/null
echo $? > /job/rc
echo "testbed-vm: done $($B cut -d' ' -f1 /proc/uptime)"
$B sync
$B umount /job
echo o > /proc/sysrq-trigger
$B sleep 30
"""


PROJECT = Path(__file__).resolve().parents[2]  # this checkout, wherever it lives


def run(kernel: Kernel, script: str, timeout: float, memory_mb: int = 2048, cpus: int = 2,
        disks: tuple[Path, ...] = ()) -> VmRun:
    """Boot, run `script` with sh in the guest (cwd /, the job directory at /job), power off.
    `disks`: raw images the guest sees as /dev/vda, /dev/vdb…, its writes kept apart and
    dropped at power-off (qemu's snapshot mode), so an image serves any number of boots.

    Whatever happens, qemu is gone when this returns: the timeout kills it, and it dies with
    this process if that is killed first.
    """
    job = Path(tempfile.mkdtemp(prefix="testbed-vm-job-"))
    try:
        (job / "run.sh").write_text(script)
        argv = [
            QEMU, "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
            # -cpu max: every instruction qemu emulates (SSE4.2, AVX2...); the default qemu64
            # model lacks what this venv's numpy is built for, and its import dies of SIGILL
            "-accel", ACCEL, "-cpu", "max", "-no-reboot", "-m", str(memory_mb), "-smp", str(cpus),
            "-kernel", str(kernel.vmlinuz), "-initrd", str(kernel.initrd),
            "-append", f"console=ttyS0 quiet panic=-1 tb.modules={kernel.modules} tb.project={PROJECT}",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={job},mount_tag=job,security_model=none,multidevs=remap",
        ]
        for disk in disks:
            argv += ["-drive", f"file={disk},if=virtio,format=raw,snapshot=on"]
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        console: list[str] = []
        ready: list[float] = []

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                console.append(line)
                if READY in line and not ready:
                    ready.append(time.monotonic() - started)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
        seconds = time.monotonic() - started
        rc_file = job / "rc"
        returncode = int(rc_file.read_text()) if rc_file.exists() and rc_file.read_text().strip() else None
        output = (job / "output").read_text(errors="replace") if (job / "output").exists() else ""
        files = {
            p.name: p.read_text(errors="replace")
            for p in job.iterdir()
            if p.is_file() and p.name not in ("run.sh", "rc", "output")
        }
        return VmRun(returncode, output, "".join(console), ready[0] if ready else None, seconds, timed_out, files, job)
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
