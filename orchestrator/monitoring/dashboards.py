"""Grafana dashboards of a lab, built as code (grafana-foundation-sdk), and the provisioning
files that load them into a Grafana.

    experiment   GST per algorithm (slowest worker, quantiles, distribution), iteration time,
                 algbw and busbw as NCCL-tests define them, bytes each worker sends
    fabric       link utilisation by topology tier and pod as a heatmap, busiest link
                 directions, queue drops, overlimits and backlog, link states
    faults       what the fault injector did (testbed_fault_*), and its effect on links,
                 targets and GST
    host         the machine under the lab: CPU headroom, servers' CPU and memory, achieved
                 against configured link rates, scrape costs

Every dashboard has two variables: `datasource` (any Prometheus) and `lab` (the values of the
lab label). Every panel and every query uses `${datasource}`, every selector `lab="$lab"`, and
every range `[$__rate_interval]` (at least 4 scrapes, so rate() always has two points when a
dashboard is zoomed in, and averages rather than samples when zoomed out). Fault annotations
are on every dashboard: a fault's effect shows where it happens.

`export(directory, prometheus_url)` writes the dashboards as JSON and a provisioning tree
Grafana reads with `paths.provisioning = directory`:

    datasources/testbed.yaml        a Prometheus datasource at prometheus_url
    dashboards/testbed.yaml         a file provider of dashboards/testbed/
    dashboards/testbed/<name>.json  the dashboards
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import Callable

import yaml
from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from orchestrator.errors import BadUsage
from orchestrator.emulation.journal import write_inside

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
DEFAULT_PROMETHEUS_URL = "http://127.0.0.1:9090"
DATASOURCE_UID = "testbed-prometheus"
TAG = "testbed"


# -- PromQL: every selector names the lab, every range is $__rate_interval -----------------------
def sel(metric: str, **matchers: str) -> str:
    labels = "".join(f',{key}="{value}"' for key, value in matchers.items())
    return f'{metric}{{lab="$lab"{labels}}}'


def rate(metric: str, **matchers: str) -> str:
    return f"rate({sel(metric, **matchers)}[{RATE}])"


def increase(metric: str, **matchers: str) -> str:
    return f"increase({sel(metric, **matchers)}[{RATE}])"


def utilisation() -> str:
    """Each link direction's share of its configured rate (rules.yml's ratio5s, any window).
    group_left keeps the direction's other labels (tier, pod): a one-to-one `on` would keep
    only the matched ones."""
    return (f"{rate('testbed_link_transmit_bytes_total')} / on (lab, link, src, dst) group_left "
            f"{sel('testbed_link_rate_bytes_per_second')}")


def gst_by_node(by: str = "node, algorithm") -> str:
    """Mean GST of each agent over the window."""
    return (f"sum by ({by}) ({rate('testbed_gst_seconds_sum')}) / "
            f"sum by ({by}) ({rate('testbed_gst_seconds_count')})")


def slowest_gst() -> str:
    # the slowest agent's GST is the iteration's (RunResult.gst)
    return f"max ({gst_by_node('node')})"


def algbw() -> str:
    return f"max ({sel('testbed_gradient_bytes')}) / {slowest_gst()}"


def busbw() -> str:
    workers = f"max ({sel('testbed_workers')})"
    return f"{algbw()} * (2 * ({workers} - 1) / {workers})"


# -- panels ---------------------------------------------------------------------------------------
Query = tuple[str, str]  # (PromQL, legend)


def target(expr: str, legend: str, ref: str, fmt: PromQueryFormat = PromQueryFormat.TIME_SERIES,
           instant: bool = False) -> prometheus.Dataquery:
    query = (prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
             .format(fmt))
    return query.instant() if instant else query.range()


def _panel(panel, title: str, unit: str, description: str, queries: list[Query], width: int, height: int,
           fmt: PromQueryFormat = PromQueryFormat.TIME_SERIES, instant: bool = False):
    panel = panel.title(title).description(description).unit(unit).datasource(DATASOURCE).span(width).height(height)
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(target(expr, legend, chr(ord("A") + index), fmt, instant))
    return panel


def graph(title: str, unit: str, description: str, *queries: Query, width: int = 12, height: int = 8):
    return _panel(timeseries.Panel(), title, unit, description, list(queries), width, height)


def rows(title: str, unit: str, description: str, query: Query, fmt: PromQueryFormat = PromQueryFormat.TIME_SERIES,
         y_unit: str = "", width: int = 12, height: int = 9):
    """A heatmap whose rows are the query's series, coloured by value (Grafana computes no
    buckets). A ratio's colours span 0 to 1 whatever the data; a histogram's (`fmt` heatmap:
    Prometheus buckets, de-accumulated by Grafana) span its counts."""
    # Grafana's own defaults for steps and exponent (the SDK's zeros would leave no palette)
    colours = heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges").steps(64).exponent(0.5).min(0)
    if unit == "percentunit":
        colours = colours.max(1)
    panel = heatmap.Panel().calculate(False).color(colours).cell_values(heatmap.CellValues().unit(unit))
    if y_unit:
        panel = panel.y_axis(heatmap.YAxisConfig().unit(y_unit))
    return _panel(panel, title, unit, description, [query], width, height, fmt)


def number(title: str, unit: str, description: str, *queries: Query, width: int = 6, height: int = 4):
    return _panel(stat.Panel(), title, unit, description, list(queries), width, height)


def top_table(title: str, unit: str, description: str, query: Query, width: int = 12, height: int = 8):
    return _panel(table.Panel(), title, unit, description, [query], width, height, PromQueryFormat.TABLE,
                  instant=True)


def states(title: str, description: str, query: Query, names: dict[str, tuple[str, str]], width: int = 24,
           height: int = 8):
    """A state timeline of 0/1 series, each value shown by name and colour."""
    mapping = model.ValueMap(options={value: model.ValueMappingResult(text=text, color=colour)
                                      for value, (text, colour) in names.items()})
    panel = statetimeline.Panel().mappings([mapping]).show_value(common.VisibilityMode.NEVER)
    return _panel(panel, title, "none", description, [query], width, height)


# -- annotations: Grafana's Prometheus annotation fields the SDK's model lacks ----------------------
class _PrometheusAnnotationQuery(model.AnnotationQuery):
    def __init__(self, step: str, title_format: str, tag_keys: str, **fields) -> None:
        super().__init__(**fields)
        self.step, self.title_format, self.tag_keys = step, title_format, tag_keys

    def to_json(self) -> dict[str, object]:
        return super().to_json() | {"step": self.step, "titleFormat": self.title_format, "tagKeys": self.tag_keys}


class PrometheusAnnotation(cogbuilder.Builder[model.AnnotationQuery]):
    """A Prometheus annotation: every run of non-zero points of `expr` is one region, titled
    and tagged from the series' labels. `step` is a minimum: Grafana widens it for long ranges."""

    def __init__(self, name: str, expr: str, colour: str, title_format: str, tag_keys: list[str]) -> None:
        self.query = _PrometheusAnnotationQuery("1s", title_format, ",".join(tag_keys), name=name,
                                                datasource=DATASOURCE, enable=True, icon_color=colour, expr=expr)

    def build(self) -> model.AnnotationQuery:
        return self.query


