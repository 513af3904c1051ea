"""bench/trace_steps.py through the real parts: a traced ring on star,4 in namespaces, its
steps beside the model's simulation of the very run it predicted. A ring is the schedule the
model follows closest (1.01-1.03 × on star,8 in bench/model_accuracy.py), so every step must
end in the run in order, near where the model has it: a misaligned allreduce (an iteration
off, the wrong first entry) would put them a whole allreduce away. And no transfer of a ring
shares a link with another step's."""

from __future__ import annotations

from bench import trace_steps
from orchestrator.emulation import cleanup


def test_a_traced_rings_steps_end_in_order_near_the_models(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))  # α measured here, kept here
    try:
        found = trace_steps.trace("star,4", "100Mbit", "ring", 2 * 2**20, iterations=3, warmup=1)
    finally:
        cleanup.clean_lab("trace-star")
    assert found["caveat"] == ""  # the model followed the allreduces in a row, as it predicted them
    steps = found["steps"]
    print(found["table"])
    # a ring of 4: 3 reduce-scatter steps and 3 all-gather steps, 4 transfers of 512 KiB each
    assert [s["step"] for s in steps] == list(range(6))
    assert all(s["transfers"] == 4 and s["bytes"] == 4 * 2**19 for s in steps)
    model = [s["model_end"] for s in steps]
    run = [s["measured_end"] for s in steps]
    assert None not in model and None not in run
    assert model == sorted(model) and run == sorted(run)
    assert all(s["slowest_end"] >= s["measured_end"] for s in steps)
    # each step a sixth of the allreduce, in the model and in the run alike
    per_step = model[-1] / 6
    for s in steps:
        assert abs(s["measured_end"] - s["model_end"]) < per_step, s
    # a ring's rank sends to one peer and hears from one: every link carries one connection,
    # whose steps queue in order, so no transfer shares a link with another step's, in the
    # run as in the model; yet every transfer of the 3 timed allreduces was counted
    for crossings in (found["crossings"], found["model_crossings"]):
        assert [(c["step"], c["transfers"], c["crossed"]) for c in crossings] == [(s, 12, 0) for s in range(6)]
    # so every transfer had its links to itself: on the wire for about its bytes at the
    # line's rate (units or the wrong link would put it 8 × or 1,000 × off), in the model
    # exactly that
    for paces in (found["paces"], found["model_paces"]):
        assert paces["crossed"]["count"] == 0 and paces["alone"]["count"] == 6 * 12, paces
    assert 0.99 < found["model_paces"]["alone"]["p50"] < 1.05, found["model_paces"]
    assert 0.8 < found["paces"]["alone"]["p50"] < 1.3, found["paces"]
    assert "alone on their links" in found["table"]
