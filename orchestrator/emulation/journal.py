"""Per-lab state on disk: what a lab is, and a journal of every object made for it.

Layout (`TESTBED_STATE`, default /var/lib/testbed):

    labs/<name>/spec.json      the validated lab spec
    labs/<name>/state.json     status (building | up), lab id, management plan, runtime
    labs/<name>/journal.jsonl  one line per object, written and fsync'd BEFORE it is made
    labs/<name>/faults.jsonl   one line per phase of each fault (planned, applied, undone)
    labs/<name>/faults.lock    flock held while a fault changes the lab (not while it lasts)
    lock                       flock held while labs are created or removed
    locks/<name>               flock held by the process building or removing that lab

Because the journal is written first, a SIGKILL at any moment leaves at worst an entry for
an object that does not exist yet; undoing is idempotent, so `testbed clean` removes
everything that does exist. /var/lib rather than /run: containers survive a reboot.

A lab's name is checked by the lab file's own rule before it becomes a path, and the path is
checked to stay under the state root: `testbed clean /etc` or `clean ..` name no lab.
A lab lock is taken only under the global lock and never waited for, so a build in progress
is refused at once by `down`, `clean` and `exec`, and a lock file can be removed safely. A
lab whose status is `building` while nobody holds its lock was built by a process that died.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from orchestrator.errors import BadLabName, BadUsage, LabBusy, LabNotFound
from orchestrator.spec.lab import NAME_PATTERN, NAME_RULE


def state_root() -> Path:
    return Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))


def check_name(name: str) -> str:
    """`name` if it is a valid lab name (the lab file's rule), else a one-line BadLabName."""
    if name == "":
        raise BadLabName("an empty lab name names no lab: give one (testbed ls lists them); "
                         "`testbed clean --all` removes every lab")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        shown = repr(name) if len(repr(name)) <= 40 else repr(name)[:37] + "...'"
        raise BadLabName(f"lab name {shown} is not valid: {NAME_RULE} (testbed ls lists the labs)")
    return name


def lab_id(name: str) -> str:
    """Six hex digits naming a lab in the root namespace, where names must stay short."""
    return hashlib.sha1(name.encode()).hexdigest()[:6]


_global_depth = 0  # how deeply this process holds the global lock (it is re-entrant)


@contextmanager
def global_lock() -> Iterator[None]:
    """Serialise creation and removal of labs between testbed processes."""
    global _global_depth
    if _global_depth:
        _global_depth += 1
        try:
            yield
        finally:
            _global_depth -= 1
        return
    root = state_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _global_depth = 1
        try:
            yield
        finally:
            _global_depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


_held: dict[str, int] = {}  # lab name → open lock file descriptor, held by this process


@contextmanager
def lab_lock(name: str) -> Iterator[None]:
    """Hold lab `name`'s lock (take it under `global_lock`); LabBusy if another process holds
    it. Re-entrant within one process: a build's rollback cleans under the build's lock."""
    if name in _held:
        yield
        return
    locks = state_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    path = _under(locks, check_name(name))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise busy_error(name) from None
    _held[name] = fd
    try:
        yield
    finally:
        del _held[name]
        # A lock file may go only under the global lock, under which every taker opens it:
        # otherwise one process could lock the unlinked file and another a new one.
        with global_lock():
            if not LabState(name).exists():
                path.unlink(missing_ok=True)
            os.close(fd)


def busy_error(name: str) -> LabBusy:
    """The one-line refusal of a command aimed at a lab another process is building."""
    pid = LabState(name).state().get("pid")
    by = f" by process {pid}" if pid else ""
    return LabBusy(
        f"lab {name!r} is being built{by}: wait for `testbed up` to finish, or interrupt it "
        "(Ctrl-C rolls it back)"
    )


def lab_locked(name: str) -> bool:
    """Whether some process (this one included) holds lab `name`'s lock right now."""
    if name in _held:
        return True
    path = state_root() / "locks" / check_name(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _under(parent: Path, name: str) -> Path:
    """parent/name, refused unless it stays directly under `parent` (no '..', no absolute
    name, no symlink out): the last line of defence before anything is removed."""
    path = parent / name
    resolved, base = path.resolve(), parent.resolve()
    if resolved.parent != base or path.is_symlink():
        raise BadLabName(f"lab name {name!r} does not stay under {base}: refused")
    return path


_fault_cache: dict[str, tuple[tuple, list[dict]]] = {}  # faults.jsonl path → (size/mtime key, records)


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all (a temporary file renamed over it): readers
    that poll the file, Prometheus's file_sd among them, never see half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_inside(directory: Path, relative: str | Path, content: str | bytes | Callable[[BinaryIO], object]) -> Path:
    """`content` into directory/relative, whole or not at all, following no symlink.

    For the files a user's directory receives (`report`, `compare --out`, `grafana export`,
    results.json): `directory` itself and each folder of `relative` are opened with
    O_NOFOLLOW (a missing folder of `relative` is made; `directory` must exist), the file is
    written to a new temporary file beside its name (O_EXCL) and renamed over the name, which
    replaces whatever is there instead of writing through it. A symlink at the name, at a
    folder or at `directory` is refused before anything is written. `content` is text, bytes,
    or a function writing to the open binary file (matplotlib's savefig takes one).

    Every refusal and OSError is one BadUsage line naming the path and what to do.
    """
    directory = Path(directory)
    parts = Path(relative).parts
    if not parts or any(part in ("", ".", "..") or "/" in part for part in parts) or Path(relative).is_absolute():
        raise ValueError(f"write_inside: {relative!r} is not a plain relative path")
    where, fd = directory, None
    try:
        fd = _open_directory(directory, None, create=False)
        for part in parts[:-1]:
            where = where / part
            inner = _open_directory(part, fd, create=True)
            os.close(fd)
            fd = inner
        where = where / parts[-1]
        _write_file(fd, parts[-1], content)
    except OSError as exc:
        raise BadUsage(_write_refusal(where, exc)) from None
    finally:
        if fd is not None:
            os.close(fd)
    return directory / Path(*parts)


def _open_directory(name: str | Path, dir_fd: int | None, create: bool) -> int:
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            pass
    return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)


def _write_file(fd: int, name: str, content) -> None:
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
    except FileNotFoundError:
        pass
    temporary = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    handle_fd = os.open(temporary, _NEW_FILE_FLAGS, 0o644, dir_fd=fd)
    try:
        with os.fdopen(handle_fd, "wb") as handle:
            if callable(content):
                content(handle)
            else:
                handle.write(content.encode() if isinstance(content, str) else content)
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=fd)
        except OSError:
            pass
        raise


