"""Mininet's nodes on a lab split over hosts (emulation/mininet_attach.RemoteNode): every
command line Mininet sends a node runs through the lab's `exec` (on the node's host) and
comes back with Mininet's prompt sentinel, so `node.cmd()`, the CLI's `NODE cmd` and
`pingall` work without a shell on this machine. The lab here is a stand-in that records the
calls; the hosts tier runs the real CLI on a split lab."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab

mininet_attach = pytest.importorskip("orchestrator.emulation.mininet_attach", reason="Mininet is not installed")


@dataclass
class Done:
    stdout: str
    stderr: str = ""
    returncode: int = 0


class SplitStandIn:
    """What attach asks of a split lab: its topology, and exec (no command_prefix). Its exec
    runs the line here, in a plain shell (no namespace), except pings: those are answered,
    never sent."""

    def __init__(self) -> None:
        self.topology = from_lab(lab_from_argument("star,3"))
        self.calls: list[tuple[str, list[str]]] = []
        self.broken = False

    def exec(self, node: str, argv: list[str], timeout=None) -> Done:
        self.calls.append((node, argv))
        if self.broken:
            raise RuntimeError("the engine lost host x")
        if "ping -c1" in argv[-1]:
            return Done("1 packets transmitted, 1 received, 0% packet loss\n")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return Done(done.stdout, done.stderr, done.returncode)


def test_a_remote_nodes_commands_run_on_its_host_line_by_line():
    lab = SplitStandIn()
    net = mininet_attach.attach(lab)
    try:
        h0 = net.get("h0")
        assert isinstance(h0, mininet_attach.RemoteNode)
        assert h0.cmd("echo hi") == "hi\n"
        assert h0.cmd("echo warn >&2") == "warn\n"  # stderr with stdout, as a shell's terminal shows it
        assert h0.cmd("printf '\\377ok\\n'") == "?ok\n"  # what is not printable cannot break the CLI
        assert len(h0.cmd("yes")) == mininet_attach.LINE_BYTES  # cut off, and the line ends
        assert "background jobs" in h0.cmd("sleep 100 &")
        assert all(node == "h0" for node, _ in lab.calls)
        assert net.pingAll() == 0.0  # every pair answered
        pinged = {(node, argv[-1]) for node, argv in lab.calls if "ping -c1" in argv[-1]}
        assert len(pinged) == 6
        lab.broken = True  # the host is lost: said, and the node still answers the next line
        assert "RuntimeError: the engine lost host x" in h0.cmd("echo hi")
        lab.broken = False
        assert h0.cmd("echo again") == "again\n"
    finally:
        for node in net.values():
            node.terminate()
    assert all(node.shell is None for node in net.values())
