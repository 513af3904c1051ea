"""Mininet's nodes on a lab split over hosts (emulation/mininet_attach.RemoteNode): every
command line Mininet sends a node runs through the lab's `exec` (on the node's host) and
comes back with Mininet's prompt sentinel, so `node.cmd()`, the CLI's `NODE cmd` and
`pingall` work without a shell on this machine. The lab here is a stand-in that records the
calls; the hosts tier runs the real CLI on a split lab."""

from __future__ import annotations

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
    """What attach asks of a split lab: its topology, and exec (no command_prefix)."""

    def __init__(self) -> None:
        self.topology = from_lab(lab_from_argument("star,3"))
        self.calls: list[tuple[str, list[str]]] = []

    def exec(self, node: str, argv: list[str], timeout=None) -> Done:
        self.calls.append((node, argv))
        line = argv[-1]
        if line.startswith("ping -c1"):
            return Done("1 packets transmitted, 1 received, 0% packet loss\n")
        return Done(f"{node}: {line}\n", "warning\n" if "warn" in line else "")


def test_a_remote_nodes_commands_run_on_its_host_line_by_line():
    lab = SplitStandIn()
    net = mininet_attach.attach(lab)
    try:
        h0 = net.get("h0")
        assert isinstance(h0, mininet_attach.RemoteNode)
        assert h0.cmd("echo hi") == "h0: echo hi\n"
        assert h0.cmd("say warn") == "h0: say warn\nwarning\n"  # stderr follows stdout, as a shell's would
        assert ("h0", ["sh", "-c", "echo hi"]) in lab.calls
        assert all(node == "h0" for node, _ in lab.calls)
        assert net.pingAll() == 0.0  # every pair answered
        pinged = {(node, argv[-1].split()[-1]) for node, argv in lab.calls if argv[-1].startswith("ping -c1")}
        assert len(pinged) == 6
    finally:
        for node in net.values():
            node.terminate()
    assert all(node.shell is None for node in net.values())
