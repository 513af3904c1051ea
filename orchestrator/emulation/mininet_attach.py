"""Mininet objects attached to a live lab: the lab *is* a Mininet network to its users.

`testbed up` builds with netlink (much faster than Mininet's own build), then this module
hands out Mininet nodes whose shells enter the lab's existing namespaces or containers, so
Mininet's CLI (`pingall`, `h00 ping h33`, `link h00 l0s0 down`, `xterm`…) and scripts using
`node.cmd()` work on it unchanged. Nothing here creates or deletes network objects.

On a lab split over hosts (hosts/split.py) a node's shell is not on this machine: its node
is a RemoteNode, whose "shell" runs each command line it is sent on the node's host
(`lab.exec`, a task of the host's worker) and answers with its output and Mininet's prompt
sentinel. `pingall`, `h00 ping -c1 h11`, `h00 ip route`, `link …` and scripts' `node.cmd()`
work; a line is one `sh -c` there, bounded (LINE_SECONDS, then SIGINT; LINE_BYTES of
output), so shell state (cd, variables) does not carry from one line to the next, a
background job (`&`) is refused, and `xterm` has no terminal to open here.

`link A B down|up` is the one command that changes the lab: Mininet's own version only
flips the interfaces, leaving relays without the routes the kernel dropped (BCube's pingall
stuck at 11/12 after down and up), so it goes through `net.link_status(a, b, up)`, which
the CLI points at the fault path and which defaults to `Lab.set_link`.
"""

from __future__ import annotations

import os
import re
import shlex
import threading

from mininet.link import Intf, Link
from mininet.log import error
from mininet.net import Mininet
from mininet.node import Node


class AttachedNode(Node):
    """A Mininet node whose shell runs in an existing namespace (or a container's)."""

    def __init__(self, name: str, prefix: list[str], **params) -> None:
        self.prefix = prefix
        super().__init__(name, inNamespace=True, **params)

    def _popen(self, cmd, **params):
        # Mininet starts its shell with `mnexec -cdn …`, which would make a new namespace;
        # enter ours instead, detached from our terminal as mnexec -d would be.
        if cmd and cmd[0] == "mnexec" and self.shell is None:
            cmd = self.prefix + list(cmd[2:])
            params["start_new_session"] = True
        return super()._popen(cmd, **params)

    def addIntf(self, intf, port=None, moveIntfFn=None):  # noqa: N802,N803 (Mininet's names)
        # the interface already lives in this node's namespace: never move it
        return super().addIntf(intf, port=port, moveIntfFn=lambda *args: None)


SENTINEL = chr(127)  # Mininet's prompt: the end of a command's output


