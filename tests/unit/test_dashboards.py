"""The Grafana dashboards as generated: a lint (the datasource variable everywhere, every panel
titled and with a unit, every selector scoped to $lab, every range $__rate_interval), and
`testbed grafana export`, which writes them with their provisioning and refuses a directory
holding anything else. Grafana itself is not installed here: the live test
(tests/netns/test_dashboards_live.py) runs every query against a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from orchestrator.errors import BadUsage
from orchestrator.monitoring import dashboards

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GROUPING = re.compile(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)")
KEYWORDS = {"by", "on", "without", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def every_dashboard() -> dict[str, dict]:
    return {name: dashboards.dashboard_json(name) for name in dashboards.DASHBOARDS}


def panels(board: dict) -> Iterator[dict]:
    for panel in board["panels"]:
        yield from panel.get("panels", [])  # a row's panels
        if panel["type"] != "row":
            yield panel


def expressions(board: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation."""
    for panel in panels(board):
        for target in panel["targets"]:
            yield f"{board['title']} / {panel['title']} / {target['refId']}", target["expr"]
    for annotation in board["annotations"]["list"]:
        yield f"{board['title']} / annotation {annotation['name']}", annotation["expr"]


def lint_expression(expr: str) -> list[str]:
    """What is wrong with one query: a selector without the lab, a bare metric name, a range
    other than $__rate_interval."""
    problems = [f"range [{r}] is not [$__rate_interval]" for r in re.findall(r"\[([^\]]*)\]", expr)
                if r != "$__rate_interval"]
    problems += [f"selector {{{s}}} lacks lab=\"$lab\"" for s in re.findall(r"\{([^}]*)\}", expr)
                 if 'lab="$lab"' not in s.split(",")]
    bare = re.sub(r"\{[^}]*\}", "{}", GROUPING.sub("", re.sub(r"\[[^\]]*\]", "", expr)))
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        rest = bare[match.end():].lstrip()
        if match.group() in KEYWORDS or rest.startswith("(") or rest.startswith("{"):
            continue
        if bare[match.start() - 1:match.start()].isdigit():  # 1e-9's e
            continue
        problems.append(f"metric {match.group()} has no selector (lab=\"$lab\")")
    return problems


@pytest.mark.parametrize("expr, problem", [
    ('rate(testbed_x{lab="$lab"}[5m])', "range [5m]"),
    ("sum(testbed_link_up)", "metric testbed_link_up has no selector"),
    ('testbed_link_up{node="h0"}', "lacks lab"),
    ('testbed_link_up{lab="mylab"}', "lacks lab"),
    ('max by (node) (testbed_x{lab="$lab"}) / on (lab) testbed_y', "metric testbed_y has no selector"),
])
def test_the_lint_finds_what_it_looks_for(expr, problem):
    assert any(problem in p for p in lint_expression(expr)), lint_expression(expr)


def test_the_lint_passes_scoped_queries():
    assert lint_expression(
        'histogram_quantile(0.5, sum by (le, algorithm) (rate(testbed_gst_seconds_bucket{lab="$lab"}[$__rate_interval])))'
        ' / on (lab, link) max without (node) (testbed_y{lab="$lab",mode="idle"}) > 1e-9') == []


def test_every_dashboard_has_the_datasource_and_lab_variables():
    for name, board in every_dashboard().items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        lab = variables["lab"]
        assert lab["type"] == "query" and lab["datasource"] == DATASOURCE, name
        assert lab["query"] == "label_values(testbed_link_up, lab)", name
        assert board["uid"] == f"testbed-{name}" and "testbed" in board["tags"]


def test_every_panel_is_titled_with_a_unit_and_queries_through_the_datasource_variable():
    count = 0
    for board in every_dashboard().values():
        titles = [panel["title"] for panel in panels(board)]
        assert len(titles) == len(set(titles)), f"{board['title']}: two panels share a title"
        for panel in panels(board):
            count += 1
            where = f"{board['title']} / {panel.get('title')!r}"
            assert panel.get("title", "").strip(), where
            assert panel.get("description", "").strip(), where
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
            assert panel["datasource"] == DATASOURCE, where
            assert panel["targets"], f"{where}: no query"
            for target in panel["targets"]:
                assert target["datasource"] == DATASOURCE, where
                assert target["expr"].strip() and target["refId"], where
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), where
            if panel["type"] == "heatmap":  # rows as Prometheus gives them: Grafana must not re-bucket
                assert panel["options"]["calculate"] is False, where
    assert count >= 30


