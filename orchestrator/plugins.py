"""A user's algorithms and topology kinds, loaded the way Mininet's `--custom` loads topologies.

A plugin is a Python file (or an installed package) that calls
`orchestrator.collectives.register(name, build, ...)` or
`orchestrator.spec.register_topology(spec, build, ...)`, the calls the built-ins use. It is
found three ways:

- `--plugin FILE` on `testbed run`, `predict`, `check-algorithm`, `up` and `topology`
  (load_file; a live lab remembers the file its topology kind came from);
- `plugins: [my_alg.py]` in an experiment file, relative to that file and inside its
  directory (load_for_experiment);
- the entry-point group `testbed.algorithms` of an installed package: the entry point's name
  is the algorithm's, its object a module that registers it or the `build` callable itself
  (load_entry_points).

A plugin is code that runs as the user running testbed, often root, so a file is refused
(one line naming it and why) when it is not a regular `.py` file of at most 1 MiB, is
writable by others, sits in a directory others may write without the sticky bit, or belongs
to neither root nor the user. A plugin that does not compile, raises while loading, takes
a name already registered or registers nothing is refused the same way, and whatever it
registered before failing is taken out again.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import traceback
import types
from importlib import metadata
from pathlib import Path

from orchestrator import files
from orchestrator.collectives import table
from orchestrator.errors import PluginError
from orchestrator.frameworks import table as frameworks
from orchestrator.topology import kinds

ENTRY_POINTS = "testbed.algorithms"
MAX_PLUGIN_BYTES = 1 << 20
MAX_PLUGINS = 16  # in one experiment file

_files: dict[Path, list[str]] = {}  # resolved file → the algorithms it registered
_entry_points_loaded = False


def load_file(path: str | Path, *, root: Path | None = None) -> list[str]:
    """Import the plugin at `path`; the names of the algorithms it registered. Loading a file
    again returns what it registered the first time. `root`: the directory it must stay in."""
    path = Path(path)
    shown = str(path)
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise PluginError(f"plugin {shown}: no such file: give the path of a .py file that calls "
                          "orchestrator.collectives.register") from None
    if resolved in _files:
        return list(_files[resolved])
    if root is not None and not resolved.is_relative_to(root.resolve()):
        raise PluginError(f"plugin {shown}: leaves {root} (through .. or a symlink): keep it beside the experiment "
                          "file or pass it with --plugin")
    source = _read(resolved, shown)
    try:
        code = compile(source, shown, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PluginError(f"plugin {shown}:{exc.lineno or '?'}: syntax error: {exc.msg}") from None
    except ValueError as exc:  # NUL bytes
        raise PluginError(f"plugin {shown}: not Python source ({exc})") from None
    module = types.ModuleType(f"testbed_plugins.{_module_name(resolved)}")
    module.__file__ = str(resolved)
    names = _registering(shown, lambda: _execute(code, module, shown), str(resolved))
    _files[resolved] = names
    return list(names)


def load_for_experiment(plugins: object, experiment: Path) -> list[str]:
    """An experiment file's `plugins:` list, each relative to (and inside) its directory."""
    if plugins is None:
        return []
    if not isinstance(plugins, list) or not all(isinstance(p, str) and p.strip() for p in plugins):
        raise PluginError("plugins: a list of .py files beside the experiment file, e.g. plugins: [my_alg.py]")
    if len(plugins) > MAX_PLUGINS:
        raise PluginError(f"plugins: {len(plugins)} files, more than {MAX_PLUGINS}: register several algorithms in one")
    names: list[str] = []
    before, files, topology_kinds = dict(table.ALGORITHMS), dict(_files), set(kinds.KINDS)
    try:
        for index, plugin in enumerate(plugins):
            if Path(plugin).is_absolute():
                raise PluginError(f"plugins[{index}]: {plugin} is an absolute path: name it relative to the experiment "
                                  "file (or pass it with --plugin)")
            try:
                names += load_file(experiment.parent / plugin, root=experiment.parent)
            except PluginError as exc:
                raise PluginError(f"plugins[{index}]: {exc}") from None
    except BaseException:  # all of the list or none of it
        _restore(before, files, topology_kinds)
        raise
    return names


def _restore(algorithms: dict, files: dict, topology_kinds: set) -> None:
    _forget(set(algorithms), topology_kinds)
    table.ALGORITHMS.clear()
    table.ALGORITHMS.update(algorithms)
    _files.clear()
    _files.update(files)