def fault_annotations() -> list[PrometheusAnnotation]:
    return [
        PrometheusAnnotation("Faults in effect", f"{sel('testbed_fault_active')} > 0", "red",
                             "{{action}} {{target}}", ["action", "target"]),
        PrometheusAnnotation("Fault events", f"{increase('testbed_fault_events_total')} > 0", "orange",
                             "{{action}} {{phase}}", ["action", "phase"]),
    ]


# -- dashboards -----------------------------------------------------------------------------------
def _dashboard(uid: str, title: str, description: str, panels: list) -> board.Dashboard:
    datasource = board.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    lab = (board.QueryVariable("lab").label("Lab").datasource(DATASOURCE).query("label_values(testbed_link_up, lab)")
           .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC))
    others = (board.DashboardLink("testbed").type(model.DashboardLinkType.DASHBOARDS).tags([TAG]).as_dropdown(True)
              .include_vars(True).keep_time(True))
    dash = (board.Dashboard(title).uid(uid).description(description).tags([TAG]).editable().refresh("5s")
            .time("now-15m", "now").timezone("browser").with_variable(datasource).with_variable(lab).link(others))
    for annotation in fault_annotations():
        dash = dash.annotation(annotation)
    for panel in panels:
        dash = dash.with_panel(panel)
    return dash


