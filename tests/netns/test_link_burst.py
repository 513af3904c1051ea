"""What an idle link lets through at once: its HTB bucket, 1 ms of the link's own line time
(emulation/kernel.py bucket_bytes), and a message sent after idle takes the time the cost
model (fluid) gives it. The bucket used to be at least 64 KiB whatever the rate: at 50 Mbit
that is 10.5 ms of line time, and a 256 KiB message after idle took 0.76 × its serialisation
time. (What TCP writes as one super-packet still crosses at once: kernel.py BIG_GSO_BYTES.)
Lab: ex-burst."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time

import pytest

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate

FAST = 200_000_000  # h2's link, in a 50 Mbit star

RECEIVER = r"""
import socket, sys
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", 9009)); listener.listen(1)
conn, _ = listener.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sizes = [int(n) for n in sys.argv[1:]]
for size in sizes:
    view = memoryview(bytearray(size))
    got = 0
    while got < size:
        n = conn.recv_into(view[got:])
        if not n:
            sys.exit(1)
        got += n
    conn.sendall(b"x")
"""

SENDER = r"""
import json, socket, sys, time
conn = socket.create_connection((sys.argv[1], 9009)); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for size in [int(n) for n in sys.argv[2:]]:
    time.sleep(0.1)  # idle: the buckets fill again
    start = time.perf_counter(); conn.sendall(bytes(size)); conn.recv(1)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


@pytest.fixture(scope="module")
def lab():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument
    from orchestrator.spec.lab import LabSpec

    data = lab_from_argument("star,3", name="ex-burst", **{"links.bandwidth": "50Mbit", "servers.runtime": "netns"})
    data = data.model_dump(mode="json")
    data["links"]["overrides"] = [{"link": "h2-sw", "bandwidth": "200Mbit"}]
    with Lab.up(LabSpec.model_validate(data)) as live:
        yield live


def _shown(lab, node: str, *command: str) -> str:
    return subprocess.run(lab.command_prefix(node) + list(command), capture_output=True, text=True, check=True,
                          timeout=30).stdout


def test_each_link_end_has_its_rates_bucket(lab):
    from orchestrator.emulation.kernel import bucket_bytes

    links = lab.spec.links
    for node, rate in (("h0", links.bandwidth), ("h2", FAST)):
        bucket = bucket_bytes(rate, links.mtu)
        nic = next(end.interface for link in lab.topology.links for end in (link.a, link.b) if end.node == node)
        shown = _shown(lab, node, "tc", "class", "show", "dev", nic)
        assert re.search(rf"\brate {rate // 1_000_000}Mbit\b.* burst {bucket}b", shown), shown
    assert bucket_bytes(links.bandwidth, 1500) == 6250 and bucket_bytes(FAST, 1500) == 25_000  # 1 ms of each
    assert (bucket_bytes(10_000_000, 1500), bucket_bytes(10_000_000, 9000)) == (3028, 18_028)  # two frames


def test_a_message_after_idle_takes_the_time_the_model_gives_it(lab):
    sizes = [262144, 1048576]
    repeats = 9
    receiver = lab.popen("h1", [sys.executable, "-c", RECEIVER, *[str(s) for s in sizes * repeats]])
    try:
        time.sleep(0.3)  # its listener up
        sender = lab.popen("h0", [sys.executable, "-c", SENDER, str(lab.topology.address_of("h1")),
                                  *[str(s) for s in sizes * repeats]], stdout=subprocess.PIPE, text=True)
        out, _ = sender.communicate(timeout=120)
        assert sender.returncode == 0
    finally:
        receiver.kill()
        receiver.wait()
    times = json.loads(out)
    network = Network.from_links(lab.spec.links)
    nodes = [s.name for s in lab.topology.servers]
    for i, size in enumerate(sizes):
        measured = statistics.median(times[i::len(sizes)][1:])  # the first opens the window
        schedule = Schedule("one message", len(nodes), size // 4)
        schedule.add_step([Transfer(0, 1, 0, size // 4, "copy")])
        predicted = simulate(Routes(lab.topology), [(Partition(0, schedule.size, 0), schedule)], nodes,
                             network).seconds
        serialised = size / network.payload_rate
        print(f"{size} B after idle over 50 Mbit: {measured * 1e3:.2f} ms, predicted {predicted * 1e3:.2f} ms "
              f"({serialised * 1e3:.2f} ms at the link's rate)")
        assert 0.9 <= measured / predicted <= 1.1, (size, measured, predicted)
