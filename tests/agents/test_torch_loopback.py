"""PyTorch's gloo through the framework's launcher (frameworks/torch_gloo.py) with real
torch.distributed processes on loopback: an odd number of ranks sums exactly with each
rank's own compute waited out, DDP trains the digits MLP to identical parameters, and a
rank that fails is named at once with nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from orchestrator import frameworks
from orchestrator.errors import RunError
from orchestrator.frameworks import torch_gloo

pytestmark = pytest.mark.skipif(torch_gloo.missing() is not None, reason=f"{torch_gloo.missing()}")


class LoopbackLab:
    """What the launcher uses of a lab, on this machine's loopback; `broken` nodes run a
    command that fails instead of a worker."""

    def __init__(self, broken: tuple[str, ...] = ()) -> None:
        nic = SimpleNamespace(name="lo")
        self.topology = SimpleNamespace(address_of=lambda node: "127.0.0.1",
                                        nodes={f"h{i}": SimpleNamespace(data_nics=lambda: [nic]) for i in range(8)})
        self.broken, self.started = broken, []

    def start_module(self, node, module, env, **popen):
        argv = [sys.executable, "-m", module]
        if node in self.broken:
            argv = [sys.executable, "-c", "import sys; sys.stderr.write('rank gave up\\n'); sys.exit(5)"]
        proc = subprocess.Popen(argv, env=os.environ | env, start_new_session=True, **popen)
        self.started.append(proc)
        return proc


def _job(lab, nodes, workload, compute=None, iterations=4, seen=None) -> frameworks.Job:
    return frameworks.Job(lab, nodes, [3000, 1000], workload, compute, iterations, timeout=60,
                          on_iteration=(seen.append if seen is not None else lambda i: None))


def test_three_ranks_sum_exactly_and_wait_out_their_own_compute():
    lab, seen = LoopbackLab(), []
    compute = [[0.0, 0.05, 0.0]] * 4  # h1 the straggler, every iteration
    result = torch_gloo.run(_job(lab, ["h0", "h1", "h2"], SimpleNamespace(kind="tensors"), compute, seen=seen))
    assert result.checker["clean"] is True, result.checker
    assert len(result.records) == 12 and all(r["verified"] for r in result.records)
    assert seen == [1, 2, 3, 4]  # rank 0's iterations, as they ended
    slow = [r["compute_s"] for r in result.records if r["rank"] == 1]
    assert all(0.05 <= s < 0.2 for s in slow), slow
    # the others wait for it inside the allreduce: their GST carries the skew
    assert min(r["gst_s"] for r in result.records if r["rank"] != 1 and r["iteration"] > 0) > 0.03
    assert all(p.poll() is not None for p in lab.started)


def test_ddp_trains_the_digits_mlp_to_identical_parameters():
    digits = SimpleNamespace(kind="digits", hidden=16, lr=0.5, batch=16, seed=2)
    result = torch_gloo.run(_job(LoopbackLab(), ["h0", "h1", "h2"], digits, iterations=12))
    assert result.checker["clean"] is True, result.checker
    by_iteration = {}
    for record in result.records:
        by_iteration.setdefault(record["iteration"], set()).add(record["param_digest"])
    assert all(len(digests) == 1 for digests in by_iteration.values())
    assert len({next(iter(d)) for d in by_iteration.values()}) == 12  # the parameters moved every step
    losses = [r["loss"] for r in result.records if r["rank"] == 0]
    assert losses[-1] < losses[0]


def test_a_rank_that_fails_is_named_at_once_and_nothing_is_left_running():
    lab = LoopbackLab(broken=("h2",))
    began = time.monotonic()
    with pytest.raises(RunError, match=r"torch rank 2 on h2: rank gave up \(0 of 4 iterations\)"):
        torch_gloo.run(_job(lab, ["h0", "h1", "h2"], SimpleNamespace(kind="back-to-back")))
    assert time.monotonic() - began < 30  # not the rendezvous's 60 s: the others are stopped
    # ... by the end of their stdin (exit 3), which reaches a worker inside a container too
    assert [p.returncode for p in lab.started] == [3, 3, 5]