def experiment() -> board.Dashboard:
    gst = gst_by_node()
    return _dashboard("testbed-experiment", "testbed: experiment", "GST per algorithm, iteration time, busbw", [
        graph("GST by algorithm (slowest worker)", "s",
              "Mean gradient synchronisation time per iteration of the slowest agent: the iteration's GST.",
              (f"max by (algorithm) ({gst})", "{{algorithm}}")),
        graph("GST quantiles by algorithm", "s", "Median and 99th percentile of every agent's GSTs.",
              (f"histogram_quantile(0.5, sum by (le, algorithm) ({rate('testbed_gst_seconds_bucket')}))",
               "p50 {{algorithm}}"),
              (f"histogram_quantile(0.99, sum by (le, algorithm) ({rate('testbed_gst_seconds_bucket')}))",
               "p99 {{algorithm}}")),
        graph("Iteration time by worker", "s", "GST plus compute time per iteration, per agent.",
              (f"(sum by (node) ({rate('testbed_gst_seconds_sum')}) + sum by (node) "
               f"({rate('testbed_compute_seconds_sum')})) / sum by (node) ({rate('testbed_gst_seconds_count')})",
               "{{node}}")),
        graph("Bus and algorithm bandwidth", "Bps",
              "NCCL-tests' definitions: algbw = gradient bytes / GST, busbw = algbw × 2(n−1)/n.",
              (busbw(), "busbw"), (algbw(), "algbw")),
        rows("GST distribution", "short", "Iterations per GST bucket (all agents).",
             (f"sum by (le) ({increase('testbed_gst_seconds_bucket')})", "{{le}}"), PromQueryFormat.HEATMAP, y_unit="s"),
        graph("Gradient bytes sent by worker", "Bps", "What each agent puts on the fabric.",
              (f"sum by (node) ({rate('testbed_bytes_sent_total')})", "{{node}}")),
        number("Iterations completed", "none", "By algorithm, on the agent that completed most.",
               (f"max by (algorithm) ({sel('testbed_iterations_total')})", "{{algorithm}}")),
        number("Workers", "none", "Ranks holding a gradient in the current run.",
               (f"max ({sel('testbed_workers')})", "workers")),
        number("Gradient size", "bytes", "Bytes the current run reduces.",
               (f"max ({sel('testbed_gradient_bytes')})", "gradient")),
        number("Failed runs", "none", "Runs the agents reported as failed.",
               (f"sum ({sel('testbed_errors_total')})", "failed")),
    ])


def fabric() -> board.Dashboard:
    util = utilisation()
    return _dashboard("testbed-fabric", "testbed: fabric", "Link utilisation, drops and states", [
        rows("Link utilisation by tier and pod", "percentunit",
             "Mean share of the configured rate over the link directions of each tier (layers joined, BCube "
             "level, torus dimension) and pod.",
             (f"avg by (tier, pod) ({util})", "{{tier}} {{pod}}")),
        rows("Link utilisation by direction", "percentunit", "Every link direction's share of its configured rate.",
             (util, "{{link}}")),
        graph("Busiest link directions", "percentunit", "The five most utilised directions at each moment.",
              (f"topk(5, {util})", "{{link}}")),
        top_table("Busiest link directions now", "percentunit", "The ten most utilised directions.",
                  (f"topk(10, {util})", "{{link}}")),
        graph("Fabric throughput by tier", "Bps", "Bytes per second sent into the links of each topology tier.",
              (f"sum by (tier) ({rate('testbed_link_transmit_bytes_total')})", "{{tier}}")),
        graph("Queue drops", "pps", "Packets the root qdisc of a direction dropped (the ten highest).",
              (f"topk(10, {rate('testbed_link_qdisc_drops_total')})", "{{link}}")),
        graph("Shaper overlimits", "cps", "Times a direction's shaper held a packet back (the ten highest).",
              (f"topk(10, {rate('testbed_link_qdisc_overlimits_total')})", "{{link}}")),
        graph("Queue backlog", "bytes", "Bytes queued in a direction (the ten highest).",
              (f"topk(10, {sel('testbed_link_qdisc_backlog_bytes')})", "{{link}}")),
        graph("Queueing delay", "s", "A direction's backlog over its rate: the wait of a packet joining it now "
              "(the ten highest).", (f"topk(10, {sel('testbed_link_queue_delay_seconds')})", "{{link}}")),
        graph("ECN marks", "pps", "Packets a marking queue (links.discipline red, codel, fq_codel) marked CE, "
              "per second (the ten highest).", (f"topk(10, {rate('testbed_link_qdisc_ecn_marks_total')})", "{{link}}")),
        number("Link directions down", "none", "Directions whose link has an end down or without carrier.",
               (f"sum (1 - {sel('testbed_link_up')})", "down")),
        states("Link states", "Each direction: up when both ends are up with carrier.",
               (sel("testbed_link_up"), "{{link}}"), {"0": ("down", "red"), "1": ("up", "green")}),
    ])


