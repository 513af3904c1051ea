"""A fresh control channel reaches an agent the moment it is back, even while another
channel to it (the experiment's iteration watcher, polling a crashed server) waits out
gRPC's reconnect backoff: a restarted server's agent rejoins a surviving run at once."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from orchestrator.control import driver
from orchestrator.control.local import free_ports


def _check(channel: grpc.Channel, timeout: float) -> grpc.StatusCode:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def test_a_fresh_control_channel_does_not_inherit_another_channels_backoff():
    [port] = free_ports(1)
    endpoint = driver.Endpoint(rank=0, node="h01", control=f"127.0.0.1:{port}", data="")
    watcher = driver.control_channel(endpoint)
    server = None
    try:
        until = time.monotonic() + 3.5  # nobody listens: its connection backs off (1 s, 1.6 s, ...)
        while time.monotonic() < until:
            assert _check(watcher, 0.2) != grpc.StatusCode.OK
            time.sleep(0.05)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        with driver.control_channel(endpoint) as fresh:
            assert _check(fresh, 1.0) == grpc.StatusCode.OK
    finally:
        watcher.close()
        if server is not None:
            server.stop(0)
