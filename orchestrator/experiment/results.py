"""The results directory of one run of an experiment, and its results.json.

    results/<name>-<UTC time>/
        experiment.yaml     the file as run (its bytes)
        results.json        everything measured: per point the GST statistics, the prediction
                            and their ratio, algbw/busbw, iteration times, bytes per link,
                            fault events, every agent's records; versions; status
        results.csv         one row per point; iterations.csv: one row per agent and iteration
        gst.png, iterations.png, links.png, summary.md   (report.py, from results.json alone)
        prometheus/         queries.json (report.py) and snapshot/<lab>/ (runner), with monitoring

results.json is written again after every point (atomically), so an interrupted or crashed
run leaves what it measured, with `status` saying how it ended: running (the process died),
complete, partial (interrupted or failed; `error` says why).

`load` reads results.json as untrusted input (`report` and `compare` take any directory): a
regular file only (not a symlink, FIFO or device; nothing blocks), at most MAX_RESULTS_BYTES,
nested at most MAX_DEPTH levels, every number finite and within ±MAX_NUMBER, and what
report.py, plots.py, snapshot.py and compare.py read checked against the models below (other
keys pass, so newer files still load). Each refusal is one BadUsage line naming the file and
the dotted field: `run/results.json: points.0.size_bytes: input should be a valid integer`.
"""

from __future__ import annotations

import datetime
import errno
import json
import math
import os
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator import files
# re-exported: calibrate, the reports and the benches read iterations through results
from orchestrator.control.iterations import (entry_spread, iteration_spans, iteration_times,  # noqa: F401
                                             iterations_within, sync_times)
from orchestrator.emulation.journal import write_inside
from orchestrator.errors import BadUsage
from orchestrator.spec.loader import display_path, one_line
from orchestrator.units import shown

SCHEMA = 1
RESULTS = "results.json"
EXPERIMENT = "experiment.yaml"