def faults() -> board.Dashboard:
    return _dashboard("testbed-faults", "testbed: faults", "Faults injected and what they did", [
        states("Faults in effect", "Each fault (action on target): in effect or undone.",
               (sel("testbed_fault_active"), "{{action}} {{target}}"), {"0": ("undone", "green"),
                                                                       "1": ("in effect", "red")}),
        graph("Fault events", "none", "Faults applied and undone, by action.",
              (f"sum by (action, phase) ({increase('testbed_fault_events_total')})", "{{action}} {{phase}}")),
        number("Faults in effect now", "none", "Faults applied and not yet undone.",
               (f"sum ({sel('testbed_fault_active')})", "faults")),
        number("Link directions down", "none", "Directions whose link has an end down or without carrier.",
               (f"sum (1 - {sel('testbed_link_up')})", "down")),
        graph("Scrape targets down", "none", "Agents (and the fabric exporter) Prometheus cannot scrape.",
              (f"sum by (job) (1 - {sel('up')})", "{{job}}")),
        graph("GST by algorithm (slowest worker)", "s", "The iteration's GST, to see a fault's effect.",
              (f"max by (algorithm) ({gst_by_node()})", "{{algorithm}}")),
    ])


def host() -> board.Dashboard:
    return _dashboard("testbed-host", "testbed: host", "Whether the machine under the lab is the bound", [
        graph("CPU headroom", "percentunit", "Share of the host's CPU time idle: near 0, the host is the bound.",
              (f"sum ({rate('testbed_host_cpu_seconds_total', mode='idle')}) / "
               f"sum ({rate('testbed_host_cpu_seconds_total')})", "idle")),
        number("Host CPUs", "none", "CPUs of the machine running the lab.", (f"max ({sel('testbed_host_cpus')})", "cpus")),
        graph("CPU of each server", "suffix: CPUs", "CPU time per second used by each server's processes.",
              (f"sum by (node) ({rate('testbed_server_cpu_seconds_total')})", "{{node}}")),
        graph("Memory of each server", "bytes", "Memory used by each server's processes.",
              (sel("testbed_server_memory_bytes"), "{{node}}")),
        graph("Achieved vs configured rate", "Bps",
              "The five busiest directions against the configured rate: a gap under load is the host's.",
              (f"topk(5, {rate('testbed_link_transmit_bytes_total')})", "{{link}}"),
              (f"max ({sel('testbed_link_rate_bytes_per_second')})", "configured")),
        number("Peak utilisation", "percentunit", "The busiest direction's share of its configured rate.",
               (f"max ({utilisation()})", "peak")),
        graph("Fabric exporter scrape time", "s", "Time the exporter takes to read every namespace's links.",
              (sel("testbed_fabric_scrape_seconds"), "fabric")),
        graph("Scrape duration by job", "s", "Prometheus's time to scrape each job's slowest target.",
              (f"max by (job) ({sel('scrape_duration_seconds')})", "{{job}}")),
    ])


