"""The one place that talks to the kernel's network stack: namespaces, links, tc, routes.

Speed matters here (a fat-tree k=8 is 208 namespaces and 384 links), so nothing forks:
namespaces are made the way `ip netns add` makes them (unshare + bind mount under
/run/netns, so iproute2 and everyone else see them), but from a Python thread; and each
namespace gets one netlink socket opened from inside it, through which every request for
that namespace goes. Veth pairs are created with both ends directly in their namespaces,
so a lab never puts a data-plane interface name into the root namespace.

The requests a lab makes by the thousand (veth pairs, addresses, routes, tc, neighbours,
links up, and reading links) are encoded and decoded here, byte for byte as pyroute2 does
(tests/unit/test_netlink_messages.py), and sent past pyroute2: 20-50 µs each instead of
0.5-2 ms of pyroute2's Python, which made fattree,16 take 29 s to come up instead of 11.
pyroute2 does everything else.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import ipaddress
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

from types import SimpleNamespace
from typing import TYPE_CHECKING

from orchestrator.errors import EmulationError

if TYPE_CHECKING:
    from pyroute2 import IPRoute

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED = 4096, 16384, 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")

# Link attributes 62–64 of linux/if_link.h; pyroute2 0.9 names them only up to 61. Naming
# the IPv4 GSO/GRO limits (Linux 6.3, "BIG TCP" for IPv4) lets its link messages carry and
# show them. It must happen before pyroute2 builds its first link message, on the base of
# both link messages and a veth's peer.
_LATER_LINK_ATTRIBUTES = (("IFLA_DEVLINK_PORT", "hex"), ("IFLA_GSO_IPV4_MAX_SIZE", "uint32"),
                          ("IFLA_GRO_IPV4_MAX_SIZE", "uint32"))
_pyroute2: SimpleNamespace | None = None


def pyroute2() -> SimpleNamespace:
    """pyroute2 (IPRoute, IPBatch, NetlinkError), imported when first needed: it is 0.2 s of
    imports, and the hot requests (and all of `testbed down`) go past it."""
    global _pyroute2
    if _pyroute2 is None:
        from pyroute2 import IPBatch, IPRoute
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfbase

        if len(ifinfbase.nla_map) == 62 and ifinfbase.nla_map[61][0] == "IFLA_ALLMULTI":
            ifinfbase.nla_map = (*ifinfbase.nla_map, *_LATER_LINK_ATTRIBUTES)
        _pyroute2 = SimpleNamespace(IPRoute=IPRoute, IPBatch=IPBatch, NetlinkError=NetlinkError)
    return _pyroute2

# Super-packets a lab's veths accept (BIG TCP). With 64 KiB ones (the default) the kernel's
# per-packet work was ~a third of a CPU-bound ring's CPU (8 agents on 2 cores); with 256 KiB
# ones the machine went from ~90 % to ~72 % busy; 512 KiB ones were slower. Qdiscs still
# charge every MTU-sized segment's headers, so shaped rates are unchanged.
# But a super-packet is also a burst: on paths under 512 µs (tcp_tso_rtt_log) Linux sizes
# them up to this limit whatever the connection's pacing rate, so a flow paced at 1/12 of
# 100 Mbit sent 256 KiB at once every quarter second. Twelve of them on a link queued MBs
# (pfifo backlogs of 2 MB in 9-17 packets, RTTs of 0.1-0.5 s), and a mesh of 16 on bcube,4,1
# took 1.13-1.17 × the model with its transfers ending anywhere between 0.6 and 1.3 × the
# model's time. With 128 KiB: 1.070-1.074, colocated PS 1.068 (bench/fidelity.py), at
# some CPU (CPU idle of that mesh 0.32-0.40 -> 0.27; BML's 0.45 -> 0.29). 64 KiB bursts
# (sized by pacing, at least 44 segments) gave 1.074-1.081 at 0.20 idle; sized by pacing
# alone (2 segments at that rate) the CPU was the bound (idle 0.05, 2.2 ×).
BIG_GSO_BYTES = 128 * 1024
# A super-packet is also a burst HTB does not delay: sent whole while a link's bucket has
# tokens (bucket_bytes), it crosses at once after idle: a 64 KiB message written in one piece
# crossed 50 and 200 Mbit links in 0.01-0.09 × its serialisation time. Capped at the bucket,
# the kernel's work per byte grew with the packet count: iperf3 through 200 Mbit took 1.01
# core-s per GB instead of 0.31, and the demo (BCube(4,1) at 100 Mbit, 16 Docker servers) ran
# at 17-39 % CPU idle instead of 60-73 %, 3 of its 4 points degraded. Left as they are: what
# TCP writes as one super-packet after idle crosses at once (a message TCP splits is paced
# near the link's rate: the digits MLP's 4.8 KB messages were not), which the cost model,
# fluid, does not count.


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise EmulationError(f"{what}: {os.strerror(code)}")


def _in_thread(work: Callable[[], T]) -> T:
    """Run `work` in a fresh thread: namespace switches then die with the thread."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="testbed-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _prepare_netns_dir() -> None:
    """Make /run/netns a shared mount point, as iproute2 does, so mounts propagate."""
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    target = str(NETNS_DIR).encode()
    if _libc.mount(b"none", target, None, MS_SHARED | MS_REC, None) == 0:
        return
    _check(_libc.mount(target, target, b"none", MS_BIND | MS_REC, None), "bind /run/netns")
    _check(_libc.mount(b"none", target, None, MS_SHARED | MS_REC, None), "share /run/netns")


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def in_netns(name: str) -> list[str]:
    """argv prefix that runs a command in named network namespace `name`."""
    return ["nsenter", f"--net={netns_path(name)}", "--"]


def _claim_netns_path(name: str) -> Path:
    """Create the file a namespace is bind-mounted on; a namespace of that name must not exist."""
    path = netns_path(name)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    except FileExistsError:
        raise EmulationError(f"namespace {name} already exists: run `testbed clean`") from None
    return path


def create_namespaces(names: Sequence[str]) -> None:
    """Create named network namespaces (like `ip netns add`), all from one thread."""
    if not names:
        return
    _prepare_netns_dir()

    def work() -> None:
        for name in names:
            path = _claim_netns_path(name)
            _check(_libc.unshare(CLONE_NEWNET), f"unshare for namespace {name}")
            _check(
                _libc.mount(b"/proc/thread-self/ns/net", str(path).encode(), b"none", MS_BIND, None),
                f"mount namespace {name}",
            )

    _in_thread(work)


def attach_namespace(name: str, pid: int) -> None:
    """Name the network namespace of process `pid` (like `ip netns attach`)."""
    _prepare_netns_dir()
    path = _claim_netns_path(name)
    source = f"/proc/{pid}/ns/net".encode()
    _check(_libc.mount(source, str(path).encode(), b"none", MS_BIND, None), f"attach {name}")


