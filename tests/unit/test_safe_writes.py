"""No write through a symlink, and no directory left behind (issue 27).

`report DIR`, `compare --out FILE`, `grafana export DIR` and results.json write through
journal.write_inside: the directory and each folder on the way are opened with O_NOFOLLOW,
the file goes to a new temporary file (O_EXCL) renamed over its name. A symlinked directory,
folder or file is refused in one line before anything is written, and whatever the link
points to stays as it was. `run --out` makes its directory without leaving a parent behind
on a refusal, and resolves `..` as the kernel would.

Everything is made inside tmp_path; a directory we may not write is simulated by making
the creating open fail with EACCES (we run as root, whom chmod does not stop).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.emulation.journal import write_inside
from orchestrator.errors import BadUsage
from orchestrator.experiment import compare, plots, report, snapshot
from orchestrator.experiment import results as results_lib
from orchestrator.experiment.results import new_directory
from orchestrator.monitoring import dashboards
from tests.unit.test_results_untrusted import good, one_line_error, run_testbed
from tests.unit.test_experiment_report import write

MINE = "mine\n"


def precious(tmp_path: Path) -> Path:
    """A file of the user's outside every directory testbed writes: it must survive."""
    path = tmp_path / "precious.txt"
    path.write_text(MINE)
    return path


def one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message and len(message) <= 400 and caught.value.exit_code == 2, message
    return message


def deny_creating(monkeypatch) -> None:
    """As in a directory this user may not write: every open that would create a file fails."""
    real_open = os.open

    def denied(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)


# -- the helper -----------------------------------------------------------------------------------
def test_os_replace_over_a_symlink_replaces_the_link_not_its_target(tmp_path):
    # what write_inside relies on should a link appear between its check and its rename
    target = precious(tmp_path)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "new").write_text("new\n")
    os.replace(tmp_path / "new", tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "link").read_text() == "new\n"
    assert target.read_text() == MINE


