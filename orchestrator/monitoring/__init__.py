"""Monitoring a live lab: a Prometheus per lab, run by the orchestrator, scraping the agents.

`targets` says what to scrape (file_sd groups labelled with the lab and node), `prometheus`
writes its configuration, starts it on 127.0.0.1 with a data directory under the lab's
state, journals it (so `testbed down` and `testbed clean` stop it) and stops it.
"""

from orchestrator.monitoring.prometheus import Monitor, monitor_down, monitor_status, monitor_up

__all__ = ["Monitor", "monitor_down", "monitor_status", "monitor_up"]
