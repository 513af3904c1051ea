"""Monitoring a live lab: a Prometheus per lab, run by the orchestrator, scraping the agents
and the fabric.

`targets` says which agents to scrape (file_sd groups labelled with the lab and node),
`exporter` serves every link direction's counters read from the kernel, and `prometheus`
writes the configuration, starts both on 127.0.0.1 (data under the lab's state), journals
them (so `testbed down` and `testbed clean` stop them) and stops them.
"""

from orchestrator.monitoring.prometheus import Monitor, monitor_down, monitor_status, monitor_up

__all__ = ["Monitor", "monitor_down", "monitor_status", "monitor_up"]