def _write_refusal(where: Path, exc: OSError) -> str:
    """One line: which path, what is wrong with it, what to do."""
    from orchestrator.spec.loader import display_path

    shown = display_path(where)
    # O_NOFOLLOW | O_DIRECTORY on a symlink fails with ENOTDIR, not ELOOP
    if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(where)):
        return (f"{shown}: is a symlink; testbed writes no file through a symlink: remove the link, or give a "
                f"path that is not one")
    if exc.errno == errno.ENOTDIR:
        return f"{shown}: is not a directory (or a folder on its way is not): give a directory"
    if exc.errno == errno.EISDIR:
        return f"{shown}: is a directory, where a file is written: move it away, or give another path"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{shown}: cannot write there: {exc.strerror}: run as a user who may write in that directory, "
                f"or copy it somewhere you can write")
    if exc.errno == errno.ENOENT:
        return f"{shown}: no such directory: give an existing one"
    return f"{shown}: cannot write: {exc.strerror or exc}"


@dataclass
class Entry:
    kind: str  # netns | container | host_link | process | rxe | nft_table | fault | wire (a VXLAN end, split labs)
    name: str
    extra: dict

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "name": self.name, **self.extra})


class LabState:
    """The state directory of one lab."""

    def __init__(self, name: str) -> None:
        self.name = check_name(name)
        self.dir = _under(state_root() / "labs", name)

    # -- existence ----------------------------------------------------------------------------
    @classmethod
    def all(cls) -> list["LabState"]:
        labs = state_root() / "labs"
        if not labs.is_dir():
            return []
        return [
            cls(p.name) for p in sorted(labs.iterdir())
            if p.is_dir() and not p.is_symlink() and re.fullmatch(NAME_PATTERN, p.name)
        ]

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
        _under(self.dir.parent, self.name)  # checked again right before removing anything
        shutil.rmtree(self.dir, ignore_errors=True)

    def building(self) -> bool:
        """Not (yet) up: being built, or left half-built (a state file that was never
        written counts as building: the build died first)."""
        return self.state().get("status", "building") == "building"

    def crashed(self) -> bool:
        """Left building by a process that is gone (nobody holds the lab's lock)."""
        return self.building() and not lab_locked(self.name)

    # -- files --------------------------------------------------------------------------------
    def _write_json(self, filename: str, data: dict) -> None:
        tmp = self.dir / f".{filename}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.dir / filename)

    def spec(self) -> dict:
        """The lab's spec, or {} if a build died before writing it."""
        return self._read_json("spec.json")

    def state(self) -> dict:
        return self._read_json("state.json")

    def _read_json(self, filename: str) -> dict:
        try:
            return json.loads((self.dir / filename).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
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

    # -- faults -------------------------------------------------------------------------------
    FAULT_PHASES = ("planned", "applied", "undone")

    def record_fault_event(self, fault_id: str, phase: str, action: str, target: str, params: dict | None = None,
                           at: float | None = None) -> None:
        """Append one phase of a fault to faults.jsonl (fsync'd): the results' timeline and
        what the exporter counts."""
        assert phase in self.FAULT_PHASES, phase
        line = json.dumps({"id": fault_id, "phase": phase, "action": action, "target": target,
                           "params": params or {}, "time": time.time() if at is None else at})
        with open(self.dir / "faults.jsonl", "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def fault_events(self) -> list[dict]:
        """Every fault of this lab, oldest first: {id, action, target, params, planned,
        applied, undone}, the last three Unix times or None (never applied, or still active).
        Cached on the file's size and mtime: a scrape that finds nothing new parses nothing."""
        path = self.dir / "faults.jsonl"
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        cached = _fault_cache.get(str(path))
        if cached is not None and cached[0] == key:
            return [dict(f) for f in cached[1]]
        faults: dict[str, dict] = {}
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
                record = faults.setdefault(event["id"], {
                    "id": event["id"], "action": event["action"], "target": event["target"],
                    "params": event.get("params", {}), "planned": None, "applied": None, "undone": None})
                if event["phase"] in self.FAULT_PHASES:
                    record[event["phase"]] = event["time"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by a kill
        result = list(faults.values())
        _fault_cache[str(path)] = (key, result)
        return [dict(f) for f in result]

    def active_faults(self) -> list[dict]:
        """Faults planned or applied and not undone (a planned one may have half-acted)."""
        return [f for f in self.fault_events() if f["undone"] is None]

    @contextmanager
    def fault_lock(self) -> Iterator[None]:
        """Serialise faults changing this lab (one reroute at a time sees the others' links)."""
        with open(self.dir / "faults.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

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
