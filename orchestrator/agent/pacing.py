"""Pacing each connection at its fair share of the link, as the cost model shares it.

Why: in a step where every rank sends to several peers and receives from several (a mesh,
PS, the groups of HiPS and BML), each connection crosses two bottlenecks, the sender's
uplink and the receiver's downlink. TCP does not reach the max-min fair split there: some
connections run ahead, others lag, and the step lasts as long as the slowest. Measured with
plain kernel sockets (no agent) on `bcube,4,1` at 20 Mbit, HiPS's first step (each NIC
sending to 3 peers and receiving from 3, 6.24 MB each): the last receiver finished at 1.30
to 1.39 × the fluid time; with every connection paced at a third of the link
(SO_MAX_PACING_RATE), at 1.014 to 1.017. The orchestrator computes each transfer's share
(cost/shares.py): its connection's share. The agent paces the connection at the largest
share among the transfers it is writing (they belong to steps that overlap), and lifts the
limit when one of them has the link to itself. Summing per-transfer parts instead, as this
did, slowed a connection as its shorter transfers ended: BML with a failed server sends a
relay's chunk in two pieces and a detoured block beside a regular chunk on one connection,
and ran at 1.43 × the model's time (bcube,4,1, 100 Mbit, bench/faults.py --bml-only).

gRPC does not hand out its sockets, so the connection's socket is found among the process's
descriptors by its peer address; it is only ever wrapped and detached, never closed, and
checked again before every change (gRPC may have reconnected on another descriptor).
Connections an earlier run left open to the same peer (a closed channel's connection lives
until its last call object is collected) are named `stale` and passed over: pacing one of
them instead left the run's own connection unpaced, and a run that re-formed after a
server crash stayed at 1.2-1.9 × the model's time per iteration (bcube,4,1 in Docker).
"""

from __future__ import annotations

import os
import socket
import stat
from typing import Callable

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
UNPACED = 2**64 - 1  # the kernel's "no limit" (~0UL): a socket's own until it is paced
# A hair under the share. TCP paces payload bytes (a write-queue segment's length, headers
# left out: a socket paced at 10 MB/s delivered 10.1 MB/s of payload), so the rate given is
# the link's payload rate (cost.Network.payload_rate) × share × SLACK. Pacing at 1.02 × the
# IP rate, as this did, sent 5.7 % more than the link carries: the bottleneck queues never
# drained (RTTs of 0.2-0.7 s on bcube,4,1 at 100 Mbit), and every new connection then spent
# seconds in slow start (a colocated PS's first iterations took 2 × the model's time). A
# hair under lets a queue that did build up (a burst, two steps that overlap) drain.
SLACK = 0.99


def _peer_of(fd: int) -> tuple | None:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        peer = sock.getpeername()
    except OSError:
        peer = None
    finally:
        sock.detach()
    if not isinstance(peer, tuple):
        return None
    # gRPC opens dual-stack sockets where IPv6 is on: an IPv4 peer reads ::ffff:a.b.c.d
    host = peer[0].removeprefix("::ffff:")
    return host, peer[1]


def _inode(fd: int) -> int | None:
    """The socket's inode number (the kernel's name for it while it lives), if `fd` is one."""
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return int(link[8:-1]) if link.startswith("socket:[") else None


def _connections(host: str, port: int) -> dict[int, int | None]:
    """{descriptor: socket inode} of this process's TCP connections to host:port."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if _peer_of(fd) == (host, port):
            found[fd] = _inode(fd)
    return found


def connected(targets) -> frozenset[int]:
    """Socket inodes of this process's connections to any of `targets` ("host:port")."""
    inodes = set()
    for target in targets:
        host, port = target.rsplit(":", 1)
        inodes.update(_connections(host, int(port)).values())
    return frozenset(inodes - {None})


def _find(host: str, port: int, stale: frozenset[int] = frozenset()) -> int | None:
    """The descriptor of this process's TCP connection to host:port that is not `stale`."""
    for fd, inode in _connections(host, port).items():
        if inode not in stale:
            return fd
    return None


def _set(fd: int, rate: int) -> None:
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate.to_bytes(8, "little"))
    finally:
        sock.detach()


class Pacer:
    """Pacing rates of this agent's outgoing connections, one per peer address.

    `link_rate`: payload bytes per second that one link carries (0: do not pace). A
    connection with the link to itself is left to TCP: paced a hair under the link, the
    pairwise steps of halving-doubling on star,8 took 1.25-1.36 × the model's time, unpaced
    1.19-1.29 (a paced connection restarting after idle cannot send its window at once)."""

    def __init__(self, link_rate: float, stale: frozenset[int] = frozenset(),
                 setter: Callable[[str, float], None] | None = None) -> None:
        self.link_rate = link_rate
        self.stale = stale  # socket inodes of connections that are not this run's
        # a transport that paces itself (rdma: no socket, no congestion control) is told the
        # rate instead, a hair under the link even when the connection has it to itself
        self.setter = setter
        self.active: dict[str, dict[object, float]] = {}  # target → {transfer key: share}
        self.fds: dict[str, int] = {}
        self.applied: dict[str, tuple[int, int | None, int]] = {}  # target → (descriptor, inode, rate) last set

    def begin(self, target: str, key: object, share: float) -> None:
        if self.link_rate:
            self.active.setdefault(target, {})[key] = share
            self._apply(target)

    def end(self, target: str, key: object) -> None:
        if self.link_rate and self.active.get(target, {}).pop(key, None) is not None and self.active[target]:
            self._apply(target)

    def _apply(self, target: str) -> None:
        share = max(self.active[target].values())
        if self.setter is not None:
            self.setter(target, min(share, 1.0) * SLACK * self.link_rate)
            return
        rate = UNPACED if share >= 1 else int(share * SLACK * self.link_rate)
        host, port = target.rsplit(":", 1)
        fd = self.fds.get(target)
        if fd is None or _peer_of(fd) != (host, int(port)):  # checked every time: gRPC may reconnect
            fd = _find(host, int(port), self.stale)
            if fd is None:  # not connected yet: the next transfer on it tries again
                self.fds.pop(target, None)
                return
            self.fds[target] = fd
        # the socket's inode as well: a reconnected socket may reuse the descriptor's number
        applied = (fd, _inode(fd), rate)
        if self.applied.get(target) == applied:
            return
        try:
            _set(fd, rate)
        except OSError:  # the connection closed under us: gRPC reconnects, we find it then
            self.fds.pop(target, None)
            return
        self.applied[target] = applied