def delete_namespace(name: str) -> bool:
    """Unmount and remove a named namespace; False if it was not there. Idempotent."""
    path = netns_path(name)
    if not path.exists():
        return False
    _libc.umount2(str(path).encode(), MNT_DETACH)  # fails harmlessly if not mounted
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def list_namespaces(prefix: str = "") -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def pids_in(names: Iterable[str]) -> list[int]:
    """Processes whose network namespace is one of the named ones (call it after removing
    containers: their processes are Docker's to stop)."""
    return [pid for pids in pids_by_namespace(names).values() for pid in pids]


def pids_by_namespace(names: Iterable[str]) -> dict[str, list[int]]:
    """The processes in each named network namespace (one walk of /proc for all of them)."""
    by_inode: dict[int, str] = {}
    for name in names:
        try:
            by_inode[os.stat(netns_path(name)).st_ino] = name
        except FileNotFoundError:
            continue
    found: dict[str, list[int]] = {name: [] for name in by_inode.values()}
    if not by_inode:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                name = by_inode.get(os.stat(f"/proc/{entry}/ns/net").st_ino)
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
            if name is not None:
                found[name].append(int(entry))
    return found


def in_namespaces(names: Iterable[str], work: Callable[[str], T]) -> dict[str, T]:
    """Call `work(name)` inside each named namespace in turn (one thread, no forks)."""

    def run() -> dict[str, T]:
        results = {}
        for name in names:
            fd = os.open(netns_path(name), os.O_RDONLY)
            try:
                _check(_libc.setns(fd, CLONE_NEWNET), f"enter namespace {name}")
            finally:
                os.close(fd)
            results[name] = work(name)
        return results

    return _in_thread(run)


CHECK_S = 0.2  # how often in_workers calls its checkpoint


def in_workers(
    items: Sequence[T],
    work: Callable[["Netlink", T], None],
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    checkpoint: Callable[[], None] | None = None,
) -> None:
    """Call `work(nl, item)` for every item, spread over forked workers (one per core), each
    with its own netlink sockets. Building a big lab is CPU-bound in Python (encoding
    requests, computing routes), so workers use every core. Items given to one worker are
    independent of the others'. A worker's error is raised here as EmulationError; workers
    die with this process. `checkpoint` is called at least every CHECK_S while they work
    (bcube,32,1's routes take minutes); whatever it raises stops them and is raised here."""
    workers = min(workers or os.cpu_count() or 1, len(items))
    if workers <= 1:
        with Netlink() as nl:
            for done, item in enumerate(items, 1):
                if checkpoint is not None:
                    checkpoint()
                work(nl, item)
                if progress:
                    progress(done, len(items))
        return
    ticks_r, ticks_w = os.pipe()
    children: list[tuple[int, int]] = []
    for index in range(workers):
        errors_r, errors_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(ticks_r)
            os.close(errors_r)
            _libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: die with the orchestrator
            code = 0
            try:
                with Netlink() as nl:
                    for item in items[index::workers]:
                        work(nl, item)
                        os.write(ticks_w, b".")
            except BaseException as exc:  # noqa: BLE001 - reported through the pipe
                os.write(errors_w, str(exc).encode()[:4000])
                code = 1
            finally:
                os._exit(code)
        os.close(errors_w)
        children.append((pid, errors_r))
    os.close(ticks_w)
    done = 0
    poller = select.poll()
    poller.register(ticks_r, select.POLLIN)
    try:
        while True:
            if checkpoint is not None:
                checkpoint()
            if not poller.poll(int(CHECK_S * 1000) if checkpoint is not None else None):
                continue
            chunk = os.read(ticks_r, 4096)
            if not chunk:  # every worker has exited
                break
            done += len(chunk)
            if progress:
                progress(done, len(items))
    except BaseException:
        for pid, errors_r in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(errors_r)
        raise
    finally:
        os.close(ticks_r)
    failures = []
    for pid, errors_r in children:
        with os.fdopen(errors_r, "rb") as errors:
            message = errors.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if status:
            failures.append(message or f"worker exited with status {status}")
    if failures:
        raise EmulationError(failures[0])


def write_sysctls(values: dict[str, str], optional: Iterable[str] = ()) -> None:
    """Write net sysctls in the calling thread's namespace (use inside `in_namespaces`);
    those in `optional` only where this kernel has them."""
    for key, value in values.items():
        path = Path("/proc/sys") / key.replace(".", "/")
        if key in optional and not path.exists():
            continue
        path.write_text(value)


# select() takes descriptors below FD_SETSIZE only, and C libraries that use it abort the
# process on a higher one (glibc: "bit out of range 0 - FD_SETSIZE on fd_set"); libnftables
# does, for its netlink socket. A big lab holds thousands of descriptors here (a socket and a
# namespace handle per namespace), so Netlink keeps its own at or above FD_SETSIZE whenever
# the open-files limit allows (capacity.require raises it), leaving the low ones to others.
FD_SETSIZE = 1024


def _lift_fd(fd: int) -> int:
    """`fd` moved to a number >= FD_SETSIZE (close-on-exec), or unchanged when the limit of
    open files does not reach that high."""
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FD_SETSIZE)
    except OSError:  # EINVAL: the soft limit is <= FD_SETSIZE; EMFILE: none free up there
        return fd
    os.close(fd)
    return high


def _route_socket() -> int:
    """A NETLINK_ROUTE socket in the calling thread's namespace, as a lifted descriptor."""
    return _lift_fd(socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE).detach())


