"""A user's algorithm as a plugin (issue 30): written in the test's own temporary directory,
never in the package, loaded each of the three ways (a file, an experiment's `plugins:`, an
installed entry point), checked by `check-algorithm`, and refused in one line when broken,
duplicate or unsafe, with nothing left registered.

Commands run through the real `testbed` under the hostile corpus's 1 GiB data limit."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator import plugins
from orchestrator.collectives import table, verify
from orchestrator.errors import PluginError, SpecError
from tests.unit.test_hostile_corpus import refused, run_testbed

ROOT = Path(__file__).resolve().parents[2]

# gather to rank 0, then broadcast: simple, exact, and its closed form on a star is plain
GATHER = textwrap.dedent('''
    from orchestrator.collectives import Case, Context, Form, Schedule, Transfer, register

    def build(ctx: Context, size: int, offset: int = 0, length: int | None = None) -> Schedule:
        length = size - offset if length is None else length
        schedule = Schedule("NAME", ctx.workers, size)
        schedule.add_step([Transfer(r, 0, offset, length, "reduce") for r in range(1, ctx.workers)])
        schedule.add_step([Transfer(0, r, offset, length, "COPY") for r in range(1, ctx.workers)])
        return schedule

    def closed_form(case: Case) -> Form | None:
        n = case.workers
        return Form(n - 1, 2, "(N−1)·S/B: rank 0's NIC takes the gradients in while it sends sums out")

    register("NAME", build, closed_form=closed_form, transfers=lambda ctx, length: 2 * ctx.workers)
''')


def plugin(directory: Path, name: str = "gather-bcast", file: str = "gather.py", copy: str = "copy") -> Path:
    path = directory / file
    path.write_text(GATHER.replace("NAME", name).replace("COPY", copy))
    return path


@pytest.fixture(autouse=True)
def fresh_table():
    """Each test's plugins are gone after it: the table and the loaded files as they were."""
    before, files = dict(table.ALGORITHMS), dict(plugins._files)
    yield
    table.ALGORITHMS.clear()
    table.ALGORITHMS.update(before)
    plugins._files.clear()
    plugins._files.update(files)


def test_a_file_registers_its_algorithm_once_with_its_origin(tmp_path):
    path = plugin(tmp_path)
    assert plugins.load_file(path) == ["gather-bcast"]
    assert table.ALGORITHMS["gather-bcast"].origin == str(path)
    assert plugins.load_file(path) == ["gather-bcast"]  # again: the same, not a duplicate
    outcome = verify.check("gather-bcast", verify.generic_cases())
    assert outcome.checked > 50 and not outcome.failures and not outcome.refused


def test_an_experiment_file_loads_its_plugins_relative_to_itself(tmp_path):
    from orchestrator.spec.experiment import load_experiment

    (tmp_path / "algs").mkdir()
    plugin(tmp_path / "algs")
    experiment = tmp_path / "exp.yaml"
    experiment.write_text("name: p\nplugins: [algs/gather.py]\nlab: {name: ex-p, topology: {kind: star, servers: 4}}\n"
                          "agents: {algorithms: [gather-bcast, ring], workload: {kind: back-to-back, size: 1MB}}\n")
    spec = load_experiment(experiment)
    assert [a.name for a in spec.agents.algorithms] == ["gather-bcast", "ring"]
    assert spec.plugins == ["algs/gather.py"]


def test_an_experiment_without_its_plugin_names_the_algorithm(tmp_path):
    from orchestrator.spec.experiment import load_experiment

    experiment = tmp_path / "exp.yaml"
    experiment.write_text("name: p\nlab: {name: ex-p, topology: {kind: star, servers: 4}}\n"
                          "agents: {algorithms: [gather-bcast], workload: {kind: back-to-back, size: 1MB}}\n")
    with pytest.raises(SpecError, match="gather-bcast.* is no algorithm"):
        load_experiment(experiment)


@pytest.mark.parametrize("entry, how", [("gather_mod", "a module that registers"),
                                        ("gather_mod:build", "the build callable itself")])
