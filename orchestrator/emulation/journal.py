"""Per-lab state on disk: what a lab is, and a journal of every object made for it.

Layout (`TESTBED_STATE`, default /var/lib/testbed):

    labs/<name>/spec.json      the validated lab spec
    labs/<name>/state.json     status (building | up), lab id, management plan, runtime
    labs/<name>/journal.jsonl  one line per object, written and fsync'd BEFORE it is made
    lock                       flock held while labs are created or removed

Because the journal is written first, a SIGKILL at any moment leaves at worst an entry for
an object that does not exist yet; undoing is idempotent, so `testbed clean` removes
everything that does exist. /var/lib rather than /run: containers survive a reboot.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from orchestrator.errors import LabNotFound


def state_root() -> Path:
    return Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))


def lab_id(name: str) -> str:
    """Six hex digits naming a lab in the root namespace, where names must stay short."""
    return hashlib.sha1(name.encode()).hexdigest()[:6]


@contextmanager
def global_lock() -> Iterator[None]:
    """Serialise creation and removal of labs between testbed processes."""
    root = state_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class Entry:
    kind: str  # netns | container | host_link | process
    name: str
    extra: dict

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "name": self.name, **self.extra})


class LabState:
    """The state directory of one lab."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dir = state_root() / "labs" / name

    # -- existence ----------------------------------------------------------------------------
    @classmethod
    def all(cls) -> list["LabState"]:
        labs = state_root() / "labs"
        if not labs.is_dir():
            return []
        return [cls(p.name) for p in sorted(labs.iterdir()) if p.is_dir()]

    def exists(self) -> bool:
        return self.dir.is_dir()

    def require(self) -> "LabState":
        if not self.exists():
            known = ", ".join(s.name for s in LabState.all()) or "none"
            raise LabNotFound(f"no lab named {self.name!r} is live (live labs: {known})")
        return self

    def create(self, spec: dict, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=False)
        self._write_json("spec.json", spec)
        self.write_state(state)
        (self.dir / "journal.jsonl").touch()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- files --------------------------------------------------------------------------------
    def _write_json(self, filename: str, data: dict) -> None:
        tmp = self.dir / f".{filename}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.dir / filename)

    def spec(self) -> dict:
        return json.loads((self.dir / "spec.json").read_text())

    def state(self) -> dict:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except FileNotFoundError:
            return {}

    def write_state(self, state: dict) -> None:
        self._write_json("state.json", {**state, "updated": time.time()})

    def update_state(self, **changes) -> dict:
        state = {**self.state(), **changes}
        self.write_state(state)
        return state

    # -- journal ------------------------------------------------------------------------------
    def record(self, entries: list[Entry]) -> None:
        """Append entries and fsync, before the objects they name are created."""
        if not entries:
            return
        with open(self.dir / "journal.jsonl", "a") as handle:
            handle.write("".join(entry.to_json() + "\n" for entry in entries))
            handle.flush()
            os.fsync(handle.fileno())

    def journal(self) -> list[Entry]:
        path = self.dir / "journal.jsonl"
        if not path.exists():
            return []
        entries = []
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill: its object was never created
            entries.append(Entry(data.pop("kind"), data.pop("name"), data))
        return entries
