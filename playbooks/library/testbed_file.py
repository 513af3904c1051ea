#!/usr/bin/python
# <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>
"""Ansible module `testbed_file`: a file with this content (ending in a newline) and mode
(made atomically, parents created), like `copy content=…` but light: it imports nothing of Ansible, so it
runs in ~40 ms where ansible-core 2.19's AnsibleModule modules take ~280 ms to compile
module_utils on every run (see README, Deploying agents). Used for the agent's token, with
no_log."""

import json
import os
import sys
import tempfile

ARGS = json.loads("<<INCLUDE_ANSIBLE_MODULE_COMPLEX_ARGS>>")  # a Python literal of the JSON


def put(path, content, mode):
    """Write `content` to `path` with `mode` unless it is there already; whether it changed."""
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


def main():
    try:
        content = ARGS["content"].rstrip("\n") + "\n"  # lookups strip it; keys need it
        changed = put(ARGS["path"], content, int(str(ARGS.get("mode", "0644")), 8))
    except (OSError, KeyError, ValueError) as exc:
        print(json.dumps({"failed": True, "msg": f"{ARGS.get('path')}: {exc}"}))
        sys.exit(1)
    print(json.dumps({"changed": changed, "path": ARGS["path"]}))


main()
