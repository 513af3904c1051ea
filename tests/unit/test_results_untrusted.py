"""results.json as untrusted input (issue 27): `report` and `compare` take any directory.

results.load reads only a regular file (no symlink, FIFO or device; nothing blocks) of at
most MAX_RESULTS_BYTES, nested at most MAX_DEPTH levels, every number finite and within
±MAX_NUMBER, and checks what report/plots/compare read against a schema that lets other keys
pass. Each refusal is one BadUsage line naming the file and the dotted field; through the CLI,
exit code 2 and one line on stderr, never a traceback. Also here: the results table the CLI
prints keeps every cell whole when its output is not a terminal.

Every file is made inside tmp_path; a FIFO stands for every non-regular file.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator import cli
from orchestrator.errors import BadUsage
from orchestrator.experiment import compare, report
from orchestrator.experiment.results import MAX_DEPTH, MAX_RESULTS_BYTES, load
from tests.unit.test_experiment_report import point, results, write

ROOT = Path(__file__).resolve().parents[2]
LONGEST = 400  # characters of a refusal: one short line


def run_testbed(*args: str) -> subprocess.CompletedProcess:
    """The installed `testbed`, its output a pipe and no COLUMNS: as in a CI log. The timeout
    only stops a hang (a FIFO as results.json once blocked report and compare forever)."""
    script = Path(sys.executable).parent / "testbed"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=60)


def one_line_error(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr[-2000:]
    return done.stderr


def good() -> dict:
    data = results([point(0, "ring", 1.0, 0.95, moved={"h0→s0": 10_000_000}), point(1, "hips", 0.5, 0.5)],
                   monitoring=True)
    data["points"][0]["checker"] = {"clean": True, "summary": "4 iterations, nothing lost"}
    return copy.deepcopy(data)  # results() shares its labs' tiers between calls


def refusal(directory: Path) -> str:
    """The one-line BadUsage that loading `directory` raises."""
    with pytest.raises(BadUsage) as caught:
        load(directory)
    message = str(caught.value)
    assert "\n" not in message and len(message) <= LONGEST, message[:1000]
    assert caught.value.exit_code == 2
    return message


def with_text(tmp_path: Path, text: str, name: str = "run") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "results.json").write_text(text)
    return directory


def changed(change) -> dict:
    data = good()
    change(data)
    return data


def _set(path: tuple, value):
    def change(data):
        for part in path[:-1]:
            data = data[part]
        data[path[-1]] = value
    return change


def _delete(key: str):
    def change(data):
        del data[key]
    return change


# -- numbers: finite, within ±MAX_NUMBER, as the field allows ---------------------------------------
# (raw text spliced into valid JSON, field shown in the refusal)
NUMBERS = {
    "NaN": ("ratio", "NaN", "points.0.ratio: NaN is refused"),
    "Infinity": ("ratio", "Infinity", "points.0.ratio: Infinity is refused"),
    "-Infinity": ("algbw_bytes_per_s", "-Infinity", "points.0.algbw_bytes_per_s: -Infinity is refused"),
    "1e309 (json makes it inf)": ("ratio", "1e309", "points.0.ratio: 1e309 is refused"),
    "1e308 (finite, past every bound)": ("ratio", "1e308", "points.0.ratio: 1e308 is refused"),
    "an integer of 5000 digits": ("size_bytes", "9" * 5000, "points.0.size_bytes: 999"),
}


@pytest.mark.parametrize("case", NUMBERS, ids=list(NUMBERS))
def test_numbers_out_of_range_are_refused_naming_the_field(tmp_path, case):
    key, raw, expected = NUMBERS[case]
    data = good()
    data["points"][0][key] = "SPLICE"
    directory = with_text(tmp_path, json.dumps(data).replace('"SPLICE"', raw))
    message = refusal(directory)
    assert message.startswith(f"{directory / 'results.json'}: ") and expected in message, message


def test_a_fault_time_of_1e308_is_refused_before_summary_md_shows_it(tmp_path):
    # once: OverflowError (timestamp out of range) while writing summary.md
    for value, expected in ((1e308, "is refused"), (1e12, "must lie between 0 and 253402300799")):
        data = changed(_set(("points", 0, "fault_events", 0, "applied"), value))
        directory = write(tmp_path / f"run-{value:g}", data)
        message = refusal(directory)
        assert "points.0.fault_events.0.applied: " in message and expected in message, message


# -- types and shape --------------------------------------------------------------------------------
SHAPES = {
    "missing points": (_delete("points"), "points: required but missing"),
    "points is a string": (_set(("points",), "abc"), "points: input should be a valid list (got 'abc')"),
    "a point is a number": (_set(("points", 1), 3), "points.1: input should be a valid dictionary"),
    "size as a string": (_set(("points", 0, "size_bytes"), "1048576"),
                         "points.0.size_bytes: input should be a valid integer (got '1048576')"),
    "size as a boolean": (_set(("points", 0, "size_bytes"), True), "points.0.size_bytes: input should be a valid"),
    "workers a number": (_set(("points", 0, "workers"), 2), "points.0.workers: input should be a valid list"),
    "a GST of text": (_set(("points", 0, "gst_s", "mean"), "fast"), "points.0.gst_s.mean: input should be a valid"),
    "iterations of null": (_set(("points", 0, "gst_s", "per_iteration"), [1.0, None]),
                           "points.0.gst_s.per_iteration.1: input should be a valid number"),
    "a verdict of a number": (_set(("points", 0, "fidelity", "verdict"), 1), "points.0.fidelity.verdict: "),
    "reasons of numbers": (_set(("points", 1, "fidelity", "reasons"), [1]), "points.1.fidelity.reasons.0: "),
    "checker clean as 1": (_set(("points", 0, "checker", "clean"), 1), "points.0.checker.clean: "),
    "a fault event without action": (_set(("points", 0, "fault_events", 0), {"target": "h0-s0"}),
                                     "points.0.fault_events.0.action: required but missing"),
    "a record without iteration": (_set(("points", 0, "records", 0), {"start_time": 1.0}),
                                   "points.0.records.0.iteration: required but missing"),
    "a tier of a number": (_set(("labs", 0, "tiers", "h0→s0"), 0), "labs.0.tiers.h0→s0: "),
    "labs a mapping": (_set(("labs",), {}), "labs: input should be a valid list"),
    "a monitor's start as text": (_set(("monitoring", "ex-unit", "started"), "soon"),
                                  "monitoring.ex-unit.started: input should be a valid number"),
    "experiment name a list": (_set(("experiment", "name"), ["x"]), "experiment.name: input should be a valid string"),
    "moved bytes of text": (_set(("points", 0, "bytes_per_link", "measured", "h0→s0"), "many"),
                            "points.0.bytes_per_link.measured.h0→s0: "),
    "status missing": (_delete("status"), "status: required but missing"),
    "a predicted part of text": (_set(("points", 0, "predicted", "parts"), {"latency": "most"}),
                                 "points.0.predicted.parts.latency: input should be a valid number"),
    "α of text": (_set(("points", 0, "predicted", "latency_s"), "1ms"), "points.0.predicted.latency_s: "),
    "a degraded iteration of text": (_set(("points", 0, "under_faults"), [
        {"action": "link-degrade", "target": "h0-s0", "rate": "10Mbit", "iterations": ["three"]}]),
        "points.0.under_faults.0.iterations.0: input should be a valid integer"),
}


@pytest.mark.parametrize("case", SHAPES, ids=list(SHAPES))
def test_wrong_types_and_missing_keys_are_one_line_naming_the_field(tmp_path, case):
    change, expected = SHAPES[case]
    directory = write(tmp_path / "run", changed(change))
    message = refusal(directory)
    assert message.startswith(f"{directory / 'results.json'}: ") and expected in message, message


@pytest.mark.parametrize("text, expected", [
    ("[1, 2", "not valid JSON"), ("", "not valid JSON"), ("[]", "not a results file of this testbed"),
    ('{"schema": 2}', "not a results file of this testbed"), ("NaN", "not a results file"),
])
def test_what_is_not_a_results_file_is_one_line(tmp_path, text, expected):
    assert expected in refusal(with_text(tmp_path, text))


def test_bytes_that_are_not_utf8_are_one_line(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / "results.json").write_bytes(b'{"schema": 1, "x": "\xff"}')
    assert "not UTF-8" in refusal(directory)


# -- nesting ------------------------------------------------------------------------------------------
def test_100000_deep_nesting_is_refused_without_recursion_error(tmp_path):
    depth = 100_000
    directory = with_text(tmp_path, "[" * depth + "]" * depth)
    assert f"nested deeper than {MAX_DEPTH} levels" in refusal(directory)
    data = json.dumps(good())  # deep inside a key the schema does not know
    directory = with_text(tmp_path, data[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}", "extra")
    assert f"nested deeper than {MAX_DEPTH} levels" in refusal(directory)


def test_nesting_past_the_limit_but_within_json_recursion_names_where(tmp_path):
    data = good()
    data["versions"]["deep"] = json.loads("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5))
    message = refusal(write(tmp_path / "run", data))
    assert "versions.deep.0.0" in message and f"nested deeper than {MAX_DEPTH}" in message
    data["versions"]["deep"] = json.loads("[" * (MAX_DEPTH - 5) + "]" * (MAX_DEPTH - 5))
    assert load(write(tmp_path / "ok", data))["versions"]["deep"]  # within the limit: fine


# -- what is read: a regular file of at most MAX_RESULTS_BYTES -----------------------------------------
def test_a_fifo_as_results_json_is_refused_without_blocking(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    os.mkfifo(directory / "results.json")  # nobody ever writes to it: opening it would block
    # in a child process, whose timeout turns a hang into a failure
    for args in (["report", str(directory)], ["compare", str(directory), str(directory)]):
        assert "results.json: is a FIFO, not a regular file" in one_line_error(run_testbed(*args))


def test_a_symlinked_results_json_is_refused(tmp_path):
    elsewhere = write(tmp_path / "elsewhere", good())
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / "results.json").symlink_to(elsewhere / "results.json")
    assert "results.json: is a symlink, not a regular file" in refusal(directory)


def test_a_results_json_larger_than_the_limit_is_refused_unread(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    with open(directory / "results.json", "wb") as handle:
        handle.truncate(MAX_RESULTS_BYTES + 1)  # sparse: costs no disk
    assert f"larger than {MAX_RESULTS_BYTES >> 20} MiB" in refusal(directory)


def test_a_results_json_it_may_not_read_is_one_line(tmp_path, monkeypatch):
    # as another user on someone's directory (we run as root, whom chmod does not stop)
    directory = write(tmp_path / "run", good())
    real_open = os.open

    def denied(path, flags, *args, **kwargs):
        if str(path).endswith("results.json"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    message = refusal(directory)
    assert "results.json: cannot read it: Permission denied: run as a user who may read it" in message


def test_a_missing_directory_or_a_file_is_one_line(tmp_path):
    assert "no such directory" in refusal(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    assert "file: not a directory" in refusal(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert "no results.json here" in refusal(tmp_path / "empty")


# -- what still loads ---------------------------------------------------------------------------------
def test_newer_keys_pass_and_older_files_get_defaults(tmp_path):
    data = good()
    data["from_the_future"] = {"anything": [1, "two"]}
    data["points"][0]["new_measure"] = 3.5
    data["points"][0]["gst_s"]["p99"] = 1.0
    older = data["points"][1]
    for key in ("fidelity", "fault_events", "records", "bytes_per_link", "window", "partitioning", "warmup"):
        older.pop(key, None)
    directory = write(tmp_path / "run", data)
    loaded = load(directory)
    assert loaded["from_the_future"] == {"anything": [1, "two"]}
    assert loaded["points"][0]["new_measure"] == 3.5 and loaded["points"][0]["gst_s"]["p99"] == 1.0
    assert loaded["points"][1]["fault_events"] == [] and loaded["points"][1]["records"] == []
    assert loaded["points"][0]["ratio"] == pytest.approx(1.0 / 0.95)
    names = {p.name for p in report.render(directory, loaded)}
    assert {"summary.md", "results.csv", "gst.png"} <= names
    assert compare.rows(loaded, loaded)[0].change == pytest.approx(1.0)


# -- through the command line: exit 2, one line, no traceback -----------------------------------------
def test_report_and_compare_refuse_hostile_files_in_one_line(tmp_path):
    nan = with_text(tmp_path, json.dumps(good()).replace('"ratio": 1.0526315789473684', '"ratio": NaN', 1))
    deep = with_text(tmp_path, "[" * 100_000 + "]" * 100_000, "deep")
    shapeless = write(tmp_path / "abc", changed(_set(("points",), "abc")))
    fine = write(tmp_path / "fine", good())
    assert "points.0.ratio: NaN is refused" in one_line_error(run_testbed("report", str(nan)))
    assert "nested deeper than" in one_line_error(run_testbed("report", str(deep)))
    assert "points: input should be a valid list" in one_line_error(run_testbed("compare", str(fine), str(shapeless)))
    assert not (nan / "summary.md").exists()  # refused before anything is written


# -- the results table, printed to a pipe or CI log --------------------------------------------------
LONG = "007-fattree-8-1gbit-64mib-pnone-call-halving-doubling-rabenseifner"


def test_the_results_table_keeps_every_cell_where_output_is_not_a_terminal(monkeypatch):
    data = good()
    data["points"][0]["id"] = LONG
    data["points"][1]["fidelity"]["verdict"] = "degraded"
    captured = Console(file=StringIO(), width=80)  # what rich assumes for a pipe
    monkeypatch.setattr(cli, "out", captured)
    cli._print_results(data)
    text = captured.file.getvalue()
    assert "…" not in text, text
    assert LONG in text
    header = next(line for line in text.splitlines() if "point" in line)
    assert "checker" in header and "verdict" in header and "ratio" in header
    row = next(line for line in text.splitlines() if LONG in line)
    assert "1.053" in row and "clean" in row and row.rstrip("│ ").endswith("ok")
    assert "degraded" in text


def test_report_and_compare_print_whole_tables_into_a_pipe(tmp_path):
    data = good()
    data["points"][0]["id"] = LONG
    directory = write(tmp_path / "run", data)
    done = run_testbed("report", str(directory))
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and LONG in done.stdout and "verdict" in done.stdout
    done = run_testbed("compare", str(directory), str(directory))
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and LONG in done.stdout and "verdict B" in done.stdout


def test_results_table_cells_are_not_rich_markup(monkeypatch):
    data = good()
    data["points"][0]["id"] = "[/bold] [red]x"  # rich would raise MarkupError on the closing tag
    captured = Console(file=StringIO(), width=80)
    monkeypatch.setattr(cli, "out", captured)
    cli._print_results(data)
    assert "[/bold] [red]x" in captured.file.getvalue()


# -- predict --top ------------------------------------------------------------------------------------
def test_predict_refuses_a_negative_top_in_one_line():
    assert "--top -1: " in one_line_error(run_testbed("predict", "star,4", "-a", "ring", "--top", "-1"))
    done = run_testbed("predict", "star,4", "-a", "ring", "--top", "0")
    assert done.returncode == 0, done.stderr