def test_write_inside_writes_whole_files_and_folders_and_leaves_no_temporary(tmp_path):
    assert write_inside(tmp_path, "a.txt", "one\n") == tmp_path / "a.txt"
    write_inside(tmp_path, "a.txt", b"two\n")
    write_inside(tmp_path, Path("sub") / "deeper" / "b.bin", lambda handle: handle.write(b"\x00\x01"))
    assert (tmp_path / "a.txt").read_text() == "two\n"
    assert (tmp_path / "sub" / "deeper" / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.bin", "deeper", "sub"]


@pytest.mark.parametrize("where", ["the file", "a folder on the way", "the directory"])
def test_write_inside_refuses_a_symlink_anywhere_on_its_way(tmp_path, where):
    target = precious(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory = tmp_path / "out"
    if where == "the file":
        directory.mkdir()
        (directory / "precious.txt").symlink_to(target)
        relative, link = "precious.txt", directory / "precious.txt"
    elif where == "a folder on the way":
        directory.mkdir()
        (directory / "sub").symlink_to(elsewhere)
        relative, link = "sub/precious.txt", directory / "sub"
    else:
        directory.symlink_to(elsewhere)
        relative, link = "precious.txt", directory
    with pytest.raises(BadUsage) as caught:
        write_inside(directory, relative, "overwritten\n")
    assert one_line(caught).startswith(f"{link}: is a symlink; testbed writes no file through a symlink")
    assert target.read_text() == MINE and list(elsewhere.iterdir()) == []


def test_write_inside_in_a_directory_it_may_not_write_is_one_line(tmp_path, monkeypatch):
    deny_creating(monkeypatch)
    with pytest.raises(BadUsage) as caught:
        write_inside(tmp_path, "a.txt", "x")
    assert one_line(caught) == (f"{tmp_path / 'a.txt'}: cannot write there: Permission denied: run as a user who "
                                f"may write in that directory, or copy it somewhere you can write")


def test_write_inside_refuses_paths_that_step_out(tmp_path):
    inside = tmp_path / "inside"
    inside.mkdir()
    # every way out lands in this test's own directory, were the refusal ever to fail
    for relative in ("../x", str(tmp_path / "absolute" / "x"), "a/../../x", ""):
        with pytest.raises(ValueError):
            write_inside(inside, relative, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inside"] and not any(inside.iterdir())


def test_results_json_is_not_written_through_a_symlink(tmp_path):
    target = precious(tmp_path)
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / "results.json").symlink_to(target)
    with pytest.raises(BadUsage, match="results.json: is a symlink"):
        results_lib.write(directory, good())
    assert target.read_text() == MINE


# -- report DIR ------------------------------------------------------------------------------------
REPORT_FILES = [report.RESULTS_CSV, report.ITERATIONS_CSV, *plots.PLOTS, report.SUMMARY, snapshot.DIRECTORY,
                f"{snapshot.DIRECTORY}/{snapshot.QUERIES}"]


@pytest.mark.parametrize("name", REPORT_FILES)
def test_report_refuses_a_symlink_where_it_writes_before_writing_anything(tmp_path, name):
    target = precious(tmp_path)
    directory = write(tmp_path / "run", good())  # with monitoring: prometheus/queries.json too
    if name == snapshot.DIRECTORY:
        (tmp_path / "elsewhere").mkdir()
        (directory / name).symlink_to(tmp_path / "elsewhere")
    else:
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).symlink_to(target)
    with pytest.raises(BadUsage) as caught:
        report.render(directory)
    assert one_line(caught).startswith(f"{directory / name}: is a symlink (a file report writes)")
    assert target.read_text() == MINE and not (tmp_path / "elsewhere" / snapshot.QUERIES).exists()
    assert {p.name for p in directory.iterdir()} == {"results.json", Path(name).parts[0]}  # nothing written


def test_report_of_a_symlinked_directory_is_refused(tmp_path):
    real = write(tmp_path / "real", good())
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(BadUsage) as caught:
        report.render(tmp_path / "link")
    assert "link: is a symlink (the results directory)" in one_line(caught)
    assert [p.name for p in real.iterdir()] == ["results.json"]


def test_report_whose_summary_md_is_a_symlink_leaves_its_target_through_the_cli(tmp_path):
    target = precious(tmp_path)
    directory = write(tmp_path / "run", good())
    (directory / "summary.md").symlink_to(target)
    assert "summary.md: is a symlink" in one_line_error(run_testbed("report", str(directory)))
    assert target.read_text() == MINE


def test_report_in_a_directory_it_may_not_write_is_one_line(tmp_path, monkeypatch):
    directory = write(tmp_path / "run", good())
    results = results_lib.load(directory)
    deny_creating(monkeypatch)
    with pytest.raises(BadUsage) as caught:
        report.render(directory, results)
    assert "results.csv: cannot write there: Permission denied" in one_line(caught)


def test_report_writes_every_file_in_place_of_its_previous_one(tmp_path):
    directory = write(tmp_path / "run", good())
    first = {p.relative_to(directory) for p in report.render(directory)}
    (directory / "summary.md").write_text("stale")
    second = {p.relative_to(directory) for p in report.render(directory)}
    assert first == second and (directory / "summary.md").read_text().startswith("# unit")
    assert (directory / "gst.png").read_bytes().startswith(b"\x89PNG")
    assert not [p for p in directory.rglob(".*")]  # no temporary file left


# -- compare --out ---------------------------------------------------------------------------------
def test_compare_out_through_a_symlink_is_refused(tmp_path):
    target = precious(tmp_path)
    run = write(tmp_path / "run", good())
    (tmp_path / "link.md").symlink_to(target)
    message = one_line_error(run_testbed("compare", str(run), str(run), "--out", str(tmp_path / "link.md")))
    assert "link.md: is a symlink; testbed writes no file through a symlink" in message
    assert target.read_text() == MINE and (tmp_path / "link.md").is_symlink()


def test_compare_out_in_a_symlinked_directory_or_one_it_may_not_write(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadUsage) as caught:
        compare.write(tmp_path / "linked" / "cmp.md", "# x\n")
    assert one_line(caught).startswith(f"--out: {tmp_path / 'linked'}: is a symlink")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with pytest.raises(BadUsage, match="is a directory"):
        compare.write(tmp_path / "elsewhere", "# x\n")
    deny_creating(monkeypatch)
    with pytest.raises(BadUsage, match="cmp.md: cannot write there: Permission denied"):
        compare.write(tmp_path / "cmp.md", "# x\n")


# -- grafana export --------------------------------------------------------------------------------
def test_grafana_export_into_a_symlinked_directory_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(BadUsage) as caught:
        dashboards.export(tmp_path / "link")
    assert "grafana export" in one_line(caught) and "it is a symlink" in str(caught.value)
    assert list((tmp_path / "empty").iterdir()) == []
    result = subprocess.run([str(Path(sys.executable).parent / "testbed"), "grafana", "export", str(tmp_path / "link")],
                            capture_output=True, text=True, timeout=60)
    assert "it is a symlink" in one_line_error(result)
    assert list((tmp_path / "empty").iterdir()) == []


def test_grafana_export_does_not_follow_a_symlink_that_appears_after_its_check(tmp_path, monkeypatch):
    target = precious(tmp_path)
    out = tmp_path / "out"
    dashboards.export(out)
    (out / "dashboards" / "testbed" / "fabric.json").unlink()
    (out / "dashboards" / "testbed" / "fabric.json").symlink_to(target)
    monkeypatch.setattr(dashboards, "_check_directory", lambda directory: None)  # as if it came just after
    with pytest.raises(BadUsage, match="fabric.json: is a symlink"):
        dashboards.export(out)
    assert target.read_text() == MINE


# -- run --out ---------------------------------------------------------------------------------------
def test_run_out_with_dot_dot_after_a_missing_directory_leaves_nothing(tmp_path):
    (tmp_path / "W").mkdir()
    with pytest.raises(BadUsage) as caught:
        new_directory("e", tmp_path / "W" / "a" / ".." / "dd")
    assert f"{tmp_path / 'W' / 'a'} does not exist" in one_line(caught)
    assert list((tmp_path / "W").iterdir()) == []


def test_run_out_with_dot_dot_after_an_existing_directory_makes_only_the_result(tmp_path):
    (tmp_path / "W" / "a").mkdir(parents=True)
    made = new_directory("e", tmp_path / "W" / "a" / ".." / "dd")
    assert made == tmp_path / "W" / "dd" and made.is_dir()
    assert sorted(p.name for p in (tmp_path / "W").iterdir()) == ["a", "dd"]
    assert list((tmp_path / "W" / "a").iterdir()) == []


def test_run_out_under_a_file_says_the_parent_is_not_a_directory(tmp_path):
    (tmp_path / "afile").write_text(MINE)
    for out in (tmp_path / "afile" / "sub", tmp_path / "afile" / "x" / "y"):
        with pytest.raises(BadUsage) as caught:
            new_directory("e", out)
        message = one_line(caught)
        assert f"{tmp_path / 'afile'} is not a directory" in message and "already exists" not in message
    assert (tmp_path / "afile").read_text() == MINE


def test_run_out_that_exists_or_is_a_symlink_is_never_reused(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out in (tmp_path / "done", tmp_path / "dangling"):
        with pytest.raises(BadUsage, match="already exists; results are never overwritten"):
            new_directory("e", out)
    assert not (tmp_path / "nowhere").exists()


def test_run_out_that_cannot_be_made_removes_the_parents_it_made(tmp_path, monkeypatch):
    wanted = tmp_path / "new" / "deeper" / "run"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == wanted:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(BadUsage) as caught:
        new_directory("e", wanted)
    assert "cannot create" in one_line(caught) and "Permission denied" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_run_out_makes_missing_parents(tmp_path):
    made = new_directory("e", tmp_path / "a" / "b" / "run")
    assert made.is_dir() and list(made.iterdir()) == []