class Netlink:
    """One pyroute2 socket per namespace, each opened from inside its namespace.

    The root namespace is the key None. Open many at once with `open()` (one thread). Every
    socket shares one event loop: pyroute2 otherwise makes one per socket, three more
    descriptors each (an epoll and a socket pair), 4,000 for a 1,000-namespace lab. So a
    Netlink is used by the thread that made it.
    """

    def __init__(self) -> None:
        self._sockets: dict[str | None, IPRoute] = {}
        self._ns_fds: dict[str, int] = {}
        self._indexes: dict[tuple[str | None, str], int] = {}
        self._dumped: set[str | None] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._raw: dict[str | None, socket.socket] = {}  # pyroute2 leaves sockets it was given open
        self._seq = 0x40000000  # ours; pyroute2 numbers its own requests from 0

    def _adopt(self, ns: str | None, fd: int) -> None:
        """Our socket of a namespace, with pyroute2's buffer sizes."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE, fileno=fd)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._raw[ns] = sock

    def _wrap(self, ns: str | None) -> IPRoute:
        """pyroute2 on our socket as it is (given by `fileno`, pyroute2 would dup it to the
        lowest free number), made when first needed: most namespaces never need it."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self._sockets[ns] = pyroute2().IPRoute(use_socket=self._raw[ns], use_event_loop=self._loop)
        return self._sockets[ns]

    def dump(self, ns: str | None, message: bytes, what: str) -> list[bytes]:
        """Send one dump request (NLM_F_DUMP) into a namespace; every message of the answer,
        header included, undecoded."""
        found: list[bytes] = []
        self._exchange(ns, message, what, found, ())
        return found

    def request(self, ns: str | None, message: bytes, what: str, ok: tuple[int, ...] = ()) -> int:
        """Send one encoded request (see `_message`) into a namespace and wait for its
        acknowledgement, on the namespace's socket but past pyroute2, whose own cost is ~0.5 ms
        a request (20 µs this way). EmulationError names `what` if the kernel refuses, unless
        with an errno in `ok`, which is returned (0 for success)."""
        return self._exchange(ns, message, what, None, ok)

    def _exchange(self, ns: str | None, message: bytes, what: str, parts: list[bytes] | None,
                  ok: tuple[int, ...]) -> int:
        """Send `message`; wait for its acknowledgement, or with `parts`, collect the messages
        of its dump until NLMSG_DONE. Messages of other sequence numbers are not ours: skipped."""
        if ns not in self._raw:
            self.open([ns])
        sock = self._raw[ns]
        self._seq += 1
        sock.send(message[:8] + struct.pack("=I", self._seq) + message[12:])
        poller = select.poll()  # pyroute2's event loop may have made the socket non-blocking
        poller.register(sock, select.POLLIN)
        while True:
            poller.poll()
            try:
                reply = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            offset = 0
            while offset + 16 <= len(reply):
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", reply, offset)
                if seq == self._seq:
                    if kind == NLMSG_ERROR:  # an acknowledgement (0) or a refusal: the end
                        (code,) = struct.unpack_from("=i", reply, offset + 16)
                        if code and -code not in ok:
                            raise EmulationError(f"{what}: {os.strerror(-code)}")
                        return -code
                    if kind == NLMSG_DONE:
                        return 0
                    elif parts is not None:
                        parts.append(reply[offset : offset + length])
                offset += max(16, (length + 3) & ~3)

    def __enter__(self) -> "Netlink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, names: Iterable[str | None]) -> None:
        wanted = [n for n in dict.fromkeys(names) if n not in self._raw]
        if None in wanted:
            self._adopt(None, _route_socket())  # this thread is in the root namespace
            wanted.remove(None)
        if not wanted:
            return
        for name, fd in in_namespaces(wanted, lambda _: _route_socket()).items():
            self._adopt(name, fd)

    def __getitem__(self, name: str | None) -> IPRoute:
        """pyroute2 in a namespace."""
        if name not in self._sockets:
            self.open([name])
            self._wrap(name)
        return self._sockets[name]

    def ns_fd(self, name: str) -> int:
        if name not in self._ns_fds:
            self._ns_fds[name] = _lift_fd(os.open(netns_path(name), os.O_RDONLY))
        return self._ns_fds[name]

    def index(self, ns: str | None, ifname: str) -> int:
        """Interface index by name: one dump per namespace, then one lookup per new name
        (a dump per miss would make building the management network quadratic)."""
        key = (ns, ifname)
        if key not in self._indexes:
            if ns not in self._dumped:
                self.refresh(ns)
            else:
                try:
                    found = self.dump(ns, get_link_message(ifname), f"look up {ifname}")
                except EmulationError:  # ENODEV: not there
                    found = []
                for message in found:
                    self._indexes[key] = link_index(message)
        try:
            return self._indexes[key]
        except KeyError:
            raise EmulationError(f"no interface {ifname} in namespace {ns or 'root'}") from None

    def name(self, ns: str | None, index: int) -> str:
        """Interface name by index (one dump per namespace)."""
        if ns not in self._dumped:
            self.refresh(ns)
        for (space, ifname), known in self._indexes.items():
            if space == ns and known == index:
                return ifname
        raise EmulationError(f"no interface with index {index} in namespace {ns or 'root'}")

    def cached_index(self, ns: str | None, ifname: str) -> int | None:
        """The index of an interface if this Netlink already knows it (no request)."""
        return self._indexes.get((ns, ifname))

    def refresh(self, ns: str | None) -> None:
        """Learn every interface index of a namespace with one dump."""
        for message in self.dump(ns, GET_LINKS, f"links of {ns or 'root'}"):
            name, _ = parse_link(message)
            self._indexes[(ns, name)] = link_index(message)
        self._dumped.add(ns)

    def forget(self, ns: str) -> None:
        """Drop what this Netlink holds of a namespace whose name now names another one (a
        restarted container's): its socket would keep reading the old one."""
        if (wrapped := self._sockets.pop(ns, None)) is not None:
            wrapped.close()
        if (raw := self._raw.pop(ns, None)) is not None:
            raw.close()
        if (fd := self._ns_fds.pop(ns, None)) is not None:
            os.close(fd)
        self._dumped.discard(ns)
        self._indexes = {key: index for key, index in self._indexes.items() if key[0] != ns}

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        for fd in self._ns_fds.values():
            os.close(fd)
        for sock in self._raw.values():
            sock.close()
        self._raw.clear()
        if self._loop is not None:
            self._loop.run_until_complete(asyncio.sleep(0))  # lets the closed transports finish
            self._loop.close()
            self._loop = None
        self._sockets.clear()
        self._ns_fds.clear()
        self._indexes.clear()
        self._dumped.clear()


