"""The host engine (issue 31, orchestrator/hosts/dask_engine.py) over hosts faked as
namespaces: a dask scheduler on this machine's end of the underlay, one worker per host in
that host's namespace, mutual TLS. Tasks run where they are pinned; a party without the lab's
certificate is refused; a killed worker's host is named, and work sent there fails naming it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from orchestrator.hosts.engine import HostLost
from orchestrator.hosts.fake import engine_on_fake_hosts, underlay_addresses
from orchestrator.hosts.tls import credentials

TTL = "4s"  # the engine's own is longer (dask_engine.WORKER_TTL): a test need not wait it out


@pytest.fixture
def engine(tmp_path):
    with engine_on_fake_hosts(tmp_path, ["x", "y"], worker_ttl=TTL) as (connected, hosts, workers, address):
        yield connected, hosts, workers, address, tmp_path


def test_tasks_run_on_the_host_they_are_pinned_to(engine):
    connected, hosts, _, _, _ = engine
    assert connected.hosts() == ["x", "y"]
    for host in ("x", "y"):
        seen = connected.run_on(host, underlay_addresses)
        assert str(hosts.address(host)) in seen
        assert not {str(hosts.address(other)) for other in hosts.names if other != host} & set(seen)


def refused(address: str, security=None) -> bool:
    """Whether the scheduler at `address` turns this party away."""
    from distributed import Client

    try:
        client = Client(address, security=security, timeout=3, set_as_default=False)
    except (OSError, TimeoutError):
        return True
    client.close()
    return False


def test_only_holders_of_the_labs_certificate_are_served(engine):
    _, _, _, address, tmp_path = engine
    assert refused(address.replace("tls://", "tcp://"))  # no TLS at all
    assert refused(address, credentials(tmp_path / "other-ca", "client").security())  # another CA's certificate
    assert not refused(address, credentials(tmp_path / "tls", "client").security())  # the lab's


def test_a_killed_worker_is_named_and_work_sent_there_fails_naming_its_host(engine):
    connected, _, workers, _, _ = engine
    os.killpg(workers["y"].pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while connected.missing(["x", "y"]) != ["y"]:
        assert time.monotonic() < deadline, "the engine did not notice y's worker die within 15 s"
        time.sleep(0.2)
    with pytest.raises(HostLost, match="host y is not connected to the engine"):
        connected.run_on("y", underlay_addresses)
    assert connected.run_on("x", underlay_addresses)  # the other host still works


def test_a_frozen_host_is_named_from_its_missed_heartbeats(engine):
    connected, _, workers, _, _ = engine
    os.killpg(workers["x"].pid, signal.SIGSTOP)  # up but silent: only heartbeats tell
    started = time.monotonic()
    try:
        while connected.missing(["x", "y"]) != ["x"]:
            assert time.monotonic() - started < 40, "x was not named within 40 s of its last heartbeat"
            time.sleep(0.5)
    finally:
        os.killpg(workers["x"].pid, signal.SIGCONT)
    print(f"frozen host named after {time.monotonic() - started:.1f} s (worker TTL {TTL})")


def test_connected_hosts_are_read_as_connected_across_the_clients_own_refresh(engine):
    """The client refreshes its cached view of the scheduler on its own (with no workers in it);
    asked while that runs, every connected host is still named (CI once read host y as lost)."""
    import dask

    from orchestrator.hosts.dask_engine import DaskEngine

    _, _, _, address, tmp_path = engine
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}):  # the refresh, often
        often = DaskEngine.connect(tmp_path, address)
    try:
        reads = [often.hosts() for _ in range(300)]
    finally:
        often.close()
    assert [r for r in reads if r != ["x", "y"]] == []
