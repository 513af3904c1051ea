"""Lab names given to commands: checked by the lab file's rule before they become paths.

Every destructive case runs against a throw-away state root inside tmp_path, with sentinel
files beside it and above it: `testbed clean /etc` once removed a machine's /etc because an
absolute name replaced the whole state path. Absolute names here point into tmp_path only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.emulation import journal
from orchestrator.errors import BadLabName


@pytest.fixture
def state_root(tmp_path, monkeypatch) -> Path:
    """tmp_path/state as the state root, with sentinels in it, beside it and in a victim dir."""
    root = tmp_path / "state"
    (root / "labs" / "real-lab").mkdir(parents=True)
    (root / "labs" / "real-lab" / "spec.json").write_text("{}")
    (root / "sentinel").write_text("state root")
    (tmp_path / "sentinel").write_text("parent")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("outside")
    monkeypatch.setenv("TESTBED_STATE", str(root))
    return root


def _sentinels(tmp_path: Path) -> list[Path]:
    root = tmp_path / "state"
    return [root / "sentinel", tmp_path / "sentinel", tmp_path / "victim" / "keep",
            root / "labs" / "real-lab" / "spec.json"]


def _testbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=120)


def hostile_names(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "victim"), str(tmp_path), "..", "../..", "../../victim", "labs/../..", "a/b",
            str(tmp_path) + "/", ".", "UPPER", "-lead", "x" * 25, "name with space", "tab\tname", "\u00e9t\u00e9"]


def _in_process(capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """`testbed ARGS` through the command line's own entry point (cli.main), in this process:
    a CLI of its own costs ~0.5 s of imports, 75 of them 55 s of the unit tier."""
    from orchestrator import cli

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["testbed", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.mark.parametrize("command", ["clean", "down", "status", "exec", "cli"])
def test_every_command_refuses_a_name_no_lab_can_have_and_touches_nothing(state_root, tmp_path, command, capsys,
                                                                         monkeypatch):
    for index, name in enumerate(hostile_names(tmp_path)):
        argv = [command, name] + (["h0", "--", "true"] if command == "exec" else [])
        # the first (an absolute path to a victim directory) through a process of its own, as a user runs it
        result = _testbed(*argv) if index == 0 else _in_process(capsys, monkeypatch, *argv)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        # -lead may read as an option (exec takes unknown options through to the command)
        expected = ("lab name", "No such option") if name.startswith("-") else ("lab name",)
        assert len(lines) == 1 and any(e in lines[0] for e in expected), (name, result.stderr)
        assert "Traceback" not in result.stderr
        for sentinel in _sentinels(tmp_path):
            assert sentinel.exists(), (name, command, sentinel)


def test_empty_name_is_an_error_and_says_how_to_clean_everything(state_root, tmp_path):
    result = _testbed("clean", "")
    assert result.returncode == 2
    assert "--all" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert all(s.exists() for s in _sentinels(tmp_path))


def test_clean_without_a_name_or_all_is_an_error(state_root, tmp_path):
    result = _testbed("clean")
    assert result.returncode == 2 and "--all" in result.stderr
    both = _testbed("clean", "real-lab", "--all")
    assert both.returncode == 2 and "not both" in both.stderr
    assert all(s.exists() for s in _sentinels(tmp_path))


def test_a_lab_directory_that_is_a_symlink_out_of_the_state_root_is_refused(state_root, tmp_path):
    (state_root / "labs" / "evil").symlink_to(tmp_path / "victim")
    with pytest.raises(BadLabName, match="does not stay under"):
        journal.LabState("evil")
    assert [s.name for s in journal.LabState.all()] == ["real-lab"]  # listed labs skip it
    result = _testbed("clean", "evil")
    assert result.returncode == 2 and (tmp_path / "victim" / "keep").exists()


def test_a_valid_name_stays_directly_under_the_labs_directory(state_root):
    state = journal.LabState("relq-a")
    assert state.dir == state_root / "labs" / "relq-a"
    assert journal.check_name("a" * 24) == "a" * 24


def test_lab_lock_refuses_a_second_holder_and_is_reentrant_in_one_process(state_root):
    from orchestrator.errors import LabBusy

    script = (
        "import sys, time\n"
        "from orchestrator.emulation import journal\n"
        "with journal.global_lock():\n"
        "    lock = journal.lab_lock('held-lab'); lock.__enter__()\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=os.environ.copy())
    try:
        assert holder.stdout.readline().strip() == "held"
        assert journal.lab_locked("held-lab")
        with pytest.raises(LabBusy, match="is being built"):
            with journal.global_lock(), journal.lab_lock("held-lab"):
                pass
    finally:
        holder.communicate("", timeout=30)
    assert not journal.lab_locked("held-lab")  # a lock dies with its process
    with journal.global_lock(), journal.lab_lock("held-lab"):
        with journal.lab_lock("held-lab"):  # the rollback path cleans under the build's lock
            assert journal.lab_locked("held-lab")


def test_a_building_lab_without_a_lock_holder_is_crashed(state_root):
    state = journal.LabState("gone-lab")
    state.create({}, {"status": "building", "pid": 1})
    assert state.crashed()
    state.update_state(status="up")
    assert not state.crashed()


def test_png_into_a_missing_directory_is_one_line_and_writes_nothing(tmp_path):
    target = tmp_path / "missing" / "star.png"
    result = _testbed("topology", "star,3", "--png", str(target))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "missing").exists() and result.stdout == ""
    written = _testbed("topology", "star,3", "--png", str(tmp_path / "star.png"))
    assert written.returncode == 0 and (tmp_path / "star.png").stat().st_size > 0


@pytest.mark.parametrize("shorthand", ["bcube,3,2", "fattree,4", "torus,3,3", "bigraph,4,2", "leafspine,2,2,3", "star,5"])
def test_node_names_never_hold_a_dash_so_namespaces_name_their_lab_exactly(shorthand):
    from orchestrator import topology
    from orchestrator.emulation.cleanup import lab_of_namespace
    from orchestrator.emulation.plan import namespace_name
    from orchestrator.spec import topology_kinds, lab_from_argument

    topo = topology.from_lab(lab_from_argument(shorthand))
    assert shorthand.split(",")[0] in topology_kinds()
    assert not [n for n in topo.nodes if "-" in n]
    for lab in ("relq", "relq-a", "a-b-c"):
        assert {lab_of_namespace(namespace_name(lab, n)) for n in topo.nodes} == {lab}
    assert lab_of_namespace("testbed-nodash") is None and lab_of_namespace("other-x-h0") is None