def _netlink(what: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except pyroute2().NetlinkError as exc:
        raise EmulationError(f"{what}: {os.strerror(exc.code)}") from None


# -- requests encoded here ---------------------------------------------------------------------
# The requests a lab makes by the thousand, as pyroute2 encodes them (tests/unit compare the
# bytes), sent by Netlink.request. Constants from linux/netlink.h and linux/rtnetlink.h.
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE, RTM_NEWNEIGH = 16, 20, 24, 28
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x200, 0x400
CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
IFF_UP = 0x1
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_INFO_SLAVE_DATA, IFLA_BRPORT_ISOLATED = 3, 18, 1, 5, 33
IFLA_NET_NS_PID = 19
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC, RTA_METRICS, RTA_MULTIPATH = 1, 4, 5, 7, 8, 9
RTAX_INITCWND, RTAX_FEATURES, RTAX_INITRWND, RTAX_CC_ALGO = 11, 12, 14, 16
RTAX_FEATURE_ECN = 1
RT_TABLE_MAIN, RTPROT_STATIC, RTN_UNICAST = 254, 4, 1
NDA_DST, NDA_LLADDR = 1, 2


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes(-length % 4)


def _message(kind: int, flags: int, body: bytes) -> bytes:
    """A netlink message; Netlink.request writes its sequence number."""
    return struct.pack("=IHHII", 16 + len(body), kind, flags, 0, 0) + body


def link_up_message(index: int | None, ifname: str) -> bytes:
    """Set IFF_UP on an interface, by index or else by name."""
    body = struct.pack("=BBHiII", 0, 0, 0, index or 0, IFF_UP, IFF_UP)
    if not index:
        body += _attr(IFLA_IFNAME, ifname.encode() + b"\0")
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def move_message(index: int, pid: int) -> bytes:
    """Move interface `index` into the network namespace of process `pid` (IFLA_NET_NS_PID).
    The kernel takes it down and drops its addresses, routes and qdiscs on the way."""
    body = struct.pack("=BBHiII", 0, 0, 0, index, 0, 0) + _attr(IFLA_NET_NS_PID, struct.pack("=I", pid))
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def master_message(index: int, master: int) -> bytes:
    """Make interface `index` a port of bridge `master`."""
    body = struct.pack("=BBHiII", 0, 0, 0, index, 0, 0) + _attr(IFLA_MASTER, struct.pack("=I", master))
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def isolate_message(ifname: str) -> bytes:
    """A bridge port, by name, isolated (`ip link set NAME type bridge_slave isolated on`)."""
    data = _attr(IFLA_INFO_SLAVE_DATA, _attr(IFLA_BRPORT_ISOLATED, b"\x01"))
    info = _attr(IFLA_LINKINFO, _attr(IFLA_INFO_KIND, b"bridge_slave\0") + data)
    body = struct.pack("=BBHiII", 0, 0, 0, 0, 0, 0) + _attr(IFLA_IFNAME, ifname.encode() + b"\0") + info
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def address_message(index: int, address: ipaddress.IPv4Interface) -> bytes:
    body = struct.pack("=BBBBI", socket.AF_INET, address.network.prefixlen, 0, 0, index)
    body += _attr(IFA_ADDRESS, address.ip.packed) + _attr(IFA_LOCAL, address.ip.packed)
    return _message(RTM_NEWADDR, CREATE, body)


@dataclass(frozen=True)
class RouteMetrics:
    """What a route tells the TCP connections over it: their congestion control, their
    initial congestion and receive windows (in segments; both `initcwnd`), and whether they
    ask for ECN (`ip route ... features ecn`: the SYN requests it whatever net.ipv4.tcp_ecn)."""

    congestion: str | None = None
    initcwnd: int | None = None
    ecn: bool = False

    def __bool__(self) -> bool:
        return bool(self.congestion or self.initcwnd or self.ecn)

    def encode(self) -> bytes:
        """RTA_METRICS' nested attributes, in pyroute2's order (its NLA map's)."""
        nested = b""
        if self.initcwnd:
            nested += _attr(RTAX_INITCWND, struct.pack("=I", self.initcwnd))
        if self.ecn:
            nested += _attr(RTAX_FEATURES, struct.pack("=I", RTAX_FEATURE_ECN))
        if self.initcwnd:
            nested += _attr(RTAX_INITRWND, struct.pack("=I", self.initcwnd))
        if self.congestion:
            nested += _attr(RTAX_CC_ALGO, self.congestion.encode() + b"\0")
        return _attr(RTA_METRICS, nested)

    def __str__(self) -> str:
        return " ".join(filter(None, (self.congestion and f"congctl {self.congestion}",
                                      self.initcwnd and f"initcwnd {self.initcwnd}",
                                      self.ecn and "features ecn")))


def route_message(
    prefix: ipaddress.IPv4Network,
    hops: Sequence[tuple[int, ipaddress.IPv4Address | None]],
    replace: bool = False,
    metrics: RouteMetrics | None = None,
    source: ipaddress.IPv4Address | None = None,
    scope: int = 0,
    protocol: int = RTPROT_STATIC,
) -> bytes:
    """A main-table unicast route over (ifindex, gateway) hops, several making ECMP."""
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, prefix.prefixlen, 0, 0, RT_TABLE_MAIN, protocol, scope,
                       RTN_UNICAST, 0)
    if prefix.prefixlen:
        body += _attr(RTA_DST, prefix.network_address.packed)
    if len(hops) == 1:
        oif, via = hops[0]
        body += _attr(RTA_OIF, struct.pack("=i", oif))
        if via is not None:
            body += _attr(RTA_GATEWAY, via.packed)
    else:
        nexthops = b""
        for oif, via in hops:
            gateway = _attr(RTA_GATEWAY, via.packed) if via is not None else b""
            nexthops += struct.pack("=HBBi", 8 + len(gateway), 0, 0, oif) + gateway
        body += _attr(RTA_MULTIPATH, nexthops)
    if source is not None:
        body += _attr(RTA_PREFSRC, source.packed)
    if metrics:
        body += metrics.encode()
    return _message(RTM_NEWROUTE, REPLACE if replace else CREATE, body)


def neighbour_message(index: int, address: ipaddress.IPv4Address, mac: str, state: int) -> bytes:
    body = struct.pack("=BBHiHBB", socket.AF_INET, 0, 0, index, state, 0, 0)
    body += _attr(NDA_DST, address.packed) + _attr(NDA_LLADDR, bytes.fromhex(mac.replace(":", "")))
    # replace, not create: the kernel may already hold an entry it learnt or is resolving (a
    # packet sent to the address as soon as the route existed); the permanent one wins
    return _message(RTM_NEWNEIGH, REPLACE, body)


IFLA_ADDRESS, IFLA_TXQLEN, IFLA_MASTER, IFLA_GROUP, IFLA_NET_NS_FD = 1, 13, 10, 27, 28
IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4, IFLA_GRO_IPV4 = 41, 58, 63, 64
IFLA_INFO_DATA, VETH_INFO_PEER = 2, 1


@dataclass(frozen=True)
class VethEnd:
    ifname: str
    txqlen: int
    mtu: int | None = None
    gso_bytes: int | None = None  # GSO and GRO limits, IPv4 and other (see BIG_GSO_BYTES)
    ns_fd: int | None = None  # where it is made; None: where the request is sent
    group: int | None = None
    master: int | None = None  # a bridge's index, in the end's namespace
    mac: str | None = None


def _end_attributes(end: VethEnd) -> bytes:
    u32 = lambda kind, value: _attr(kind, struct.pack("=I", value))  # noqa: E731
    out = _attr(IFLA_IFNAME, end.ifname.encode() + b"\0") + u32(IFLA_TXQLEN, end.txqlen)
    if end.mac is not None:
        out += _attr(IFLA_ADDRESS, bytes.fromhex(end.mac.replace(":", "")))
    if end.group is not None:
        out += u32(IFLA_GROUP, end.group)
    if end.master is not None:
        out += u32(IFLA_MASTER, end.master)
    if end.mtu is not None:
        out += u32(IFLA_MTU, end.mtu)
    if end.gso_bytes is not None:
        for kind in (IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4, IFLA_GRO_IPV4):
            out += u32(kind, end.gso_bytes)
    if end.ns_fd is not None:
        out += u32(IFLA_NET_NS_FD, end.ns_fd)
    return out


def veth_message(main: VethEnd, peer: VethEnd) -> bytes:
    """Create a veth pair, `main` up, `peer` as it comes (RTM_NEWLINK, kind veth)."""
    peer_info = bytes(16) + _end_attributes(peer)  # the peer's own (empty) ifinfomsg first
    info = _attr(IFLA_INFO_KIND, b"veth\0") + _attr(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info))
    body = struct.pack("=BBHiII", 0, 0, 0, 0, IFF_UP, IFF_UP) + _end_attributes(main) + _attr(IFLA_LINKINFO, info)
    return _message(RTM_NEWLINK, CREATE, body)


