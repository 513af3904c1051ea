"""The cost model: predict an allreduce's time from the very schedules the agents run.

Pure (no root, no I/O; imports only topology and collectives). `routes` maps every transfer
onto the lab's routing tables, `simulate` shares each link direction max-min fairly among
the connections active at each moment, honouring the agents' per-range order, `predict`
wraps it into a `Prediction` (time, algbw/busbw, bytes per link, bottlenecks), and
`closed_forms` holds REFERENCE.md's formulas to set beside it.
"""

from orchestrator.cost.network import Network, tcp_efficiency
from orchestrator.cost.compiled import build_schedules, predict
from orchestrator.cost.predict import LinkLoad, Prediction, predict_schedules

__all__ = ["LinkLoad", "Network", "Prediction", "build_schedules", "predict", "predict_schedules", "tcp_efficiency"]
