"""The one place that talks to the kernel's network stack: namespaces, links, tc, routes.

Speed matters here (a fat-tree k=8 is 208 namespaces and 384 links), so nothing forks:
namespaces are made the way `ip netns add` makes them (unshare + bind mount under
/run/netns, so iproute2 and everyone else see them), but from a Python thread; and each
namespace gets one netlink socket opened from inside it, through which pyroute2 sends
every request for that namespace. Veth pairs are created with both ends directly in their
namespaces, so a lab never puts a data-plane interface name into the root namespace.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import ifinfbase

from orchestrator.errors import EmulationError

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED = 4096, 16384, 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")

# Link attributes 62–64 of linux/if_link.h; pyroute2 0.9 names them only up to 61. Naming
# the IPv4 GSO/GRO limits (Linux 6.3, "BIG TCP" for IPv4) lets link requests carry them.
# It must happen before pyroute2 builds its first link message, i.e. at this import, and on
# the base of both link messages and a veth's peer.
_LATER_LINK_ATTRIBUTES = (("IFLA_DEVLINK_PORT", "hex"), ("IFLA_GSO_IPV4_MAX_SIZE", "uint32"),
                          ("IFLA_GRO_IPV4_MAX_SIZE", "uint32"))
if len(ifinfbase.nla_map) == 62 and ifinfbase.nla_map[61][0] == "IFLA_ALLMULTI":
    ifinfbase.nla_map = (*ifinfbase.nla_map, *_LATER_LINK_ATTRIBUTES)

# Super-packets a lab's veths accept (BIG TCP). With 64 KiB ones (the default) the kernel's
# per-packet work was ~a third of a CPU-bound ring's CPU (8 agents on 2 cores); with these
# the machine went from ~90 % to ~72 % busy. 512 KiB ones were slower. Qdiscs still charge
# every MTU-sized segment's headers, so shaped rates are unchanged.
BIG_GSO_BYTES = 256 * 1024


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
    inodes = set()
    for name in names:
        try:
            inodes.add(os.stat(netns_path(name)).st_ino)
        except FileNotFoundError:
            continue
    if not inodes:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    found.append(int(entry))
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
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


def in_workers(
    items: Sequence[T],
    work: Callable[["Netlink", T], None],
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> None:
    """Call `work(nl, item)` for every item, spread over forked workers (one per core), each
    with its own netlink sockets. pyroute2 spends ~0.5 ms of Python per request, so a big lab
    is CPU-bound in this process; workers use every core. Items given to one worker are
    independent of the others'. A worker's error is raised here as EmulationError; workers
    die with this process."""
    workers = min(workers or os.cpu_count() or 1, len(items))
    if workers <= 1:
        with Netlink() as nl:
            for done, item in enumerate(items, 1):
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
    while chunk := os.read(ticks_r, 4096):  # ends when every worker has exited
        done += len(chunk)
        if progress:
            progress(done, len(items))
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


class Netlink:
    """One pyroute2 socket per namespace, each opened from inside its namespace.

    The root namespace is the key None. Open many at once with `open()` (one thread).
    """

    def __init__(self) -> None:
        self._sockets: dict[str | None, IPRoute] = {}
        self._ns_fds: dict[str, int] = {}
        self._indexes: dict[tuple[str | None, str], int] = {}
        self._dumped: set[str | None] = set()

    def __enter__(self) -> "Netlink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, names: Iterable[str | None]) -> None:
        wanted = [n for n in dict.fromkeys(names) if n not in self._sockets]
        if None in wanted:
            self._sockets[None] = IPRoute()
            wanted.remove(None)
        if not wanted:
            return

        def make(_: str) -> int:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE).detach()

        for name, fd in in_namespaces(wanted, make).items():
            self._sockets[name] = IPRoute(fileno=fd)

    def __getitem__(self, name: str | None) -> IPRoute:
        if name not in self._sockets:
            self.open([name])
        return self._sockets[name]

    def ns_fd(self, name: str) -> int:
        if name not in self._ns_fds:
            self._ns_fds[name] = os.open(netns_path(name), os.O_RDONLY)
        return self._ns_fds[name]

    def index(self, ns: str | None, ifname: str) -> int:
        """Interface index by name: one dump per namespace, then one lookup per new name
        (a dump per miss would make building the management network quadratic)."""
        key = (ns, ifname)
        if key not in self._indexes:
            if ns not in self._dumped:
                self.refresh(ns)
            else:
                found = self[ns].link_lookup(ifname=ifname)
                if found:
                    self._indexes[key] = found[0]
        try:
            return self._indexes[key]
        except KeyError:
            raise EmulationError(f"no interface {ifname} in namespace {ns or 'root'}") from None

    def refresh(self, ns: str | None) -> None:
        """Learn every interface index of a namespace with one dump."""
        for msg in self[ns].get_links():
            self._indexes[(ns, msg.get_attr("IFLA_IFNAME"))] = msg["index"]
        self._dumped.add(ns)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        for fd in self._ns_fds.values():
            os.close(fd)
        self._sockets.clear()
        self._ns_fds.clear()
        self._indexes.clear()
        self._dumped.clear()


def _netlink(what: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except NetlinkError as exc:
        raise EmulationError(f"{what}: {os.strerror(exc.code)}") from None


# -- links ------------------------------------------------------------------------------------
def add_veth(
    nl: Netlink, a_ns: str | None, a_if: str, b_ns: str | None, b_if: str, txqlen: int,
    group: int | None = None, mtu: int | None = None, gso_bytes: int | None = None,
) -> None:
    """A veth pair with each end created straight inside its namespace, the first end up.

    `group` puts the first end in a netdev group, which one call deletes (see delete_group).
    `mtu` applies to both ends (a bridge takes the smallest of its ports'), and so does
    `gso_bytes`, the largest super-packet for IPv4 and other traffic (see BIG_GSO_BYTES).
    """
    main = {"ifname": a_if, "kind": "veth", "state": "up", "txqlen": txqlen}
    if group is not None:
        main["group"] = group
    peer = {"ifname": b_if, "txqlen": txqlen}
    if mtu is not None:
        main["mtu"] = peer["mtu"] = mtu
    if gso_bytes is not None:
        for end in (main, peer):
            end.update(gso_max_size=gso_bytes, gro_max_size=gso_bytes,
                       gso_ipv4_max_size=gso_bytes, gro_ipv4_max_size=gso_bytes)
    if a_ns is not None:
        main["net_ns_fd"] = nl.ns_fd(a_ns)
    if b_ns is not None:
        peer["net_ns_fd"] = nl.ns_fd(b_ns)
    _netlink(f"create link {a_if}–{b_if}", lambda: nl[None].link("add", peer=peer, **main))


def set_up(nl: Netlink, ns: str | None, ifname: str) -> None:
    index = nl.index(ns, ifname)
    _netlink(f"bring up {ifname}", lambda: nl[ns].link("set", index=index, state="up"))


def set_link_state(nl: Netlink, ns: str | None, ifname: str, up: bool) -> None:
    index = nl.index(ns, ifname)
    state = "up" if up else "down"
    _netlink(f"set {ifname} {state}", lambda: nl[ns].link("set", index=index, state=state))


def add_bridge(nl: Netlink, ns: str | None, name: str, group: int | None = None) -> None:
    """A bridge without STP (our L2 segments are trees) that forwards at once."""
    extra = {"group": group} if group is not None else {}
    _netlink(
        f"create bridge {name}",
        lambda: nl[ns].link(
            "add", ifname=name, kind="bridge", state="up", br_stp_state=0, br_forward_delay=0, **extra
        ),
    )


def enslave(nl: Netlink, ns: str | None, ifname: str, bridge: str, isolated: bool = False) -> None:
    index, master = nl.index(ns, ifname), nl.index(ns, bridge)
    _netlink(f"add {ifname} to {bridge}", lambda: nl[ns].link("set", index=index, master=master))
    if isolated:  # isolated ports reach the bridge itself, never each other
        _netlink(f"isolate {ifname}", lambda: nl[ns].brport("set", index=index, isolated=1))


def add_address(
    nl: Netlink, ns: str | None, ifname: str, address: ipaddress.IPv4Interface, congestion: str | None = None
) -> None:
    index = nl.index(ns, ifname)
    _netlink(
        f"address {address} on {ifname}",
        lambda: nl[ns].addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen),
    )
    if congestion:
        set_connected_congestion(nl, ns, ifname, address, congestion)


def set_connected_congestion(
    nl: Netlink, ns: str | None, ifname: str, address: ipaddress.IPv4Interface, congestion: str
) -> None:
    """(Re)write the route the kernel makes for `address`'s subnet with a TCP congestion
    control: a route's `congctl` chooses it for connections over that route. A namespace's
    own default can only be one its kernel allows unprivileged sockets, a route's any."""
    index = nl.index(ns, ifname)
    request = {
        "dst": str(address.network), "oif": index, "prefsrc": str(address.ip), "scope": 253, "proto": 2,
        "metrics": {"cc_algo": congestion},
    }
    _netlink(f"route {address.network} congctl {congestion} in {ns}", lambda: nl[ns].route("replace", **request))


def add_route(
    nl: Netlink,
    ns: str | None,
    prefix: ipaddress.IPv4Network,
    nexthops: Sequence[tuple[str, ipaddress.IPv4Address | None]],
    replace: bool = False,
    congestion: str | None = None,
) -> None:
    """A static route; several (dev, via) pairs make an ECMP group. `replace` overwrites
    (and restores) an existing route, e.g. after its interface was down. `congestion`: the
    TCP congestion control of connections over it."""
    def hop(dev: str, via) -> dict:
        spec = {"oif": nl.index(ns, dev)}
        if via is not None:
            spec["gateway"] = str(via)
        return spec

    if len(nexthops) == 1:
        request = {"dst": str(prefix), **hop(*nexthops[0])}
    else:
        request = {"dst": str(prefix), "multipath": [hop(d, v) for d, v in nexthops]}
    if congestion:
        request["metrics"] = {"cc_algo": congestion}
    command = "replace" if replace else "add"
    _netlink(f"route {prefix} in {ns}", lambda: nl[ns].route(command, **request))


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
) -> None:
    """Egress shaping: HTB at `rate_bps`, under it a `queue`-packet FIFO, or netem when the
    link has delay, jitter or loss (netem then holds the queue limit)."""
    index = nl.index(ns, ifname)
    ipr = nl[ns]
    rate_bytes = rate_bps / 8
    # A burst of ~1 ms at line rate (and at least a TSO super-packet) keeps HTB near the
    # configured rate at Gbit speeds; a small quantum keeps it from complaining.
    burst = max(int(rate_bytes / 1000), 65536 + 1514)
    _netlink(f"shape {ifname}", lambda: ipr.tc("add", "htb", index, HTB_ROOT, default=1))
    _netlink(
        f"shape {ifname}",
        lambda: ipr.tc(
            "add-class", "htb", index, HTB_CLASS, parent=HTB_ROOT,
            rate=f"{rate_bps}bit", ceil=f"{rate_bps}bit", burst=burst, cburst=burst, quantum=1514 * 8,
        ),
    )
    if delay_s or jitter_s or loss_percent:
        options = {"limit": queue}
        if delay_s:
            options["delay"] = int(delay_s * 1e6)  # microseconds
        if jitter_s:
            options["jitter"] = int(jitter_s * 1e6)
        if loss_percent:
            options["loss"] = loss_percent
        _netlink(f"netem on {ifname}", lambda: ipr.tc("add", "netem", index, LEAF, parent=HTB_CLASS, **options))
    else:
        _netlink(f"queue on {ifname}", lambda: ipr.tc("add", "pfifo", index, LEAF, parent=HTB_CLASS, limit=queue))


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
    """name → {state, up, carrier, mtu, gso_ipv4_bytes, rx_bytes, tx_bytes, rx_packets,
    tx_packets} of a namespace."""
    out = {}
    for msg in nl[ns].get_links():
        stats = msg.get_attr("IFLA_STATS64") or {}
        out[msg.get_attr("IFLA_IFNAME")] = {
            "state": msg.get_attr("IFLA_OPERSTATE"),
            "up": bool(msg["flags"] & 1),
            "carrier": bool(msg.get_attr("IFLA_CARRIER")),
            "mtu": msg.get_attr("IFLA_MTU"),
            "gso_ipv4_bytes": msg.get_attr("IFLA_GSO_IPV4_MAX_SIZE"),
            "rx_bytes": stats.get("rx_bytes", 0),
            "tx_bytes": stats.get("tx_bytes", 0),
            "rx_packets": stats.get("rx_packets", 0),
            "tx_packets": stats.get("tx_packets", 0),
        }
    return out