_TC_TEMPLATES: dict[tuple, bytes] = {}
_TC_PLACEHOLDER = 0x7FFFFFF0  # an ifindex no interface has, written over per request


def tc_message(index: int, command: str, kind: str, handle: int, **options) -> bytes:
    """A tc request as pyroute2 encodes it (HTB's rate tables and all), encoded once per set
    of options and reused with the interface's index written in (~1 ms saved each time)."""
    key = (command, kind, handle, tuple(sorted(options.items())))
    template = _TC_TEMPLATES.get(key)
    if template is None:
        batch = pyroute2().IPBatch()
        try:
            batch.tc(command, kind, _TC_PLACEHOLDER, handle, **options)
            template = bytes(batch.batch)
        finally:
            batch.close()
        assert struct.unpack_from("=i", template, 20)[0] == _TC_PLACEHOLDER  # tcmsg.tcm_ifindex
        _TC_TEMPLATES[key] = template
    return template[:20] + struct.pack("=i", index) + template[24:]


# -- links ------------------------------------------------------------------------------------
def add_veth(
    nl: Netlink, a_ns: str | None, a_if: str, b_ns: str | None, b_if: str, txqlen: int,
    group: int | None = None, mtu: int | None = None, gso_bytes: int | None = None,
    master: str | None = None, peer_mac: str | None = None, peer_group: int | None = None,
) -> None:
    """A veth pair with each end created straight inside its namespace, the first end up.

    `group` puts the first end in a netdev group, which one call deletes (see delete_group);
    `peer_group` the second. `mtu` applies to both ends (a bridge takes the smallest of its
    ports'), and so does `gso_bytes`, the largest super-packet for IPv4 and other traffic (see
    BIG_GSO_BYTES). `master`: a bridge in the first end's namespace that end joins in the same
    request; `peer_mac`: the second end's MAC address.
    """
    main = VethEnd(a_if, txqlen, mtu, gso_bytes, nl.ns_fd(a_ns) if a_ns is not None else None, group,
                   nl.index(a_ns, master) if master is not None else None)
    peer = VethEnd(b_if, txqlen, mtu, gso_bytes, nl.ns_fd(b_ns) if b_ns is not None else None, peer_group,
                   mac=peer_mac)
    nl.request(None, veth_message(main, peer), f"create link {a_if}–{b_if}")


VXLAN_PORT = 4789  # IANA's


def add_vxlan(
    nl: Netlink, host_ns: str | None, ifname: str, vni: int, local: ipaddress.IPv4Address,
    remote: ipaddress.IPv4Address, node_ns: str, txqlen: int, mtu: int, port: int = VXLAN_PORT,
) -> None:
    """One end of a wire between hosts: a VXLAN device made from the host's namespace
    (`host_ns`, None: this one), where its UDP socket stays on the underlay, and created
    straight inside the node's namespace, so the node sees a plain NIC. Unicast to `remote`,
    no learning: every frame goes to the other end, as on a veth."""
    _netlink(f"create wire {ifname} (VNI {vni})", lambda: nl[host_ns].link(
        "add", ifname=ifname, kind="vxlan", vxlan_id=vni, vxlan_local=str(local), vxlan_group=str(remote),
        vxlan_port=port, vxlan_learning=0, vxlan_ttl=64, txqlen=txqlen, mtu=mtu, net_ns_fd=nl.ns_fd(node_ns)))


def set_up(nl: Netlink, ns: str | None, ifname: str) -> None:
    """Bring an interface up: by index when known, else by name, which the kernel resolves
    (a lookup first costs 1.7 ms of decoding here, the request by name 0.8 ms)."""
    nl.request(ns, link_up_message(nl.cached_index(ns, ifname), ifname), f"bring up {ifname}")


def move_links(nl: Netlink, ns: str, names: Iterable[str], pid: int) -> None:
    """Move interfaces of namespace `ns` into the network namespace of process `pid`."""
    for name in names:
        nl.request(ns, move_message(nl.index(ns, name), pid), f"move {name} out of {ns}")


def set_link_state(nl: Netlink, ns: str | None, ifname: str, up: bool) -> None:
    index = nl.index(ns, ifname)
    state = "up" if up else "down"
    _netlink(f"set {ifname} {state}", lambda: nl[ns].link("set", index=index, state=state))


def add_bridge(nl: Netlink, ns: str | None, name: str, group: int | None = None, mac: str | None = None) -> None:
    """A bridge without STP (our L2 segments are trees) that forwards at once; `mac` fixes
    its address (otherwise it follows its ports')."""
    extra: dict = {"group": group} if group is not None else {}
    if mac is not None:
        extra["address"] = mac
    _netlink(
        f"create bridge {name}",
        lambda: nl[ns].link(
            "add", ifname=name, kind="bridge", state="up", br_stp_state=0, br_forward_delay=0, **extra
        ),
    )


def enslave(nl: Netlink, ns: str | None, ifname: str, bridge: str, isolated: bool = False) -> None:
    index, master = nl.index(ns, ifname), nl.index(ns, bridge)
    nl.request(ns, master_message(index, master), f"add {ifname} to {bridge}")
    if isolated:
        isolate_port(nl, ns, ifname)


def isolate_port(nl: Netlink, ns: str | None, ifname: str) -> None:
    """Isolated bridge ports reach the bridge itself and its ports that are not isolated,
    never each other. (By name, as `ip link set … type bridge_slave isolated on` does.)"""
    nl.request(ns, isolate_message(ifname), f"isolate {ifname}")


NUD_PERMANENT = 0x80


def add_neighbour(nl: Netlink, ns: str | None, ifname: str, address: ipaddress.IPv4Address, mac: str) -> None:
    """A permanent ARP entry: never resolved, never expires, and exempt from the neighbour
    table's limit (net.ipv4.neigh.default.gc_thresh3), which counts only learnt entries."""
    message = neighbour_message(nl.index(ns, ifname), address, mac, NUD_PERMANENT)
    nl.request(ns, message, f"neighbour {address} on {ifname}")


def add_address(
    nl: Netlink, ns: str | None, ifname: str, address: ipaddress.IPv4Interface, metrics: RouteMetrics | None = None
) -> None:
    nl.request(ns, address_message(nl.index(ns, ifname), address), f"address {address} on {ifname}")
    if metrics:
        set_connected_metrics(nl, ns, ifname, address, metrics)


def set_connected_metrics(
    nl: Netlink, ns: str | None, ifname: str, address: ipaddress.IPv4Interface, metrics: RouteMetrics
) -> None:
    """(Re)write the route the kernel makes for `address`'s subnet with route metrics: a
    route's `congctl` chooses the TCP congestion control of connections over it (a
    namespace's own default can only be one its kernel allows unprivileged sockets, a
    route's any), its `initcwnd`/`initrwnd` their first windows."""
    message = route_message(address.network, [(nl.index(ns, ifname), None)], replace=True, metrics=metrics,
                            source=address.ip, scope=253, protocol=2)  # as the kernel made it: link scope
    nl.request(ns, message, f"route {address.network} {metrics} in {ns}")