def utc_stamp(moment: datetime.datetime | None = None) -> str:
    return (moment or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def new_directory(name: str, out: Path | None) -> Path:
    """The run's directory, created now: `out`, or results/<name>-<UTC time> under the
    current directory. An existing directory is never reused (one line, exit 2).

    A `..` in `out` steps out of the directory before it, which must exist (as the kernel
    would have it): `W/a/../dd` is W/dd, refused when W/a does not exist. Missing parents are
    made, and removed again if the run's directory cannot be: a refusal leaves nothing.
    """
    path = out if out is not None else Path("results") / f"{name}-{utc_stamp()}"
    shown_path = display_path(path)
    path = _without_dot_dot(path, shown_path)
    exists = f"--out {shown_path}: already exists; results are never overwritten: pick a new directory"
    if os.path.lexists(path):
        raise BadUsage(exists)
    missing = []  # parents to make, outermost first
    parent = path.parent
    while not os.path.lexists(parent):
        missing.insert(0, parent)
        parent = parent.parent
    if not parent.is_dir():
        raise BadUsage(f"--out {shown_path}: {display_path(parent)} is not a directory: give a path whose parents "
                       f"are directories")
    made: list[Path] = []
    try:
        for folder in missing + [path]:
            folder.mkdir()
            made.append(folder)
    except OSError as exc:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        if isinstance(exc, FileExistsError) and made == missing:
            raise BadUsage(exists) from None
        raise BadUsage(f"--out {shown_path}: cannot create {display_path(folder)}: {exc.strerror or exc}: "
                       f"give a directory you can write") from None
    return path


def _without_dot_dot(path: Path, shown_path: str) -> Path:
    """`path` with its `..` resolved as the kernel would: the part up to the last `..`, which
    must exist, resolved; the rest kept as given."""
    parts = path.parts
    if ".." not in parts:
        return path
    last = len(parts) - 1 - parts[::-1].index("..")
    head = Path(*parts[:last + 1])
    try:
        base = head.resolve(strict=True)
    except OSError as exc:
        where = display_path(exc.filename) if exc.filename else display_path(head)
        raise BadUsage(f"--out {shown_path}: {where} does not exist, so '..' after it leads nowhere: give the "
                       f"directory without '..'") from None
    return base.joinpath(*parts[last + 1:])


def versions() -> dict:
    """What produced the numbers: package versions, Python, kernel, and the git commit."""
    found = {"python": platform.python_version(), "kernel": platform.release()}
    for package in ("testbed", "grpcio", "pydantic", "numpy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        found["git_commit"] = commit.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        found["git_commit"] = None
    return found


def write(directory: Path, results: dict) -> None:
    """results.json, atomically: a reader (or a crash) never sees half a file; never
    through a symlink (journal.write_inside)."""
    write_inside(directory, RESULTS, json.dumps(results, indent=1, default=str) + "\n")


# -- reading results.json: untrusted input ---------------------------------------------------------
# A run of 16 agents × 100 iterations × 20 points writes a few MiB; these limits only stop a
# wrong or hostile file before it costs time or memory, or a traceback.
MAX_RESULTS_BYTES = 64 << 20
MAX_DEPTH = 64  # nesting levels; results.json itself needs about 10
MAX_NUMBER = 1e18  # magnitude of any number: beyond every byte count, rate or Unix time a run records
_MAX_DIGITS = 25  # an integer longer than this is out of range anyway (and Python limits conversions)
LAST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: the last second Python's datetime can show


class _OutOfRange:
    """A number json.loads met that results.json may not hold (NaN, ±Infinity, one beyond
    ±MAX_NUMBER): kept as its text until the walk below names its field."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _float(text: str) -> float | _OutOfRange:
    number = float(text)
    return number if math.isfinite(number) and abs(number) <= MAX_NUMBER else _OutOfRange(text)


def _int(text: str) -> int | _OutOfRange:
    if len(text) > _MAX_DIGITS:
        return _OutOfRange(text)
    number = int(text)
    return number if abs(number) <= MAX_NUMBER else _OutOfRange(text)


class _Model(BaseModel):
    """What report/compare read, as written: no coercion ("1" is not 1), other keys pass."""

    model_config = ConfigDict(strict=True, extra="allow")


Number = Optional[float]
UnixTime = Annotated[float, Field(ge=0, le=LAST_TIME)]  # summary.md shows it as a time of day


class _Experiment(_Model):
    name: str
    file: str
    description: Optional[str] = None


class _Servers(_Model):
    runtime: str


class _LabSpec(_Model):
    servers: _Servers


class _Lab(_Model):
    name: str
    topology: str
    link_rate: str
    spec: _LabSpec
    rate_bytes_per_s: Number = None
    tiers: Optional[dict[str, str]] = None


class _Stats(_Model):
    mean: Number = None
    p50: Number = None
    p95: Number = None
    min: Number = None
    max: Number = None
    fault_free_mean: Number = None
    per_iteration: list[float] = []


class _Parts(_Model):
    bandwidth: Number = None
    latency: Number = None
    waiting: Number = None
    skew: Number = None


class _Predicted(_Model):
    seconds: Number = None
    planned_seconds: Number = None
    latency_s: Number = None
    peer_latency_s: Number = None
    parts: Optional[_Parts] = None
    compute: Optional[str] = None
    entry: Optional[str] = None  # "measured": predicted from when each worker entered
    routes: Optional[str] = None


class _Partitioning(_Model):
    partition_bytes: Optional[int] = None
    credit_bytes: Optional[int] = None


class _Moved(_Model):
    measured: dict[str, float] = {}
    seconds: Number = None


class _Queues(_Model):
    drops: dict[str, float] = {}
    marks: dict[str, float] = {}
    reads: Optional[int] = None
    peak_backlog_bytes: dict[str, float] = {}
    peak_queue_delay_s: dict[str, float] = {}


class _FaultEvent(_Model):
    action: str
    target: str
    planned: Optional[UnixTime] = None
    applied: Optional[UnixTime] = None
    undone: Optional[UnixTime] = None
    error: Optional[str] = None


class _UnderFault(_Model):
    action: str
    target: str
    rate: str
    iterations: list[int] = []
    alongside: list[str] = []  # other degrades in effect over the same iterations
    measured_s: Number = None
    predicted_s: Number = None
    ratio: Number = None


class _Repaced(_Model):
    at: float  # Unix time
    rates: dict[str, float] = {}  # link direction "a→b" → bit/s, those at a rate of their own from then


class _Fidelity(_Model):
    verdict: str = "–"
    reasons: list[str] = []
    cpu_idle_share: Number = None


class _Checker(_Model):
    clean: Optional[bool] = None
    summary: str = ""


class _Record(_Model):
    iteration: int
    start_time: float


class _Window(_Model):
    start: float
    end: float


class _Point(_Model):
    id: str
    lab: str
    topology: str
    link_rate: str
    size_bytes: int
    algorithm: str
    workers: list[Any]
    servers: list[Any]
    status: str
    error: Optional[str] = None
    warmup: int = 0
    partitioning: Optional[_Partitioning] = None
    predicted: Optional[_Predicted] = None
    gst_s: Optional[_Stats] = None
    sync_s: Optional[_Stats] = None
    iteration_s: Optional[_Stats] = None
    ratio: Number = None
    algbw_bytes_per_s: Number = None
    busbw_bytes_per_s: Number = None
    bytes_per_link: Optional[_Moved] = None
    queues_per_link: Optional[_Queues] = None
    fault_events: list[_FaultEvent] = []
    under_faults: list[_UnderFault] = []
    repaced: list[_Repaced] = []
    fidelity: Optional[_Fidelity] = None
    checker: Optional[_Checker] = None
    records: list[_Record] = []
    window: Optional[_Window] = None


class _Monitor(_Model):
    url: Optional[str] = None
    started: Number = None
    ended: Number = None
    snapshot: Optional[str] = None
    snapshot_error: Optional[str] = None


class ResultsFile(_Model):
    """results.json as report.py, plots.py, snapshot.py and compare.py read it."""

    status: str
    experiment: _Experiment
    started: str
    labs: list[_Lab]
    points: list[_Point]
    error: Optional[str] = None
    finished: Optional[str] = None
    wall_s: Number = None
    versions: dict[str, Any] = {}
    monitoring: Optional[dict[str, _Monitor]] = None


def load(directory: Path) -> dict:
    """results.json of `directory`, checked (above); every key the models know is present,
    with its default where the file leaves it out. One BadUsage line for anything else."""
    directory = Path(directory)
    path = directory / RESULTS
    where = display_path(path)
    raw = _read_results(directory, path, where)
    try:
        results = json.loads(raw.decode("utf-8"), parse_constant=_OutOfRange, parse_float=_float, parse_int=_int)
    except UnicodeDecodeError as exc:
        raise BadUsage(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                       f"not a results file of testbed run") from None
    except RecursionError:
        raise BadUsage(f"{where}: nested deeper than {MAX_DEPTH} levels: not a results file of testbed run") from None
    except ValueError as exc:
        raise BadUsage(one_line(f"{where}: not valid JSON: {exc}")) from None
    _check_values(results, where)
    if not isinstance(results, dict) or results.get("schema") != SCHEMA:
        raise BadUsage(f"{where}: not a results file of this testbed (schema {SCHEMA})")
    try:
        checked = ResultsFile.model_validate(results)
    except ValidationError as exc:
        raise BadUsage(one_line(f"{where}: {_describe(exc)}")) from None
    return checked.model_dump()


def _read_results(directory: Path, path: Path, where: str) -> bytes:
    """The bytes of results.json: a regular file (not a symlink), at most MAX_RESULTS_BYTES."""
    try:
        raw = files.read_regular(path, MAX_RESULTS_BYTES, follow=False)
    except files.NotRegular as exc:
        raise BadUsage(f"{where}: is {exc.kind}, not a regular file: testbed reads results only from the file "
                       f"`testbed run` wrote") from None
    except files.TooLarge:
        raw = b"x" * (MAX_RESULTS_BYTES + 1)  # said below, as for a file that grew while read
    except FileNotFoundError:
        if not directory.is_dir():
            raise BadUsage(f"{display_path(directory)}: no such directory: give a directory `testbed run` wrote") \
                from None
        raise BadUsage(f"{display_path(directory)}: no {RESULTS} here: give a directory `testbed run` wrote") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink between the lstat and the open
            raise BadUsage(f"{where}: is a symlink, not a regular file: testbed reads results only from the file "
                           f"`testbed run` wrote") from None
        if exc.errno == errno.ENOTDIR:
            raise BadUsage(f"{display_path(directory)}: not a directory: give a directory `testbed run` wrote") \
                from None
        if isinstance(exc, PermissionError):
            raise BadUsage(f"{where}: cannot read it: {exc.strerror}: run as a user who may read it, or copy the "
                           f"directory") from None
        raise BadUsage(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise BadUsage(f"{where}: not a valid file name") from None
    if len(raw) > MAX_RESULTS_BYTES:
        raise BadUsage(f"{where}: larger than {MAX_RESULTS_BYTES >> 20} MiB: not a results file of testbed run")
    return raw


def _check_values(data: Any, where: str) -> None:
    """Nesting of at most MAX_DEPTH levels, and no number out of range (NaN, ±Infinity, beyond
    ±MAX_NUMBER); the refusal names the dotted field. Iterative: no recursion to exhaust."""
    stack: list[tuple[Any, tuple]] = [(data, ())] if isinstance(data, (dict, list)) else []
    while stack:
        value, at = stack.pop()
        if len(at) > MAX_DEPTH:
            raise BadUsage(one_line(f"{where}: {_dotted(at[:8])}...: nested deeper than {MAX_DEPTH} levels: not a "
                                    f"results file of testbed run"))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(item, (dict, list)):
                stack.append((item, at + (key,)))
            elif isinstance(item, _OutOfRange):
                number = item.text if len(item.text) <= 30 else item.text[:24] + "..."
                raise BadUsage(one_line(f"{where}: {_dotted(at + (key,))}: {number} is refused: results.json holds "
                                        f"only finite numbers within ±{_LIMIT} (no NaN or Infinity)"))


def _dotted(at: tuple) -> str:
    return ".".join(one_line(str(part), 40) for part in at) or "(top)"


_LIMIT = f"{MAX_NUMBER:.0e}".replace("e+", "e")


def _describe(exc: ValidationError) -> str:
    """The first problem as `dotted.field: what is wrong (got value)`, as spec/loader.py
    words them; these models have no tagged unions, so pydantic's location is the field's."""
    error = exc.errors(include_url=False)[0]
    field = _dotted(error["loc"])
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return f"{field}: required but missing"
    if kind in ("greater_than_equal", "less_than_equal"):
        return f"{field}: must lie between 0 and {LAST_TIME:.0f} (got {shown(got)}): a Unix time"
    message = error["msg"]
    message = message[0].lower() + message[1:] if message else message
    quoted = "" if isinstance(got, (dict, list)) else f" (got {shown(got)})"
    return f"{field}: {message}{quoted}"


# -- statistics of one run ------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "min": min(values), "max": max(values)}


RECOVERY_S = 1.0  # after a link comes back, TCP's backed-off retransmission timer may wait this long


def faulted_iterations(records: list[dict], events: list[dict], history: Sequence[dict] = (),
                       settle: int = 1) -> list[int]:
    """Iterations whose compute or synchronisation overlapped a fault in effect (applied to
    undone, plus RECOVERY_S; to the end when it was never undone), and the first `settle`
    of every membership a surviving run re-formed into (`history` after its first epoch):
    the re-form is the fault's doing, and its new connections start cold like the run's
    warm-up (a rejoined BCube(4,1) HiPS: 1.5 × the model, then 1.2, 1.1)."""
    spans = iteration_spans(records)
    faults = [(e["applied"], e["undone"] + RECOVERY_S if e.get("undone") is not None else float("inf"))
              for e in events if e.get("applied") is not None]
    touched = {i for i, (begin, end) in spans.items() if any(a < end and begin < u for a, u in faults)}
    touched |= {i for epoch in history[1:] for i in range(epoch["first"], epoch["first"] + settle) if i in spans}
    return sorted(touched)


def _predicted_at(iteration: int, history: list[dict], predicted: float | None) -> float | None:
    """The point's prediction for the membership that ran `iteration`: scaled by how the
    run's own prediction for that membership compares with its first (all servers)."""
    first = history[0].get("predicted_s") if history else None
    found = predicted
    for epoch in history:
        if epoch["first"] <= iteration:
            found = predicted * epoch["predicted_s"] / first if predicted and first and epoch.get("predicted_s") \
                else predicted
    return found


def _after_warmup(values: list[float], warmup: int) -> list[float]:
    """The timed iterations: those after the warm-up, or all when the run was no longer."""
    return values[warmup:] if len(values) > warmup else values


def measured_point(point: dict, records: list[dict], gst: list[float], warmup: int, workers: int) -> dict:
    """The measured fields of a point from its agents' records and per-iteration GST. The
    ratio is the time per synchronisation (`sync_times`) over the prediction (a fault-free
    network's, for the membership of the iteration); it leaves out the iterations a fault of
    the timeline touched, and a re-formed membership's first (as many as the warm-up, at
    least one); the GST statistics keep every measured iteration."""
    stats = summary(_after_warmup(gst, warmup))
    size = point["size_bytes"]
    mean = stats["mean"]
    algbw = size / mean if mean else None
    busbw = algbw * 2 * (workers - 1) / workers if algbw is not None and workers > 1 else None
    predicted = (point.get("predicted") or {}).get("seconds")
    faulted = faulted_iterations(records, point.get("fault_events") or [], point.get("history") or [], max(1, warmup))
    iterations = iteration_times(records)
    sync = sync_times(records) if records else []
    kept = [i for i in range(len(gst)) if i >= min(warmup, len(gst) - 1) and i not in faulted]
    kept_sync = [i for i in kept if i < len(sync)]

    def fault_free(values: list[float], at: list[int]) -> float | None:
        return sum(values[i] for i in at) / len(at) if at else None

    # each iteration beside the prediction for the membership that ran it (a surviving run
    # re-formed over fewer servers is predicted again: driver.Epoch.predicted_s)
    expected = [_predicted_at(i, point.get("history") or [], predicted) for i in kept_sync]
    return {
        "gst_s": {**stats, "per_iteration": gst, "fault_free_mean": fault_free(gst, kept)},
        "sync_s": {**summary(_after_warmup(sync, warmup)), "per_iteration": sync,
                   "fault_free_mean": fault_free(sync, kept_sync)},
        "faulted_iterations": faulted,
        "ratio": sum(sync[i] for i in kept_sync) / sum(expected) if kept_sync and all(expected) else None,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": busbw,
        "iteration_s": {**summary(iterations[warmup:]), "per_iteration": iterations},
        "verified": all(r["verified"] for r in records) if records else None,
        "records": records,
    }
