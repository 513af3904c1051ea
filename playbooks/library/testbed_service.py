#!/usr/bin/python
# <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
"""Ansible module `testbed_service`: a program under daemontools' supervise.

    testbed_service:
      service: /etc/testbed/agent/service        # holds `run`; supervise keeps its state there
      link: /etc/service/testbed-agent           # where svscan finds it
      requires: [/opt/testbed/bin/testbed-agent] # executables that must exist
      files: [{path: …/service/run, content: …, mode: "0755"}, …]
      restart: false                             # restart it even if no file changed
      state: started | absent

started: the files are written where they differ, the service linked where svscan looks
(svscan starts it within 5 s), and a running service whose files changed (or `restart`) is
sent TERM, which supervise answers by starting it again. absent: unlinked, stopped
(supervise's `dx`: down, then exit), waited for, and `remove` (a directory) deleted.
changed is true only when something was done, so a rerun reports changed=0.

Light on purpose: it imports nothing of Ansible (see testbed_file).
"""

import json
import os
import shutil
import sys
import tempfile
import time

ARGS = json.loads("<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>")  # a Python literal of the JSON


class Failed(Exception):
    pass


def put(path, content, mode):
    data = content.encode()
    try:
        current = os.stat(path)
        with open(path, "rb") as handle:
            if handle.read() == data and (current.st_mode & 0o7777) == mode:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    descriptor, partial = tempfile.mkstemp(dir=directory, prefix=".testbed.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    return True


def supervised(service):
    """Whether a supervise runs for `service` (what svok asks: its `ok` fifo has a reader)."""
    try:
        os.close(os.open(os.path.join(service, "supervise", "ok"), os.O_WRONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


def control(service, commands):
    """Write to supervise's control fifo, as svc does: t = TERM (restart), d = down, x = exit."""
    descriptor = os.open(os.path.join(service, "supervise", "control"), os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(descriptor, commands.encode())
    finally:
        os.close(descriptor)


def started(args):
    service, link = args["service"], args["link"]
    for program in args.get("requires") or []:
        if not os.access(program, os.X_OK):
            raise Failed(f"{program} is missing: rebuild the server image (testbed images build) "
                         "or deploy with agent_install=wheel")
    changed = False
    for item in args.get("files") or []:
        changed |= put(item["path"], item["content"].rstrip("\n") + "\n", int(str(item.get("mode", "0644")), 8))
    linked = os.path.islink(link) and os.readlink(link) == service
    if not linked:
        os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(service, link)
    restarted = (changed or bool(args.get("restart"))) and linked and supervised(service)
    if restarted:
        control(service, "t")
    return {"changed": changed or not linked or restarted, "restarted": restarted, "linked": not linked}


def absent(args, timeout=15.0):
    service, link = args["service"], args["link"]
    changed = False
    if os.path.islink(link):
        os.unlink(link)
        changed = True
    if supervised(service):
        control(service, "dx")
        changed = True
        deadline = time.monotonic() + timeout
        while supervised(service):
            if time.monotonic() > deadline:
                raise Failed(f"{service} did not stop within {timeout:g} s")
            time.sleep(0.05)
    remove = args.get("remove")
    if remove and os.path.lexists(remove):
        shutil.rmtree(remove)
        changed = True
    return {"changed": changed}


def main():
    try:
        result = (absent if ARGS.get("state", "started") == "absent" else started)(ARGS)
    except (Failed, OSError, KeyError, ValueError) as exc:
        print(json.dumps({"failed": True, "msg": str(exc)}))
        sys.exit(1)
    print(json.dumps(result))


main()