class RemoteNode(AttachedNode):
    """A node of a split lab: its commands run on its host, one `sh -c` per line (see the
    module's docstring), through a pair of pipes Mininet reads and writes as a shell's."""

    def __init__(self, name: str, lab, **params) -> None:
        self.lab = lab
        super().__init__(name, [], **params)

    def startShell(self, mnopts=None) -> None:  # noqa: N802 (Mininet's name)
        import select

        commands_r, commands_w = os.pipe()
        output_r, self._output_w = os.pipe()
        self.stdin, self.stdout = os.fdopen(commands_w, "w"), os.fdopen(output_r, "r")
        self._commands = commands_r
        self.shell, self.pid, self.execed, self.lastCmd, self.lastPid, self.readbuf = self, os.getpid(), False, None, None, ""
        self.pollOut = select.poll()
        self.pollOut.register(self.stdout)
        self.outToNode[self.stdout.fileno()] = self
        self.inToNode[self.stdin.fileno()] = self
        self._relay = threading.Thread(target=self._serve, name=f"shell-{self.name}", daemon=True)
        self._relay.start()
        self.waiting = False

    def _serve(self) -> None:
        """Each line Mininet writes, run on the node's host; its output, then the sentinel.
        This thread owns both of its pipe ends and closes them when Mininet closes the node."""
        pending = b""
        try:
            while True:
                data = os.read(self._commands, 65536)
                if not data:  # Mininet closed the node
                    return
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    text = line.decode(errors="replace").replace(chr(3), "").strip()
                    answer = ""
                    try:
                        answer = self._run(text) if text else ""
                    finally:  # whatever happened, Mininet gets its prompt back
                        _write_all(self._output_w, (answer + SENTINEL).encode())
        except OSError:
            return
        finally:
            for fd in (self._commands, self._output_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _run(self, line: str) -> str:
        """One line on the node's host, bounded: LINE_SECONDS, then SIGINT (as Ctrl-C would
        stop it in a shell); LINE_BYTES of output (a `yes` is cut off); anything that is not
        printable ASCII shown as `?`. A background job would keep its output open: refused."""
        alone = BACKGROUND_PID.sub("", line).rstrip()  # Mininet asks a backgrounded command's pid so
        if alone.endswith("&") and not alone.endswith("&&"):
            return "background jobs (&) do not run on a split lab's nodes: each line ends with its command\n"
        # timeout signals the line's whole process group (a job it started too), then kills it
        bounded = (f"timeout -s INT -k 5 {LINE_SECONDS} sh -c {shlex.quote(line)} 2>&1 | head -c {LINE_BYTES} | "
                   "tr -c '\\11\\12\\15\\40-\\176' '?'")
        try:
            done = self.lab.exec(self.name, ["sh", "-c", bounded], LINE_SECONDS + 15)
        except Exception as exc:  # noqa: BLE001 - a host lost, the engine gone: said, and the CLI goes on
            return f"{self.name}: {type(exc).__name__}: {exc}\n"
        return (done.stdout or "") + (done.stderr or "")

    def pexec(self, *args, **kwargs):
        """Mininet's out-of-band command (updateIP, link status): on the node's host too."""
        command = args[0] if len(args) == 1 else " ".join(str(a) for a in args)
        argv = command if isinstance(command, list) else ["sh", "-c", command]
        done = self.lab.exec(self.name, argv, LINE_SECONDS)
        return done.stdout or "", done.stderr or "", done.returncode

    def popen(self, *args, **kwargs):
        raise NotImplementedError(f"{self.name} is on another host: a process here cannot run in it "
                                  "(use a command line, which runs there)")

    def poll(self):  # what Mininet asks of its shell process: still running
        return None

    def terminate(self) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Close Mininet's ends; the relay thread closes its own when it sees the end."""
        if self.shell is None:
            return
        self.shell = None
        for closing in (self.stdin.close, self.stdout.close):
            try:
                closing()
            except OSError:
                pass


LINE_SECONDS = 60  # a command line on a remote node: then SIGINT (and SIGKILL 5 s on)
LINE_BYTES = 1 << 20  # of its output, at most
BACKGROUND_PID = re.compile(r'\s*printf "\\001%d\\012" \$!\s*$')  # what sendCmd adds after a '&'


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class AttachedIntf(Intf):
    """An existing interface; uses `ip` because lab images carry no ifconfig."""

    def __init__(self, name: str, node: Node, address=None) -> None:
        super().__init__(name, node=node, up=None)  # up=None: do not touch it now
        if address is not None:
            self.ip, self.prefixLen = str(address.ip), address.network.prefixlen

    def updateIP(self):  # noqa: N802 (Mininet's name): the lab set it; no ifconfig on its images
        return self.ip

    def ifconfig(self, *args):
        if args and args[0] in ("up", "down"):
            return self.cmd("ip", "link", "set", "dev", self.name, args[0])
        return self.cmd("ip", "addr", "show", "dev", self.name)


class AttachedLink(Link):
    """The pair of interfaces of an existing veth link (Mininet's Link would create one)."""

    def __init__(self, intf1: Intf, intf2: Intf) -> None:  # noqa: D107 - no super(): no creation
        self.intf1, self.intf2 = intf1, intf2
        intf1.link = intf2.link = self

    def stop(self):
        pass

    def delete(self):
        pass


class AttachedNet(Mininet):
    """Mininet's network over a live lab, whose `link` command changes the lab's links
    through `link_status(a, b, up)` rather than flipping the interfaces behind its back."""

    def __init__(self, lab, **params) -> None:
        super().__init__(**params)
        self.link_status = lambda a, b, up: lab.set_link(a, b, up)

    def configLinkStatus(self, src: str, dst: str, status: str) -> None:  # noqa: N802 (Mininet's name)
        if src not in self.nameToNode or dst not in self.nameToNode:
            error(f"src or dst not in network: {src} {dst}\n")
            return
        if status not in ("up", "down"):
            error(f"unknown link status {status!r}: up or down\n")
            return
        from orchestrator.errors import TestbedError

        try:
            self.link_status(src, dst, status == "up")
        except TestbedError as exc:
            error(f"{exc}\n")


def attach(lab) -> Mininet:
    """A Mininet network for a live lab, nodes attached, nothing built."""
    Mininet.inited = True  # skip Mininet.init(): it raises host-wide limits and sysctls
    net = AttachedNet(lab, topo=None, build=False, controller=None)
    net.built = True
    nodes = {}
    local = hasattr(lab, "command_prefix")  # a split lab's nodes have no shell on this machine
    for node in lab.topology.nodes.values():
        attached = AttachedNode(node.name, lab.command_prefix(node.name)) if local else RemoteNode(node.name, lab)
        for port, iface in enumerate(i for i in node.interfaces.values() if not i.is_bridge):
            AttachedIntf(iface.name, attached, iface.address)
        nodes[node.name] = attached
        (net.hosts if node.is_server else net.switches).append(attached)
        net.nameToNode[node.name] = attached
    for link in lab.topology.links:
        a, b = nodes[link.a.node], nodes[link.b.node]
        net.links.append(AttachedLink(a.nameToIntf[link.a.interface], b.nameToIntf[link.b.interface]))
    return net