DASHBOARDS: dict[str, Callable[[], board.Dashboard]] = {
    "experiment": experiment, "fabric": fabric, "faults": faults, "host": host,
}


def dashboard_json(name: str) -> dict:
    """A dashboard as Grafana's JSON model."""
    return json.loads(json.dumps(DASHBOARDS[name]().build(), cls=JSONEncoder))


# -- provisioning -----------------------------------------------------------------------------
DASHBOARD_DIR = Path("dashboards") / TAG


def datasource_provisioning(prometheus_url: str) -> dict:
    # timeInterval is the lab's scrape interval: $__rate_interval is then at least 4 s
    return {"apiVersion": 1, "datasources": [
        {"name": "testbed Prometheus", "type": "prometheus", "uid": DATASOURCE_UID, "access": "proxy",
         "url": prometheus_url, "isDefault": True, "editable": False, "jsonData": {"timeInterval": "1s"}}]}


def dashboard_provisioning(directory: Path) -> dict:
    return {"apiVersion": 1, "providers": [
        {"name": TAG, "type": "file", "folder": TAG, "disableDeletion": False, "allowUiUpdates": False,
         "updateIntervalSeconds": 30, "options": {"path": str(directory / DASHBOARD_DIR)}}]}


def exported_files() -> list[Path]:
    """Every file export() writes, relative to its directory."""
    return ([Path("datasources") / f"{TAG}.yaml", Path("dashboards") / f"{TAG}.yaml"]
            + [DASHBOARD_DIR / f"{name}.json" for name in DASHBOARDS])


def _check_directory(directory: Path) -> None:
    """Refuse a directory holding anything export() does not write (a user's files, a symlink
    that would send our writes elsewhere, the directory itself a symlink): an export never
    overwrites what it did not write."""
    if directory.is_symlink():
        raise BadUsage(f"grafana export {directory}: it is a symlink; testbed writes no file through a symlink: "
                       f"give the directory it points to, or a new one")
    if directory.exists() and not directory.is_dir():
        raise BadUsage(f"grafana export {directory}: it is a file, not a directory: pick a new or empty directory")
    if not directory.exists():
        return
    files = {str(f) for f in exported_files()}
    folders = {str(p) for f in exported_files() for p in f.parents if p != Path(".")}
    for root, subdirs, names in os.walk(directory):  # symlinked folders are listed, not entered
        for entry in subdirs + names:
            path = Path(root) / entry
            relative = str(path.relative_to(directory))
            ours = (relative in folders and path.is_dir()) or (relative in files and path.is_file())
            if path.is_symlink() or not ours:
                raise BadUsage(f"grafana export {directory}: it holds {relative}, which grafana export does not "
                               f"write: pick a new or empty directory")


def export(directory: Path, prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> list[Path]:
    """Write the dashboards and their provisioning into `directory` (new, empty, or a previous
    export's); returns the files written."""
    if urllib.parse.urlsplit(prometheus_url).scheme not in ("http", "https") or "://" not in prometheus_url:
        raise BadUsage(f"--prometheus-url {prometheus_url!r} is not an http(s) URL: give one such as "
                       f"{DEFAULT_PROMETHEUS_URL} (testbed monitor status LAB prints a lab's)")
    directory = Path(os.path.abspath(directory))
    _check_directory(directory)
    written = []
    texts = {Path("datasources") / f"{TAG}.yaml": yaml.safe_dump(datasource_provisioning(prometheus_url), sort_keys=False),
             Path("dashboards") / f"{TAG}.yaml": yaml.safe_dump(dashboard_provisioning(directory), sort_keys=False)}
    texts |= {DASHBOARD_DIR / f"{name}.json": json.dumps(dashboard_json(name), indent=2, ensure_ascii=False) + "\n"
              for name in DASHBOARDS}
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadUsage(f"grafana export {directory}: cannot create it: {exc.strerror or exc}: pick a directory you "
                       f"can write") from None
    for relative, text in texts.items():
        try:  # never through a symlink, should one appear after the check above
            written.append(write_inside(directory, relative, text))
        except BadUsage as exc:
            raise BadUsage(f"grafana export {directory}: {exc}") from None
    return written