def test_an_installed_entry_point_is_found_by_predict_and_check_algorithm(tmp_path, entry, how):
    site = tmp_path / "site"
    site.mkdir()
    name = "gather-bcast" if entry == "gather_mod" else "gather-ep"
    source = GATHER.replace("NAME", "gather-bcast").replace("COPY", "copy")
    if entry != "gather_mod":  # the callable alone: the entry point's name registers it
        source = source[:source.index("register(")]
    (site / "gather_mod.py").write_text(source)
    info = site / "gather_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gather-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[testbed.algorithms]\n{name} = {entry}\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "predict", "star,4", "-a", name, "--size", "1MB",
                           "--bandwidth", "100Mbit", "--latency", "0s", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, (how, done.stderr)
    form = json.loads(done.stdout)["closed_form"]
    if entry == "gather_mod":  # the module registered it, closed form and all
        assert form["factor"] == 3 and form["seconds"] == pytest.approx(3 * (1 << 20) / (100e6 * 0.956 / 8), rel=0.01)
    else:
        assert form is None
    checked = subprocess.run([sys.executable, "-m", "orchestrator.cli", "check-algorithm", name, "--no-agents"],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{name} (entry point {name} = {entry})" in checked.stdout
    assert "ok   exact reduction without a topology" in checked.stdout


def test_predict_with_plugin_sets_its_closed_form_beside_the_model(tmp_path):
    path = plugin(tmp_path)
    done, _ = run_testbed("predict", "star,4", "-a", "gather-bcast", "--size", "4MB", "--bandwidth", "100Mbit",
                          "--latency", "0s", "--plugin", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(N−1)·S/B: rank 0's NIC" in done.stdout


def test_check_algorithm_passes_a_right_plugin_with_real_agents(tmp_path):
    path = plugin(tmp_path)
    done, _ = run_testbed("check-algorithm", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gather-bcast (" in done.stdout and "FAIL" not in done.stdout
    assert "ok   real agents on loopback: 4 workers, 2 iterations" in done.stdout
    assert re.search(r"ok   prediction on star,8 at 100Mbit, 4 MiB: [\d.]+ ms; closed form [\d.]+ ms \(1\.\d+ × it\)",
                     done.stdout), done.stdout


def test_check_algorithm_names_rank_step_and_bytes_of_a_wrong_plugin(tmp_path):
    path = plugin(tmp_path, name="gather-wrong", copy="reduce")  # the broadcast adds instead of copying
    done, _ = run_testbed("check-algorithm", str(path), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    first = next(line for line in done.stdout.splitlines() if "FAIL exact reduction without a topology" in line)
    # 2 workers, 1 element: rank 1 ends with its own gradient plus the sum, written by step 1 from rank 0
    assert "2 workers, 1 elements: rank 1 ends wrong on bytes [0, 4)" in first
    assert "last written in step 1, by rank 0" in first
    assert "real agents" not in done.stdout  # no agents started for a plugin that reduces wrong


def test_verify_names_the_partition_and_step(tmp_path):
    plugins.load_file(plugin(tmp_path, name="gather-wrong", copy="reduce"))
    outcome = verify.check("gather-wrong", [verify.Case(verify.Context(3), 10, partition_bytes=20)])
    assert outcome.failures == ["3 workers, 10 elements, partitions of 20 B: rank 1 ends wrong on bytes [0, 40) "
                                "(10 of 10 elements wrong): last written in partition 0, step 1, by rank 0"]


# -- broken, duplicate and unsafe plugins: one line each, nothing left registered ---------------
BROKEN = {
    "syntax": ("def build(:\n", ["bad.py:1: syntax error"]),
    "raises": ("import math\nx = math.sqrt(-1)\n", ["bad.py:2: ValueError: math domain error"]),
    "duplicate": ("from orchestrator.collectives import register\nregister('ring', lambda *a: None)\n",
                  ["bad.py:2: algorithm ring is registered already (built-in)"]),
    "nothing": ("x = 1\n", ["bad.py registers nothing", "orchestrator.collectives.register"]),
    "bad name": ("from orchestrator.collectives import register\nregister('My Alg', lambda *a: None)\n",
                 ["bad.py:2: algorithm name 'My Alg'"]),
    "memory": ("x = bytearray(1 << 40)\n", ["bad.py:1: ran out of memory while loading"]),
    "exits": ("raise SystemExit(3)\n", ["bad.py:1: SystemExit"]),
    "half registered": ("from orchestrator.collectives import register\nregister('half-one', lambda *a: None)\n"
                        "raise RuntimeError('later')\n", ["bad.py:3: RuntimeError: later"]),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_a_broken_plugin_is_refused_in_one_line(tmp_path, case):
    source, expected = BROKEN[case]
    (tmp_path / "bad.py").write_text(source)
    done, _ = run_testbed("predict", "star,4", "-a", "ring", "--latency", "0s", "--plugin", "bad.py", cwd=tmp_path)
    refused(done, *expected)
    if case != "memory":  # in process too: whatever it registered is taken out again
        before = set(table.ALGORITHMS)
        with pytest.raises(PluginError):
            plugins.load_file(tmp_path / "bad.py")
        assert set(table.ALGORITHMS) == before


def test_unsafe_plugins_are_refused(tmp_path):
    path = plugin(tmp_path)
    os.chmod(path, 0o646)
    with pytest.raises(PluginError, match="unsafe: anyone may write it"):
        plugins.load_file(path)
    os.chmod(path, 0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone may replace the file, no sticky bit
    with pytest.raises(PluginError, match="unsafe: anyone may replace it"):
        plugins.load_file(plugin(shared))
    os.chmod(shared, 0o777 | stat.S_ISVTX)  # as /tmp: the owner alone may replace it
    assert plugins.load_file(shared / "gather.py") == ["gather-bcast"]
    (tmp_path / "notes.txt").write_text("register('x', print)\n")
    with pytest.raises(PluginError, match="not a .py file"):
        plugins.load_file(tmp_path / "notes.txt")
    (tmp_path / "dir.py").mkdir()
    with pytest.raises(PluginError, match="not a regular file"):
        plugins.load_file(tmp_path / "dir.py")
    big = tmp_path / "big.py"
    with open(big, "wb") as handle:
        handle.truncate(2 << 20)
    with pytest.raises(PluginError, match="more than the 1,048,576"):
        plugins.load_file(big)
    with pytest.raises(PluginError, match="no such file"):
        plugins.load_file(tmp_path / "missing.py")


def test_an_experiment_plugin_stays_in_its_directory(tmp_path):
    inside = tmp_path / "exp"
    inside.mkdir()
    plugin(tmp_path)  # beside the experiment's directory, not in it
    (inside / "link.py").symlink_to(tmp_path / "gather.py")
    for plugins_line, expected in ((["../gather.py"], "leaves"), (["link.py"], "leaves"),
                                   ([str(tmp_path / "gather.py")], "absolute path"),
                                   ("gather.py", "a list of .py files"), (["x.py"] * 17, "more than 16")):
        with pytest.raises(PluginError, match=expected):
            plugins.load_for_experiment(plugins_line, inside / "exp.yaml")
    assert "gather-bcast" not in table.ALGORITHMS


def test_a_bad_experiment_plugin_names_the_file_and_entry(tmp_path):
    (tmp_path / "exp.yaml").write_text("name: p\nplugins: [ok.py, bad.py]\nlab: {name: ex-p, topology: {kind: star, servers: 4}}\n"
                                       "agents: {algorithms: [ring], workload: {kind: back-to-back, size: 1MB}}\n")
    plugin(tmp_path, file="ok.py")
    (tmp_path / "bad.py").write_text("x = undefined_name\n")
    done, _ = run_testbed("run", "exp.yaml", "--dry-run", cwd=tmp_path)
    refused(done, "exp.yaml: plugins[1]: plugin", "bad.py:1: NameError: name 'undefined_name' is not defined")


def test_the_readme_example_reduces_exactly_and_gives_its_form():
    assert plugins.load_file(ROOT / "examples/bidirectional_ring.py") == ["bidir-ring"]
    from orchestrator import topology as topology_lib
    from orchestrator.spec import lab_from_argument

    labs = {label: topology_lib.from_lab(lab_from_argument(label)) for label in ("star,5", "torus,3,2")}
    outcome = verify.check("bidir-ring", verify.generic_cases() + verify.topology_cases(labs))
    assert outcome.checked == 99 + 8 and not outcome.failures and not outcome.refused


# -- the review's cases: a plugin's name, its bugs in one line, all or nothing, sudo, fifos ------
def test_a_plugin_reusing_a_built_in_build_keeps_its_own_name_and_form(tmp_path):
    from orchestrator.cost.report import predict_lab
    from orchestrator.spec import lab_from_argument

    (tmp_path / "two.py").write_text(
        "from orchestrator.collectives import Form, register\n"
        "from orchestrator.collectives.algorithms import ring\n"
        "register('ring-two', ring.build, closed_form=lambda case: Form(3.0, 1, 'mine'))\n")
    plugins.load_file(tmp_path / "two.py")
    report = predict_lab(lab_from_argument("star,4"), "ring-two", 1 << 20)
    assert report.prediction.algorithm == "ring-two" and report.form.source == "mine"


BUGGY = {
    "returns junk": ("register('junk', lambda ctx, size, offset=0, length=None: None)",
                     "junk (bad.py): build returned NoneType, not a Schedule"),
    "raises": ("register('junk', lambda ctx, size, offset=0, length=None: {}['x'])",
               "junk (bad.py): building raised KeyError"),
    "form raises": ("from orchestrator.collectives.algorithms import ring\n"
                    "register('junk', ring.build, closed_form=lambda case: case.topology.facts['zz'])",
                    "its closed form raised KeyError"),
    "form not a Form": ("from orchestrator.collectives.algorithms import ring\n"
                        "register('junk', ring.build, closed_form=lambda case: 1.5)", "not a Form"),
}


@pytest.mark.parametrize("case", BUGGY, ids=list(BUGGY))
def test_a_plugins_bug_is_one_line_in_predict(tmp_path, case):
    source, expected = BUGGY[case]
    (tmp_path / "bad.py").write_text("from orchestrator.collectives import register\n" + source + "\n")
    done, _ = run_testbed("predict", "star,4", "-a", "junk", "--latency", "0s", "--plugin", "bad.py", cwd=tmp_path)
    refused(done, "junk on star-4", expected)


def test_check_algorithm_says_a_plugins_bug_without_a_traceback(tmp_path):
    (tmp_path / "bad.py").write_text(
        "from orchestrator.collectives import Schedule, register\n"
        "register('junk', lambda ctx, size, offset=0, length=None: Schedule('junk', ctx.workers, size,"
        " workers=tuple(range(1, ctx.workers + 1))))\n")
    done, _ = run_testbed("check-algorithm", "bad.py", "--no-agents", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "are not all among its" in done.stdout


def test_an_experiments_plugins_load_all_or_none(tmp_path):
    plugin(tmp_path, file="ok.py")
    (tmp_path / "bad.py").write_text("x = undefined_name\n")
    with pytest.raises(PluginError, match=r"plugins\[1\]"):
        plugins.load_for_experiment(["ok.py", "bad.py"], tmp_path / "exp.yaml")
    assert "gather-bcast" not in table.ALGORITHMS
    assert (tmp_path / "ok.py").resolve() not in plugins._files


def test_an_entry_point_may_not_take_a_registered_name(tmp_path):
    site = tmp_path / "site"
    (site / "taken-1.0.dist-info").mkdir(parents=True)
    (site / "taken_mod.py").write_text("def build(ctx, size, offset=0, length=None):\n    raise ValueError('no')\n")
    (site / "taken-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: taken\nVersion: 1.0\n")
    (site / "taken-1.0.dist-info" / "entry_points.txt").write_text("[testbed.algorithms]\nring = taken_mod:build\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "predict", "star,4", "-a", "ring", "--latency",
                           "0s"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    refused(done, "entry point ring = taken_mod:build: algorithm ring is registered already (built-in)")


def test_under_sudo_the_users_own_plugin_is_trusted(tmp_path, monkeypatch):
    path = plugin(tmp_path)
    os.chown(path, 4242, 4242)
    monkeypatch.delenv("SUDO_UID", raising=False)
    with pytest.raises(PluginError, match="owned by uid 4242"):
        plugins.load_file(path)
    monkeypatch.setenv("SUDO_UID", "4242")
    assert plugins.load_file(path) == ["gather-bcast"]


def test_a_fifo_named_like_a_plugin_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    with pytest.raises(PluginError, match="not a regular file"):
        plugins.load_file(tmp_path / "pipe.py")


def test_keep_ranks_needs_the_failed_option():
    from orchestrator.collectives import keep_ranks, register

    with pytest.raises(ValueError, match="option `failed`"):
        register("no-failed", lambda *a: None, reform=keep_ranks)
    assert "no-failed" not in table.ALGORITHMS