def add_route(
    nl: Netlink,
    ns: str | None,
    prefix: ipaddress.IPv4Network,
    nexthops: Sequence[tuple[str, ipaddress.IPv4Address | None]],
    replace: bool = False,
    metrics: RouteMetrics | None = None,
    source: ipaddress.IPv4Address | None = None,
) -> None:
    """A static route; several (dev, via) pairs make an ECMP group. `replace` overwrites
    (and restores) an existing route, e.g. after its interface was down. `metrics`: what it
    tells TCP connections over it; `source`: the address it prefers."""
    hops = [(nl.index(ns, dev), via) for dev, via in nexthops]
    message = route_message(prefix, hops, replace=replace, metrics=metrics, source=source)
    nl.request(ns, message, f"route {prefix} in {ns}")



RTM_DELROUTE = 25


def delete_route(nl: Netlink, ns: str | None, prefix: ipaddress.IPv4Network) -> bool:
    """Delete the main table's route to `prefix` (whatever its next hops); whether it existed."""
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, prefix.prefixlen, 0, 0, RT_TABLE_MAIN, 0, 0, 0, 0)
    if prefix.prefixlen:
        body += _attr(RTA_DST, prefix.network_address.packed)
    code = nl.request(ns, _message(RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK, body), f"delete route {prefix} in {ns}",
                      ok=(errno.ESRCH,))
    return code == 0

# -- traffic control --------------------------------------------------------------------------
HTB_ROOT, HTB_CLASS, LEAF = 0x10000, 0x10001, 0x20000


def shape(
    nl: Netlink,
    ns: str | None,
    ifname: str,
    rate_bps: int,
    queue: int,
    delay_s: float = 0.0,
    jitter_s: float = 0.0,
    loss_percent: float = 0.0,
    leaf: Leaf | None = None,
    mtu: int = 1500,
) -> None:
    """Egress shaping: HTB at `rate_bps` (its bucket: bucket_bytes), under it a `queue`-packet
    FIFO, or netem when the link has delay, jitter or loss (netem then holds the queue limit),
    or `leaf`'s queue (a marking discipline: emulation/queues.py). `mtu`: the link's."""
    index = nl.index(ns, ifname)
    nl.request(ns, tc_message(index, "add", "htb", HTB_ROOT, default=1), f"shape {ifname}")
    nl.request(ns, _htb_class(index, "add-class", rate_bps, mtu), f"shape {ifname}")
    _leaf(nl, ns, ifname, index, "add", queue, delay_s, jitter_s, loss_percent, leaf)


# HTB's bucket in line time: 1 ms keeps HTB at its rate at Gbit speeds (timer slack).
BUCKET_SECONDS = 0.001


def bucket_bytes(rate_bps: float, mtu: int) -> int:
    """What an idle link of `rate_bps` lets through at once: HTB sends packets while its
    bucket has tokens. 1 ms of line time, at least two full frames. It was at least 64 KiB,
    to hold a super-packet; but HTB charges a packet after sending it, so a smaller bucket
    only makes the next one wait, and 64 KiB is 10.5 ms of a 50 Mbit link: a 256 KiB message
    sent after idle crossed one in 0.76 × its serialisation time (0.98 now; the cost model,
    fluid, says 1)."""
    return max(int(rate_bps / 8 * BUCKET_SECONDS), 2 * (mtu + 14))


def _htb_class(index: int, command: str, rate_bps: int, mtu: int) -> bytes:
    burst = bucket_bytes(rate_bps, mtu)  # a small quantum keeps HTB from complaining
    return tc_message(index, command, "htb", HTB_CLASS, parent=HTB_ROOT, rate=f"{rate_bps}bit",
                      ceil=f"{rate_bps}bit", burst=burst, cburst=burst, quantum=1514 * 8)


# the request that puts a marking queue under interface `index`'s HTB class ("add" or "replace")
Leaf = Callable[[int, str], bytes]


def _leaf(nl: Netlink, ns: str | None, ifname: str, index: int, command: str, queue: int, delay_s: float,
          jitter_s: float, loss_percent: float, leaf: Leaf | None = None) -> None:
    """The queue under the HTB class: netem when the link has delay, jitter or loss (netem
    then holds the queue limit), else `leaf`'s, else a `queue`-packet FIFO."""
    if delay_s or jitter_s or loss_percent:
        options = {"limit": queue}
        if delay_s:
            options["delay"] = int(delay_s * 1e6)  # microseconds
        if jitter_s:
            options["jitter"] = int(jitter_s * 1e6)
        if loss_percent:
            options["loss"] = loss_percent
        nl.request(ns, tc_message(index, command, "netem", LEAF, parent=HTB_CLASS, **options), f"netem on {ifname}")
    elif leaf is not None:
        nl.request(ns, leaf(index, command), f"queue discipline on {ifname}")
    else:
        nl.request(ns, tc_message(index, command, "pfifo", LEAF, parent=HTB_CLASS, limit=queue), f"queue on {ifname}")


def set_rate(nl: Netlink, ns: str | None, ifname: str, rate_bps: int, mtu: int = 1500) -> None:
    """Change a shaped interface's HTB rate (and its bucket with it) in place (its queue and
    any netem stay)."""
    nl.request(ns, _htb_class(nl.index(ns, ifname), "change-class", rate_bps, mtu), f"rate of {ifname}")


def set_gso(nl: Netlink, ns: str | None, ifname: str, gso_bytes: int, ipv4_too: bool) -> None:
    """The largest super-packet `ifname` builds from now on (sockets take their device's limit
    when they connect: those already open keep theirs); `ipv4_too`: IPv4's own limit as well
    (a kernel with BIG TCP keeps one, see BIG_GSO_BYTES)."""
    index = nl.index(ns, ifname)
    extra = {"gso_ipv4_max_size": gso_bytes} if ipv4_too else {}
    _netlink(f"set {ifname} gso_max_size {gso_bytes}",
             lambda: nl[ns].link("set", index=index, gso_max_size=gso_bytes, **extra))


RTM_DELQDISC = 37


def set_leaf(nl: Netlink, ns: str | None, ifname: str, queue: int, delay_s: float = 0.0, jitter_s: float = 0.0,
             loss_percent: float = 0.0, leaf: Leaf | None = None) -> None:
    """Replace a shaped interface's queue: netem with delay/jitter/loss, or the plain FIFO.
    The kernel changes a qdisc in place only within its kind (a FIFO cannot become netem),
    so the old leaf goes first (HTB puts a default FIFO under its class meanwhile)."""
    index = nl.index(ns, ifname)
    body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, LEAF, HTB_CLASS, 0)  # tcmsg, no kind: any
    nl.request(ns, _message(RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK, body), f"queue of {ifname}",
               ok=(errno.ENOENT,))
    _leaf(nl, ns, ifname, index, "replace", queue, delay_s, jitter_s, loss_percent, leaf)


