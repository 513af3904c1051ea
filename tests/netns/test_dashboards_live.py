"""Every query of the Grafana dashboards returns data from a real Prometheus scraping a short
real run on a live lab (fattree,2 in bare namespaces: its links have tiers and pods).

Grafana is not installed here, so its part is played by hand: `$lab` becomes the lab's name,
`$__rate_interval` 4 s (Grafana's value for the datasource's 1 s scrape interval), and each
query goes to Prometheus's HTTP API as Grafana sends it: a range query for a graph, an instant
query for a table. Queries of metrics the lab does not export yet (NOT_YET_EXPORTED) must
return nothing, and every other one must return a finite value somewhere in the run."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import urllib.parse
import urllib.request

import pytest

from orchestrator.faults.injector import Injector
from orchestrator.monitoring import dashboards, monitor_down, monitor_up
from orchestrator.deploy import lab_agents
from orchestrator.control import driver, workloads
from tests.conftest import until
from tests.unit.test_dashboards import every_dashboard, panels

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus is not installed (./setup.sh installs it)")

# What the dashboards show that the lab does not export yet (metric names, or labels queries
# group by). Shrink it as the exporter grows: a query of a name in it that returns data fails
# the test until the name is removed (and then the run must make that name's data).
NOT_YET_EXPORTED: set[str] = set()
RATE_INTERVAL = "4s"
ELEMENTS = 1_000_000  # 4 MB: a third of a second per ring iteration at 50 Mbit


def substitute(expr: str, lab: str) -> str:
    return expr.replace("$lab", lab).replace("$__rate_interval", RATE_INTERVAL)


def api(url: str, path: str, **params) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params, doseq=True)}", timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]


def scraped(url: str, query: str, holds) -> None:
    """Wait until Prometheus's latest value of `query` (one series) satisfies `holds`."""
    def held() -> bool:
        result = api(url, "/api/v1/query", query=query)["result"]
        return bool(result) and holds(float(result[0]["value"][1]))
    until(held, f"{query} as it should be", timeout=20.0, every=0.2)


def finite(result: list[dict]) -> list[dict]:
    """The series with at least one finite sample (an instant vector's or a matrix's)."""
    def values(series: dict) -> list[float]:
        return [float(v) for _, v in series.get("values", [series.get("value", (0, "NaN"))])]
    return [s for s in result if any(math.isfinite(v) for v in values(s))]


def named(expr: str) -> set[str]:
    """Metric and grouping-label names in a query that are in NOT_YET_EXPORTED."""
    return {word for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if word in NOT_YET_EXPORTED}


def grouping_labels(expr: str) -> set[str]:
    """The labels an outermost aggregation keeps (`max by (algorithm) (…)`): its series must
    carry them, or the legend shows nothing."""
    outer = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", expr)
    return {label.strip() for label in outer.group(1).split(",")} if outer else set()


def test_every_dashboard_query_returns_data_from_a_real_run(make_lab):
    lab = make_lab("fattree,2", name="gfdash", **{"servers.runtime": "netns", "links.bandwidth": "50Mbit"})
    endpoints = lab_agents.start(lab, via="exec")
    monitor = monitor_up(lab)
    try:
        driver.wait_healthy(endpoints)
        started = time.time()
        for algorithm in ("ring", "tree"):  # two algorithms: GST "by algorithm" has two series
            driver.run(endpoints, algorithm, [ELEMENTS], workloads.emulated([ELEMENTS], compute_seconds=0.05),
                       iterations=16)
        # a fault, for the fault dashboard and the annotations: a core link down 3 s, then up
        core = next(link for link in lab.topology.links if "c" in link.a.node + link.b.node)
        injector = Injector(lab)
        fault = injector.inject("link-down", f"{core.a.node}-{core.b.node}").fault
        url = monitor.url
        links_down = substitute(f"sum (1 - {dashboards.sel('testbed_link_up')})", lab.name)
        scraped(url, links_down, lambda down: down >= 1)  # the fault is in the data, for its panels
        injector.undo(fault.id)
        middle, ended = (started + time.time()) / 2, time.time()
        scraped(url, links_down, lambda down: down == 0)  # a scrape after the undo: the run's last counters too

        labs = api(url, "/api/v1/label/lab/values", **{"match[]": "testbed_link_up"})
        assert lab.name in labs  # the `lab` variable's query, label_values(testbed_link_up, lab)

        empty, unexpected, missing_labels, checked = [], [], [], 0
        for board in every_dashboard().values():
            queries = [(f"{panel['title']}/{t['refId']}", t["expr"], t.get("instant", False))
                       for panel in panels(board) for t in panel["targets"]]
            queries += [(f"annotation {a['name']}", a["expr"], False) for a in board["annotations"]["list"]]
            for where, expr, instant in queries:
                where, query = f"{board['title']} / {where}", substitute(expr, lab.name)
                if instant:
                    result = api(url, "/api/v1/query", query=query, time=middle)["result"]
                else:
                    result = api(url, "/api/v1/query_range", query=query, start=started - 5, end=ended + 3,
                                 step=1)["result"]
                checked += 1
                data, pending = finite(result), named(expr)
                if not data and not pending:
                    empty.append(f"{where}: {query}")
                elif data and pending:
                    unexpected.append(f"{where}: {sorted(pending)} returned data: remove them from NOT_YET_EXPORTED")
                for label in grouping_labels(expr) - NOT_YET_EXPORTED:
                    if data and not any(label in s["metric"] for s in data):
                        missing_labels.append(f"{where}: no series has label {label}")
                for label in grouping_labels(expr) & NOT_YET_EXPORTED:
                    if any(label in s["metric"] for s in data):
                        unexpected.append(f"{where}: label {label} is exported: remove it from NOT_YET_EXPORTED")
        assert checked >= 30
        assert not empty, "queries with no data:\n" + "\n".join(empty)
        assert not unexpected, "\n".join(unexpected)
        assert not missing_labels, "\n".join(missing_labels)

        # and the data is the run's: two algorithms, the gradient's size, both directions of every link
        gst = api(url, "/api/v1/query_range", start=started, end=ended + 3, step=1, query=substitute(
            f"max by (algorithm) ({dashboards.gst_by_node()})", lab.name))["result"]
        assert {s["metric"]["algorithm"] for s in finite(gst)} == {"ring", "tree"}
        size = api(url, "/api/v1/query", query=substitute(f"max ({dashboards.sel('testbed_gradient_bytes')})", lab.name))
        assert float(size["result"][0]["value"][1]) == ELEMENTS * 4
        links = api(url, "/api/v1/query", time=middle, query=substitute(dashboards.utilisation(), lab.name))["result"]
        assert len(links) == 2 * len(lab.topology.links)
        busiest = max(float(s["value"][1]) for s in links)
        assert 0.05 < busiest < 1.2, busiest  # a 50 Mbit link carried the run, within its shaping
    finally:
        lab_agents.stop(endpoints)
        monitor_down(lab)