def load_entry_points() -> list[str]:
    """The algorithms of installed packages' `testbed.algorithms` entry points (once per process)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    before, files, topology_kinds = dict(table.ALGORITHMS), dict(_files), set(kinds.KINDS)
    names: list[str] = []
    try:
        for entry in metadata.entry_points(group=ENTRY_POINTS):
            shown = f"entry point {entry.name} = {entry.value}"
            if entry.name in table.ALGORITHMS:
                raise PluginError(f"{shown}: algorithm {entry.name} is registered already "
                                  f"({table.ALGORITHMS[entry.name].origin}): rename the entry point")
            names += _registering(shown, lambda entry=entry, shown=shown: _from_entry_point(entry, shown))
    except BaseException:
        _restore(before, files, topology_kinds)
        raise
    _entry_points_loaded = True
    return names


def _from_entry_point(entry: metadata.EntryPoint, shown: str) -> None:
    try:
        loaded = entry.load()
    except Exception as exc:  # a broken package: name it, not a traceback
        raise PluginError(f"{shown}: {type(exc).__name__}: {exc}") from None
    if entry.name not in table.ALGORITHMS and callable(loaded) and not isinstance(loaded, types.ModuleType):
        try:
            table.register(entry.name, loaded)
        except ValueError as exc:
            raise PluginError(f"{shown}: {exc}") from None
    if entry.name not in table.ALGORITHMS or table.ALGORITHMS[entry.name].origin != shown:
        raise PluginError(f"{shown}: registers no algorithm named {entry.name}: point it at a build callable or a "
                          "module that calls orchestrator.collectives.register")


def _registering(shown: str, load, file: str | None = None) -> list[str]:
    """Run `load` recording `shown` as the origin of the algorithms it registers (and `file`
    as that of its topology kinds, so a live lab can load it again); the new algorithms'
    names, or, when it fails, nothing left registered and a PluginError."""
    before, kinds_before, frameworks_before = set(table.ALGORITHMS), set(kinds.KINDS), set(frameworks.FRAMEWORKS)
    try:
        with table.origin(shown), kinds.origin(file or shown), frameworks.origin(shown):
            load()
    except BaseException:
        _forget(before, kinds_before, frameworks_before)
        raise
    names = [name for name in table.ALGORITHMS if name not in before]
    if not names and set(kinds.KINDS) == kinds_before and set(frameworks.FRAMEWORKS) == frameworks_before \
            and not shown.startswith("entry point"):
        raise PluginError(f"plugin {shown} registers nothing: call orchestrator.collectives.register(name, build), "
                          "orchestrator.spec.register_topology(spec, build) or "
                          "orchestrator.frameworks.register_framework(name, run, runs=...) in it")
    return names


def _forget(algorithms: set, topology_kinds: set, framework_names: set | None = None) -> None:
    """Take out what was registered since: algorithms, topology kinds with their models, and
    frameworks (when `framework_names` says which were there before)."""
    from orchestrator.spec.kinds import unregister_topology

    for name in set(table.ALGORITHMS) - algorithms:
        del table.ALGORITHMS[name]
    for name in set(frameworks.FRAMEWORKS) - (framework_names if framework_names is not None else set(frameworks.FRAMEWORKS)):
        frameworks.unregister_framework(name)
    for name in set(kinds.KINDS) - topology_kinds:
        unregister_topology(name)


def _execute(code: types.CodeType, module: types.ModuleType, shown: str) -> None:
    sys.modules[module.__name__] = module  # pydantic models and dataclasses look their module up
    try:
        exec(code, module.__dict__)  # noqa: S102: the user's own plugin, as mn --custom
    except (Exception, SystemExit) as exc:
        del sys.modules[module.__name__]
        if isinstance(exc, PluginError):
            raise
        # register's own refusals (a taken name, a part that is not callable) read as they are
        if isinstance(exc, MemoryError):
            what = "ran out of memory while loading (more than this process may have)"
        elif isinstance(exc, ValueError) and str(exc).startswith(("algorithm", "framework")):
            what = str(exc)
        else:
            what = f"{type(exc).__name__}: {exc}"
        raise PluginError(f"plugin {shown}:{_line(exc, shown)}: {what}") from None


def _line(exc: BaseException, shown: str) -> str:
    """The line of the plugin file where `exc` left it ('?' when it never ran there)."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == shown]
    return str(lines[-1]) if lines else "?"


def _read(path: Path, shown: str) -> str:
    """The plugin's source, after the checks that make running it no one else's choice, made
    on the descriptor it is read through (files.read_regular): nothing swapped in between, a
    FIFO never waited on."""
    if path.suffix != ".py":
        raise PluginError(f"plugin {shown}: not a .py file: a plugin is Python source")
    try:
        data = files.read_regular(path, MAX_PLUGIN_BYTES, follow=False, check=lambda info: _safe(info, path, shown))
    except files.NotRegular:
        raise PluginError(f"plugin {shown}: not a regular file: give a .py file") from None
    except files.TooLarge as exc:
        raise PluginError(f"plugin {shown}: {exc.size:,} bytes, more than the {MAX_PLUGIN_BYTES:,} a plugin may "
                          "have") from None
    except OSError as exc:
        raise PluginError(f"plugin {shown}: cannot be read ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PluginError(f"plugin {shown}: not UTF-8 text (byte {exc.start})") from None


def _safe(info: os.stat_result, path: Path, shown: str) -> None:
    """PluginError unless only root, you (or sudo's user) could have written the plugin."""
    if info.st_uid not in _trusted_owners():
        raise PluginError(f"plugin {shown}: unsafe: owned by uid {info.st_uid}, neither root nor you: chown it "
                          "or copy it")
    if info.st_mode & stat.S_IWOTH:
        raise PluginError(f"plugin {shown}: unsafe: anyone may write it: chmod o-w {shown}")
    parent = path.parent.stat()
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        raise PluginError(f"plugin {shown}: unsafe: anyone may replace it in {path.parent}: move it to a directory "
                          "only you may write")


def _trusted_owners() -> set[int]:
    """Who may own a plugin: root, you, and under sudo the user who ran it."""
    owners = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit():
        owners.add(int(sudo))
    return owners


def _module_name(path: Path) -> str:
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
