"""agent.pacing on real loopback sockets: the connection to a peer address is found among
the process's descriptors and its SO_MAX_PACING_RATE follows the shares being written."""

from __future__ import annotations

import socket

import pytest

from orchestrator.agent.pacing import SLACK, SO_MAX_PACING_RATE, UNPACED, Pacer, connected

LINK = 12_000_000.0  # payload bytes/s of a link


def pacing_of(sock: socket.socket) -> int:
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8), "little")


@pytest.fixture
def connection():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    host, port = server.getsockname()
    yield client, f"{host}:{port}"
    for sock in (client, accepted, server):
        sock.close()


def test_the_rate_follows_the_shares_being_written(connection):
    client, target = connection
    pacer = Pacer(LINK)
    pacer.begin(target, "a", 0.25)
    assert pacing_of(client) == int(0.25 * SLACK * LINK)
    pacer.begin(target, "b", 0.5)  # transfers of overlapping steps: the larger share
    assert pacing_of(client) == int(0.5 * SLACK * LINK)
    pacer.end(target, "b")
    assert pacing_of(client) == int(0.25 * SLACK * LINK)
    pacer.begin(target, "c", 1.0)  # one transfer with the link to itself lifts the limit
    assert pacing_of(client) == UNPACED


def test_a_connection_keeps_its_share_while_any_of_its_transfers_runs(connection):
    """Two transfers of one step on one connection carry the connection's share (cost/shares):
    the rate holds when the shorter ends, as the model's connection keeps its rate."""
    client, target = connection
    pacer = Pacer(LINK)
    for i in range(2):
        pacer.begin(target, i, 1 / 3)
    assert pacing_of(client) == int(1 / 3 * SLACK * LINK)
    pacer.end(target, 0)
    assert pacing_of(client) == int(1 / 3 * SLACK * LINK)


def test_no_link_rate_no_pacing(connection):
    client, target = connection
    Pacer(0.0).begin(target, "a", 0.25)
    assert pacing_of(client) == UNPACED


def test_a_target_without_a_connection_is_left_alone_and_found_later():
    pacer = Pacer(LINK)
    server = socket.create_server(("127.0.0.1", 0))
    host, port = server.getsockname()
    target = f"{host}:{port}"
    pacer.begin(target, "a", 0.5)  # nothing connected yet: no error, nothing applied
    assert target not in pacer.fds
    client = socket.create_connection((host, port))
    try:
        pacer.begin(target, "b", 0.25)
        assert pacing_of(client) == int(0.5 * SLACK * LINK)
    finally:
        client.close()
        server.close()


def test_a_reconnected_peer_is_found_again(connection):
    client, target = connection
    pacer = Pacer(LINK)
    pacer.begin(target, "a", 0.25)
    host, port = target.rsplit(":", 1)
    stale = pacer.fds[target]
    client.close()  # gRPC reconnecting: the old descriptor no longer leads to the peer
    again = socket.create_connection((host, int(port)))
    try:
        pacer.begin(target, "b", 0.25)  # the same rate, maybe the same descriptor number: set again
        assert pacing_of(again) == int(0.25 * SLACK * LINK)
        assert pacer.fds[target] == again.fileno() or stale == again.fileno()
    finally:
        again.close()


def test_a_dual_stack_connection_to_an_ipv4_peer_is_found():
    # what gRPC opens where IPv6 is on: an AF_INET6 socket whose peer reads ::ffff:127.0.0.1
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel: gRPC opens plain IPv4 sockets then")
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    port = server.getsockname()[1]
    client = socket.socket(socket.AF_INET6)
    try:
        client.connect(("::ffff:127.0.0.1", port))
        Pacer(LINK).begin(f"127.0.0.1:{port}", "a", 0.5)
        assert pacing_of(client) == int(0.5 * SLACK * LINK)
    finally:
        client.close()
        server.close()


def test_a_stale_connection_to_the_same_peer_is_passed_over(connection):
    # an earlier run's connection to the same peer address, still open (a closed gRPC
    # channel's connection lives until its calls are collected): the run's own one is paced
    old, target = connection
    host, port = target.rsplit(":", 1)
    stale = connected([target])
    new = socket.create_connection((host, int(port)))
    try:
        assert connected([target]) > stale  # the new connection is not stale
        pacer = Pacer(LINK, stale)
        pacer.begin(target, "a", 0.25)
        assert pacing_of(new) == int(0.25 * SLACK * LINK)
        assert pacing_of(old) == UNPACED
    finally:
        new.close()


def test_without_stale_connections_named_the_first_connection_found_is_paced(connection):
    # what the agent did before it named them: one of the two, which need not be the run's
    old, target = connection
    host, port = target.rsplit(":", 1)
    new = socket.create_connection((host, int(port)))
    try:
        Pacer(LINK).begin(target, "a", 0.25)
        assert sorted([pacing_of(old), pacing_of(new)]) == [int(0.25 * SLACK * LINK), UNPACED]
    finally:
        new.close()
