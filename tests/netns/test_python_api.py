"""The README's Python example is the faithful run (issue 30): `lab_agents.start(lab)` then
`agents.run("hips", tensors, …)` with no further arguments paces every connection at its fair
share over the hashed paths and predicts, on bcube,4,1 at 100 Mbit (12.5 MB of ResNet-50's
layout); `faithful=False` is the explicit way out. Lab: ex-api."""

from __future__ import annotations

import statistics

import pytest

from orchestrator.deploy import lab_agents
from orchestrator.control import workloads

TENSORS = workloads.model_tensors("resnet50", scale=0.122)  # 12.5 MB in 161 tensors


@pytest.fixture(scope="module")
def agents():
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    with Lab.up(lab_from_argument("bcube,4,1", name="ex-api",
                                  **{"links.bandwidth": "100Mbit", "servers.runtime": "netns"})) as lab:
        yield lab_agents.start(lab, via="exec")  # the README deploys with Ansible; the run is the same


def test_the_default_run_is_paced_and_predicted_within_the_band(agents):
    assert [e.rank for e in agents] == list(range(16)) and agents.lab.topology.kind == "bcube"
    result = agents.run("hips", TENSORS, workloads.back_to_back(TENSORS), iterations=6)  # the README's call
    assert all(r["verified"] for r in result.records() if r["iteration"] == 0)  # the warm-up, checked exactly
    predicted = result.predicted
    assert predicted is not None and predicted.per_run > 0
    seconds = statistics.mean(result.back_to_back_times())
    print(f"hips on bcube,4,1 at 100 Mbit, 12.5 MB: {seconds:.3f} s per allreduce, predicted {predicted.per_run:.3f} s, "
          f"ratio {seconds / predicted.per_run:.3f}")
    # unpaced it takes ~1.5 × the prediction; paced ~1.06 (bench/python_api.py: three pairs)
    assert 0.90 <= seconds / predicted.per_run <= 1.10


def test_opting_out_is_explicit(agents):
    result = agents.run("ring", TENSORS[:20], iterations=1, faithful=False)
    assert result.predicted is None and all(r["verified"] for r in result.records())
