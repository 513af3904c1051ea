#!/usr/bin/python
# <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
"""Ansible module `testbed_health`: wait until a gRPC server answers the standard health
check (grpc.health.v1.Health/Check) with SERVING for every service named, as
grpc_health_probe does, from the server itself.

    testbed_health:
      address: 198.18.0.2:7000
      services: ["", testbed.Control, testbed.Data]   # "" is the server as a whole
      timeout: 30
      log: /etc/testbed/agent/agent.log               # its last line is quoted on failure
      give_up: "^testbed-agent: cannot"               # fail at once when the log's last line
                                                      # matches (a fault no wait will mend)

Needs grpcio and grpcio-health-checking in the interpreter that runs it (the agent's venv).
Light on purpose: it imports nothing of Ansible (see testbed_file).
"""

import json
import os
import re
import sys
import time

ARGS = json.loads("<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>")  # a Python literal of the JSON


def log_size(path):
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def last_line(path, since=0):
    """The last line of the log written after byte `since`."""
    if not path:
        return ""
    if not os.path.exists(path):
        return "(no log: the service never started; does svscan watch its directory?)"
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(since, handle.tell() - 4096))
        lines = handle.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def fail(message):
    print(json.dumps({"failed": True, "msg": message}))
    sys.exit(1)


def main():
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError as exc:
        fail(f"this interpreter ({sys.executable}) lacks grpcio-health-checking ({exc}): run the module with the agent's python")
    address = ARGS["address"]
    services = list(ARGS.get("services") or [""])
    timeout = float(ARGS.get("timeout", 30))
    started = time.monotonic()
    since = log_size(ARGS.get("log"))  # what earlier runs wrote is no reason to give up
    pending, last = list(services), "no answer"
    while pending:
        # a fresh channel per try: a reused one would wait out gRPC's reconnect backoff
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                while pending:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=pending[0]), timeout=2)
                    if reply.status != health_pb2.HealthCheckResponse.SERVING:
                        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                        last = f"{pending[0] or 'the server'} is {status}"
                        break
                    pending.pop(0)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
        if pending:
            fresh = last_line(ARGS.get("log"), since)
            waited = time.monotonic() - started
            if ARGS.get("give_up") and fresh and re.search(ARGS["give_up"], fresh):
                fail(f"{address} is not SERVING after {waited:.0f} s ({last}): its log ends: {fresh}")
            hint = last_line(ARGS.get("log"))
            if waited > timeout:
                fail(f"{address} is not SERVING after {timeout:g} s ({last})" + (f"; its log ends: {hint}" if hint else ""))
            time.sleep(0.2)
    print(json.dumps({"changed": False, "address": address, "services": services,
                      "waited": round(time.monotonic() - started, 3)}))


main()
