"""Ansible connection `testbed_nsenter`: enter a testbed lab server without SSH.

A Docker server is entered with nsenter into its container's mount, UTS, IPC, network and
PID namespaces (its files, its hostname, its processes); a server of a netns lab, which is a
network namespace on the host, is entered into that namespace only (the host's files). Why
not `community.docker.docker`: it is not in ansible-core, Galaxy is out of reach here, and
the `ansible` package that bundles it weighs ~400 MB installed; it also runs the `docker`
CLI (a Go program and a call through dockerd) for every command, where nsenter is one
fork and exec. A container's process id is asked of the Docker engine's socket once per
connection (what `docker inspect` does), so a restarted container is found again.

Commands run as root with the container's PATH; pipelining is supported (a module goes on
stdin), so a task costs one nsenter. Files go through `cat` inside the container: a path is
resolved by the server's own root, never by the host's.

Host variables: `testbed_container` (Docker) or `testbed_netns` (netns); one of them.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
import socket
import subprocess
import urllib.parse

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.connection import ConnectionBase

DOCUMENTATION = """
name: testbed_nsenter
short_description: enter a testbed lab server (a Docker container or a network namespace) with nsenter
description:
  - Runs commands inside a lab server's namespaces with nsenter, without SSH.
  - A Docker server is entered into its mount, UTS, IPC, network and PID namespaces; a netns
    server into its network namespace only (the host's filesystem).
author: testbed
version_added: historical
options:
  container:
    description: the Docker container of the server
    vars:
      - name: testbed_container
  netns:
    description: the named network namespace (/run/netns/NAME) of the server
    vars:
      - name: testbed_netns
  docker_socket:
    description: the Docker engine's socket
    default: /var/run/docker.sock
    vars:
      - name: testbed_docker_socket
"""

CONTAINER_PATH = "/opt/testbed/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def container_pid(name: str, docker_socket: str, timeout: float = 10.0) -> int:
    """The host pid of a running container's first process, from the engine's API."""
    connection = _UnixHTTPConnection(docker_socket, timeout)
    try:
        connection.request("GET", f"/containers/{urllib.parse.quote(name, safe='')}/json")
        response = connection.getresponse()
        body = response.read()
    except OSError as exc:
        raise AnsibleConnectionFailure(f"cannot reach the Docker engine at {docker_socket}: {exc}") from None
    finally:
        connection.close()
    if response.status == 404:
        raise AnsibleConnectionFailure(f"no container named {name}")
    if response.status != 200:
        raise AnsibleConnectionFailure(f"Docker engine: {response.status} {body[:200]!r}")
    state = json.loads(body)["State"]
    if not state.get("Running") or not state.get("Pid"):
        raise AnsibleConnectionFailure(f"container {name} is not running")
    return int(state["Pid"])


class Connection(ConnectionBase):
    transport = "testbed_nsenter"
    has_pipelining = True
    default_user = "root"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prefix: list[str] = []
        self._env: dict[str, str] | None = None

    def _connect(self) -> "Connection":
        if self._connected:
            return self
        if os.geteuid() != 0:
            raise AnsibleConnectionFailure("testbed_nsenter enters namespaces and needs root")
        container, netns = self.get_option("container"), self.get_option("netns")
        if bool(container) == bool(netns):
            raise AnsibleConnectionFailure("set exactly one of testbed_container and testbed_netns for this host")
        if container:
            pid = container_pid(container, self.get_option("docker_socket"))
            self._prefix = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--"]
            self._env = {"PATH": CONTAINER_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root"}
        else:
            path = f"/run/netns/{netns}"
            if "/" in netns or not os.path.exists(path):
                raise AnsibleConnectionFailure(f"no network namespace {netns} (/run/netns)")
            self._prefix = ["nsenter", f"--net={path}", "--"]
            self._env = None  # the host's environment, like any host process
        self._connected = True
        return self

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        self._display.vvv(f"EXEC {shlex.join(self._prefix)} /bin/sh -c {shlex.quote(cmd)}", host=self._play_context.remote_addr)
        process = subprocess.Popen(
            [*self._prefix, "/bin/sh", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=self._env,
        )
        stdout, stderr = process.communicate(in_data)
        return process.returncode, stdout, stderr

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        self._connect()
        if self.get_option("netns"):  # the host's files
            return self._local_copy(in_path, out_path)
        with open(in_path, "rb") as source:
            self._in_server('cat > "$1"', out_path, stdin=source, what=f"put {in_path} to {out_path}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        self._connect()
        if self.get_option("netns"):
            return self._local_copy(in_path, out_path)
        with open(out_path, "wb") as target:
            self._in_server('cat -- "$1"', in_path, stdout=target, what=f"fetch {in_path}")

    @staticmethod
    def _local_copy(source: str, target: str) -> None:
        try:
            shutil.copyfile(source, target)
        except OSError as exc:
            raise AnsibleError(f"copy {source} to {target}: {exc}") from None

    def _in_server(self, script: str, path: str, what: str, stdin=None, stdout=None) -> None:
        result = subprocess.run(
            [*self._prefix, "/bin/sh", "-c", script, "sh", path], stdin=stdin or subprocess.DEVNULL,
            stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE, env=self._env,
        )
        if result.returncode != 0:
            raise AnsibleError(f"{what}: {result.stderr.decode(errors='replace').strip()}")

    def close(self) -> None:
        self._connected = False