def read_rate(nl: Netlink, ns: str | None, ifname: str) -> int | None:
    """The HTB rate (bit/s) configured on an interface, or None if unshaped."""
    index = nl.index(ns, ifname)
    for msg in nl[ns].get_classes(index=index):
        if msg.get_attr("TCA_KIND") == "htb":
            options = msg.get_attr("TCA_OPTIONS")
            params = options.get_attr("TCA_HTB_PARMS") if options else None
            rate64 = options.get_attr("TCA_HTB_RATE64") if options else None
            if rate64:
                return int(rate64) * 8
            if params:
                return int(params["rate"]) * 8
    return None


def links_in(nl: Netlink, ns: str | None) -> dict[str, dict]:
    """name → {state, up, carrier, mtu, gso_ipv4_bytes, tso_max_bytes, rx_bytes, tx_bytes,
    rx_packets, tx_packets} of a namespace. Decoded here, only these attributes: pyroute2 decodes every
    attribute of every link (~0.4 ms a link), and settling a big lab polls them all."""
    return dict(parse_link(message) for message in nl.dump(ns, GET_LINKS, f"links of {ns or 'root'}"))


IFLA_MTU, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER, IFLA_GSO_IPV4_MAX_SIZE = 4, 16, 23, 33, 63
IFLA_TSO_MAX_SIZE = 59  # the largest super-packet the device takes (Linux 5.19+)
LINK_FACTS = frozenset({IFLA_IFNAME, IFLA_MTU, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER, IFLA_GSO_IPV4_MAX_SIZE,
                        IFLA_TSO_MAX_SIZE})
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")  # IF_OPER_*
GET_LINKS = _message(18, NLM_F_REQUEST | 0x300, bytes(16))  # RTM_GETLINK, NLM_F_DUMP, an empty ifinfomsg


def get_link_message(ifname: str) -> bytes:
    """RTM_GETLINK of one interface by name (its RTM_NEWLINK comes back, then the ack)."""
    return _message(18, NLM_F_REQUEST | NLM_F_ACK, bytes(16) + _attr(IFLA_IFNAME, ifname.encode() + b"\0"))


def attributes(data: bytes, offset: int, wanted: frozenset[int] | None = None) -> dict[int, bytes]:
    """kind → payload of the netlink attributes from `offset` on (nested ones undecoded);
    with `wanted`, only those, and no further than the last of them (a link message's
    tail, AF_SPEC and LINKINFO, is most of it)."""
    found: dict[int, bytes] = {}
    end, left = len(data), len(wanted) if wanted is not None else -1
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        kind &= 0x3FFF
        if wanted is None or kind in wanted:
            found[kind] = data[offset + 4 : offset + length]
            left -= 1
            if left == 0:
                break
        offset += (length + 3) & ~3
    return found


def attribute_offset(data: bytes, offset: int, kind: int) -> int | None:
    """Where the attribute `kind` starts, from `offset` on (top level only), or None."""
    while offset + 4 <= len(data):
        length, found = struct.unpack_from("=HH", data, offset)
        if length < 4:
            return None
        if found & 0x3FFF == kind:
            return offset
        offset += (length + 3) & ~3
    return None


def attribute_at(data: bytes, offset: int, kind: int) -> bytes | None:
    """The payload of attribute `kind` if it starts at `offset` (a place remembered from an
    earlier message of the same interface: a dump's layout repeats), else None."""
    if offset + 4 > len(data):
        return None
    length, found = struct.unpack_from("=HH", data, offset)
    return data[offset + 4 : offset + length] if found & 0x3FFF == kind and length >= 4 else None


def link_index(message: bytes) -> int:
    """The interface index of an RTM_NEWLINK message (header included)."""
    return struct.unpack_from("=i", message, 20)[0]


RTM_GETQDISC, TCA_STATS2, TCA_STATS_QUEUE, TC_H_ROOT = 38, 7, 3, 0xFFFFFFFF
RTM_NEWQDISC, TCA_KIND, TCA_OPTIONS, TCA_XSTATS, TCA_STATS_APP = 36, 1, 2, 4, 4
GET_QDISCS = _message(RTM_GETQDISC, NLM_F_REQUEST | 0x300, bytes(20))  # NLM_F_DUMP, an empty tcmsg
QDISC_STATS, QUEUE_STATS = frozenset({TCA_STATS2}), frozenset({TCA_STATS_QUEUE})
LEAF_FACTS, APP_STATS = frozenset({TCA_KIND, TCA_XSTATS, TCA_STATS2}), frozenset({TCA_STATS_APP})
# where each marking discipline's xstats keep its ECN marks (offsets of u32 counters):
# tc_red_xstats.marked; tc_codel_xstats.ecn_mark and .ce_mark; fq_codel's qdisc_stats' two
MARK_OFFSETS = {"red": (12,), "codel": (24, 32), "fq_codel": (12, 28)}


def root_qdiscs(nl: Netlink, ns: str | None) -> dict[int, dict]:
    """ifindex → {drops, overlimits, backlog, qlen, marks} of each interface's root qdisc (one
    dump); `marks`: the ECN marks of a marking queue under the HTB class (0 for the others)."""
    found, marks = {}, {}
    for message in nl.dump(ns, GET_QDISCS, f"qdiscs of {ns or 'root'}"):
        _, ifindex, handle, parent, _ = struct.unpack_from("=BxxxiIII", message, 16)
        if parent == HTB_CLASS and handle == LEAF:
            marks[ifindex] = leaf_marks(message)
            continue
        if parent != TC_H_ROOT:
            continue
        stats = attributes(message, 36, QDISC_STATS).get(TCA_STATS2)  # after nlmsghdr + tcmsg
        queue = attributes(stats, 0, QUEUE_STATS).get(TCA_STATS_QUEUE) if stats else None
        if queue:
            qlen, backlog, drops, _, overlimits = struct.unpack_from("=5I", queue)
            found[ifindex] = {"drops": drops, "overlimits": overlimits, "backlog": backlog, "qlen": qlen}
    for ifindex, facts in found.items():
        facts["marks"] = marks.get(ifindex, 0)
    return found


def leaf_marks(message: bytes) -> int:
    """The ECN marks a qdisc dump message counts: 0 unless its kind marks."""
    found = attributes(message, 36, LEAF_FACTS)
    offsets = MARK_OFFSETS.get(found.get(TCA_KIND, b"").split(b"\0", 1)[0].decode())
    if offsets is None:
        return 0
    xstats = found.get(TCA_XSTATS)
    if xstats is None and TCA_STATS2 in found:
        xstats = attributes(found[TCA_STATS2], 0, APP_STATS).get(TCA_STATS_APP)
    return sum(struct.unpack_from("=I", xstats, o)[0] for o in offsets if xstats and o + 4 <= len(xstats))