def test_every_query_is_scoped_to_the_lab_with_rate_interval_windows():
    problems = [f"{where}: {p}" for board in every_dashboard().values() for where, expr in expressions(board)
                for p in lint_expression(expr)]
    assert not problems, "\n".join(problems)
    for board in every_dashboard().values():
        assert any("$__rate_interval" in expr for _, expr in expressions(board)), board["title"]


def test_fault_annotations_are_on_every_dashboard():
    for board in every_dashboard().values():
        annotations = {a["name"]: a for a in board["annotations"]["list"]}
        active = annotations["Faults in effect"]
        assert active["datasource"] == DATASOURCE and "testbed_fault_active" in active["expr"]
        assert active["tagKeys"] == "action,target" and "{{action}}" in active["titleFormat"]
        assert "testbed_fault_events_total" in annotations["Fault events"]["expr"]


def test_the_issue_asks_for_these_views():
    """The panels issue 16 names, by the metric each must show."""
    shown = {name: " ".join(expr for _, expr in expressions(board)) for name, board in every_dashboard().items()}
    wanted = {
        "experiment": ["testbed_gst_seconds_sum", "testbed_gst_seconds_bucket", "testbed_compute_seconds_sum",
                       "testbed_workers", "testbed_gradient_bytes"],
        "fabric": ["avg by (tier, pod)", "topk(", "testbed_link_qdisc_drops_total", "testbed_link_up"],
        "faults": ["testbed_fault_active", "testbed_fault_events_total"],
        "host": ["testbed_host_cpu_seconds_total", "testbed_host_cpus", "testbed_server_cpu_seconds_total",
                 "testbed_link_rate_bytes_per_second"],
    }
    for name, needles in wanted.items():
        assert [n for n in needles if n not in shown[name]] == [], name
    types = {p["type"] for board in every_dashboard().values() for p in panels(board)}
    assert {"heatmap", "timeseries", "stat", "table", "state-timeline"} <= types


# -- export -----------------------------------------------------------------------------------
def test_export_writes_dashboards_and_provisioning_that_parse(tmp_path):
    out = tmp_path / "provisioning"
    written = dashboards.export(out, "http://127.0.0.1:9999")
    assert sorted(p.relative_to(out) for p in written) == sorted(dashboards.exported_files())
    source = yaml.safe_load((out / "datasources" / "testbed.yaml").read_text())
    assert source["apiVersion"] == 1
    (prometheus,) = source["datasources"]
    assert prometheus["type"] == "prometheus" and prometheus["url"] == "http://127.0.0.1:9999"
    assert prometheus["jsonData"]["timeInterval"] == "1s"  # $__rate_interval ≥ 4 scrapes
    (provider,) = yaml.safe_load((out / "dashboards" / "testbed.yaml").read_text())["providers"]
    folder = Path(provider["options"]["path"])
    assert provider["type"] == "file" and folder.is_absolute() and folder.parent.parent == out
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(dashboards.DASHBOARDS)
    for name in dashboards.DASHBOARDS:
        assert json.loads((folder / f"{name}.json").read_text()) == dashboards.dashboard_json(name)
    # a second export into its own output replaces the files
    (folder / "host.json").write_text("{}")
    dashboards.export(out, "http://127.0.0.1:9999")
    assert json.loads((folder / "host.json").read_text())["uid"] == "testbed-host"


def _hostile(tmp_path: Path, case: str) -> tuple[Path, Path | None]:
    """An export directory that must be refused, and a file of the user's that must survive."""
    out = tmp_path / "out"
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    if case == "a file":
        return precious, precious
    if case == "a user's file":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
        return out, out / "notes.txt"
    if case == "a user's file among ours":
        dashboards.export(out)
        (out / "dashboards" / "testbed" / "mine.json").write_text("mine\n")
        return out, out / "dashboards" / "testbed" / "mine.json"
    if case == "a symlinked file of ours":  # writing through it would clobber the target
        dashboards.export(out)
        (out / "dashboards" / "testbed" / "fabric.json").unlink()
        (out / "dashboards" / "testbed" / "fabric.json").symlink_to(precious)
        return out, precious
    if case == "a symlinked folder of ours":
        (tmp_path / "elsewhere").mkdir()
        out.mkdir()
        (out / "datasources").symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere" / "testbed.yaml").write_text("mine\n")
        return out, tmp_path / "elsewhere" / "testbed.yaml"
    if case == "a folder where we write a file":
        (out / "datasources" / "testbed.yaml").mkdir(parents=True)
        (out / "datasources" / "testbed.yaml" / "keep").write_text("mine\n")
        return out, out / "datasources" / "testbed.yaml" / "keep"
    raise AssertionError(case)


