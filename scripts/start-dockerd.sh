#!/usr/bin/env bash
# Start the Docker engine if it is not running (nothing else starts it on our machines).
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
command -v dockerd >/dev/null || { echo "dockerd missing: apt-get install docker.io" >&2; exit 1; }
# A dockerd that ended without cleaning up leaves its containerd's pid file; once that pid
# belongs to another process, a new dockerd takes containerd for running and waits for its
# socket until it gives up ("containerd is still running", then a timeout).
pidfile=/var/run/docker/containerd/containerd.pid
if ! pgrep -x dockerd >/dev/null && [ -f "$pidfile" ] \
        && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null)" != containerd ]; then
    rm -f "$pidfile"
fi
echo "==> starting dockerd (log: /var/log/testbed-dockerd.log)" >&2
nohup dockerd >>/var/log/testbed-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && exit 0
    sleep 0.5
done
echo "dockerd did not start: see /var/log/testbed-dockerd.log" >&2
exit 1