def parse_link(message: bytes) -> tuple[str, dict]:
    """(name, facts) of one RTM_NEWLINK message (header included), as links_in gives them."""
    (flags,) = struct.unpack_from("=I", message, 16 + 8)
    attrs = attributes(message, 32, LINK_FACTS)  # after nlmsghdr + ifinfomsg

    def u32(kind: int) -> int | None:
        return struct.unpack_from("=I", attrs[kind])[0] if kind in attrs else None

    stats = struct.unpack_from("=4Q", attrs[IFLA_STATS64]) if IFLA_STATS64 in attrs else (0, 0, 0, 0)
    operstate = attrs[IFLA_OPERSTATE][0] if IFLA_OPERSTATE in attrs else 0
    return attrs[IFLA_IFNAME].split(b"\0", 1)[0].decode(), {
        "state": OPERSTATES[operstate] if operstate < len(OPERSTATES) else "UNKNOWN",
        "up": bool(flags & IFF_UP),
        "carrier": bool(attrs[IFLA_CARRIER][0]) if IFLA_CARRIER in attrs else False,
        "mtu": u32(IFLA_MTU),
        "gso_ipv4_bytes": u32(IFLA_GSO_IPV4_MAX_SIZE),
        "tso_max_bytes": u32(IFLA_TSO_MAX_SIZE),  # None on a kernel that does not say
        "rx_bytes": stats[2], "tx_bytes": stats[3], "rx_packets": stats[0], "tx_packets": stats[1],
    }


RTM_DELLINK = 17


def delete_link(nl: Netlink, ns: str | None, ifname: str) -> bool:
    """Delete an interface if it exists (its veth peer goes with it). Idempotent."""
    body = struct.pack("=BBHiII", 0, 0, 0, 0, 0, 0) + _attr(IFLA_IFNAME, ifname.encode() + b"\0")
    code = nl.request(ns, _message(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, body), f"delete {ifname}", ok=(errno.ENODEV,))
    return code == 0


def delete_group(nl: Netlink, ns: str | None, group: int) -> None:
    """Delete every interface of a netdev group in one batched kernel call.

    Deleting veths one by one costs an RCU grace period each (~20 ms); a group goes at once.
    """
    body = struct.pack("=BBHiII", 0, 0, 0, 0, 0, 0) + _attr(IFLA_GROUP, struct.pack("=I", group))
    nl.request(ns, _message(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, body), f"delete link group {group}",
               ok=(errno.ENODEV, errno.ENOENT, errno.EINVAL))


def root_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address or route in."""
    return [network for network, _ in root_networks_on()]


def root_networks_on() -> list[tuple[ipaddress.IPv4Network, str]]:
    """(network, device) of every IPv4 address and main-table route of the root namespace
    (the device is "" for a route without one, e.g. a multipath route)."""
    found: list[tuple[ipaddress.IPv4Network, int | None]] = []
    with pyroute2().IPRoute() as ipr:
        for msg in ipr.get_addr(family=socket.AF_INET):
            network = ipaddress.IPv4Network(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}", strict=False)
            found.append((network, msg["index"]))
        for msg in ipr.get_routes(family=socket.AF_INET, table=254):
            dst = msg.get_attr("RTA_DST")
            if dst:
                found.append((ipaddress.IPv4Network(f"{dst}/{msg['dst_len']}", strict=False), msg.get_attr("RTA_OIF")))
        # names of just these devices: a dump of every root link (labs put thousands there)
        # would cost ~1.7 ms of decoding each
        names = {}
        for index in {index for _, index in found if index}:
            try:
                names[index] = ipr.link("get", index=index)[0].get_attr("IFLA_IFNAME")
            except pyroute2().NetlinkError:  # gone meanwhile
                names[index] = ""
    return [(network, names.get(index, "") if index else "") for network, index in found]


# -- where a connection goes: its sockets and the routers' ECMP choices -----------------------
TCP_ESTABLISHED = "01"


def tcp_connections(port: int) -> list[tuple[ipaddress.IPv4Address, int, ipaddress.IPv4Address, int]]:
    """(local address, local port, remote address, remote port) of every established TCP
    connection to remote `port` in the calling thread's namespace (use inside
    `in_namespaces`), from /proc (IPv4, and IPv4-mapped IPv6 sockets)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            found += parse_tcp_table(Path(f"/proc/thread-self/net/{table}").read_text(), port)
        except OSError:
            continue
    return found


_V4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:0:0/96 as /proc/net/tcp6 writes it


def parse_tcp_table(text: str, port: int) -> list[tuple[ipaddress.IPv4Address, int, ipaddress.IPv4Address, int]]:
    """The established connections to remote `port` in a /proc/net/tcp or tcp6 table (IPv4
    and IPv4-mapped addresses; addresses are little-endian 32-bit words, ports big-endian hex)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != TCP_ESTABLISHED:
            continue
        (local, lport), (remote, rport) = (f.split(":") for f in fields[1:3])
        if int(rport, 16) != port:
            continue
        if len(local) == 32:
            if not (local.startswith(_V4_MAPPED) and remote.startswith(_V4_MAPPED)):
                continue
            local, remote = local[24:], remote[24:]
        found.append((ipaddress.IPv4Address(bytes.fromhex(local)[::-1]), int(lport, 16),
                      ipaddress.IPv4Address(bytes.fromhex(remote)[::-1]), int(rport, 16)))
    return found


RTM_GETROUTE, RTA_SRC, RTA_IIF, RTA_IP_PROTO, RTA_SPORT, RTA_DPORT = 26, 2, 3, 27, 28, 29
ROUTE_FACTS = frozenset({RTA_OIF, RTA_GATEWAY})


def route_get_message(dst: ipaddress.IPv4Address, src: ipaddress.IPv4Address, iif: int | None, sport: int,
                      dport: int) -> bytes:
    """RTM_GETROUTE of one TCP flow, as `ip route get DST from SRC [iif DEV] ipproto tcp sport
    S dport D` asks it: the kernel hashes the flow's 5-tuple onto one of a multipath route's
    next hops exactly as it does for the flow's packets (topology.model.FORWARDING_SYSCTLS)."""
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0)
    body += _attr(RTA_DST, dst.packed) + _attr(RTA_SRC, src.packed)
    if iif is not None:
        body += _attr(RTA_IIF, struct.pack("=i", iif))
    body += (_attr(RTA_IP_PROTO, bytes([socket.IPPROTO_TCP])) + _attr(RTA_SPORT, struct.pack("!H", sport))
             + _attr(RTA_DPORT, struct.pack("!H", dport)))
    return _message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_ACK, body)


def route_get(nl: Netlink, ns: str | None, dst: ipaddress.IPv4Address, src: ipaddress.IPv4Address,
              iif: int | None, sport: int, dport: int) -> tuple[int, ipaddress.IPv4Address | None]:
    """(output interface index, gateway or None when on-link) the namespace's routing picks
    for one TCP flow arriving on interface `iif` (None: sent from this namespace)."""
    [reply] = nl.dump(ns, route_get_message(dst, src, iif, sport, dport), f"route to {dst} in {ns or 'root'}")
    attrs = attributes(reply, 28, ROUTE_FACTS)  # after nlmsghdr + rtmsg
    gateway = attrs.get(RTA_GATEWAY)
    return struct.unpack("=i", attrs[RTA_OIF])[0], ipaddress.IPv4Address(gateway) if gateway else None