HOSTILE = ["a file", "a user's file", "a user's file among ours", "a symlinked file of ours",
           "a symlinked folder of ours", "a folder where we write a file"]


@pytest.mark.parametrize("case", HOSTILE)
def test_export_refuses_a_directory_holding_anything_else(tmp_path, case):
    directory, precious = _hostile(tmp_path, case)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(BadUsage, match="grafana export .*: (it holds|it is a file)"):
        dashboards.export(directory)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert precious.read_text() == "mine\n"


def test_export_refuses_a_url_that_is_not_http(tmp_path):
    with pytest.raises(BadUsage, match="--prometheus-url"):
        dashboards.export(tmp_path / "out", "127.0.0.1:9090")
    assert not (tmp_path / "out").exists()


def run_testbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "testbed"), *args], capture_output=True, text=True,
                          timeout=60)


def test_the_command_exports_and_refuses_with_one_line(tmp_path):
    result = run_testbed("grafana", "export", str(tmp_path / "g"), "--prometheus-url", "http://127.0.0.1:9091")
    assert result.returncode == 0, result.stderr
    assert "wrote 6 files" in result.stdout
    assert "http://127.0.0.1:9091" in (tmp_path / "g" / "datasources" / "testbed.yaml").read_text()
    (tmp_path / "g" / "README").write_text("mine\n")
    result = run_testbed("grafana", "export", str(tmp_path / "g"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "README" in result.stderr, result.stderr


# -- the lab's Grafana, with a stand-in for grafana-server (Grafana is not installed here) --------
FAKE_GRAFANA = '''#!{python}
import configparser, http.server, json, sys
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
config = configparser.ConfigParser(interpolation=None)
config.read(args["config"])
with open(args["config"] + ".argv", "w") as out:
    json.dump(sys.argv[1:], out)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
server = http.server.HTTPServer((config["server"]["http_addr"], int(config["server"]["http_port"])), Health)
server.serve_forever()
'''


class FakeLab:
    """What start_grafana uses of a Lab: its name, its state directory and journal."""

    def __init__(self, root: Path) -> None:
        self.spec = type("Spec", (), {"name": "gfunit"})()
        self.journal: list = []
        self.state = type("State", (), {"dir": root, "record": lambda _, entries: self.journal.extend(entries)})()


def test_start_grafana_runs_grafana_server_on_loopback_with_the_dashboards(tmp_path, monkeypatch):
    from orchestrator.monitoring.grafana import grafana_status, start_grafana, stop_grafana

    lab = FakeLab(tmp_path / "state")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert start_grafana(lab, "http://127.0.0.1:9999") is None  # not installed: nothing to do
    binary = tmp_path / "grafana" / "bin" / "grafana-server"
    binary.parent.mkdir(parents=True)
    binary.write_text(FAKE_GRAFANA.format(python=sys.executable))
    binary.chmod(0o755)
    (tmp_path / "grafana" / "conf").mkdir()
    (tmp_path / "grafana" / "conf" / "defaults.ini").write_text("")  # a tarball's layout: home = bin/..
    monkeypatch.setenv("PATH", str(binary.parent))

    grafana = start_grafana(lab, "http://127.0.0.1:9999")
    try:
        assert grafana.url.startswith("http://127.0.0.1:") and grafana_status(lab) == grafana
        assert [(e.kind, e.extra["pid"]) for e in lab.journal] == [("process", grafana.pid)]  # clean stops it
        root = tmp_path / "state" / "monitoring" / "grafana"
        argv = json.loads((root / "grafana.ini.argv").read_text())
        assert argv == [f"--homepath={tmp_path / 'grafana'}", f"--config={root / 'grafana.ini'}"]
        config = (root / "grafana.ini").read_text()
        assert "http_addr = 127.0.0.1" in config and f"provisioning = {grafana.provisioning}" in config
        source = yaml.safe_load((grafana.provisioning / "datasources" / "testbed.yaml").read_text())
        assert source["datasources"][0]["url"] == "http://127.0.0.1:9999"
        assert start_grafana(lab, "http://127.0.0.1:9999").pid == grafana.pid  # a second start keeps it
    finally:
        stopped = stop_grafana(lab)
    assert stopped and grafana_status(lab) is None and not stop_grafana(lab)
    assert not Path(f"/proc/{grafana.pid}").exists()