def delete_link(nl: Netlink, ns: str | None, ifname: str) -> bool:
    """Delete an interface if it exists (its veth peer goes with it). Idempotent."""
    found = nl[ns].link_lookup(ifname=ifname)
    if not found:
        return False
    try:
        nl[ns].link("del", index=found[0])
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:
            raise EmulationError(f"delete {ifname}: {os.strerror(exc.code)}") from None
        return False
    return True


def delete_group(nl: Netlink, ns: str | None, group: int) -> None:
    """Delete every interface of a netdev group in one batched kernel call.

    Deleting veths one by one costs an RCU grace period each (~20 ms); a group goes at once.
    """
    try:
        nl[ns].link("del", group=group)
    except NetlinkError as exc:
        if exc.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
            raise EmulationError(f"delete link group {group}: {os.strerror(exc.code)}") from None


def root_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address or route in."""
    networks = []
    with IPRoute() as ipr:
        for msg in ipr.get_addr(family=socket.AF_INET):
            networks.append(
                ipaddress.IPv4Network(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}", strict=False)
            )
        for msg in ipr.get_routes(family=socket.AF_INET, table=254):
            dst = msg.get_attr("RTA_DST")
            if dst:
                networks.append(ipaddress.IPv4Network(f"{dst}/{msg['dst_len']}", strict=False))
    return networks
