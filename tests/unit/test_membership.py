"""Re-forming a collective over the survivors (collectives/membership.py): which ranks the
live servers get and which options change with them."""

from __future__ import annotations

import pytest

from orchestrator.collectives.context import Context
from orchestrator.collectives.registry import reform

WORKERS = [f"w{i}" for i in range(5)]


def test_survivors_are_renumbered_in_order_with_a_rings_order_remapped():
    ctx = Context(5, None, (), {"order": [4, 3, 2, 1, 0]})
    m = reform("ring", ctx, WORKERS, [], {"w1"})
    assert m.ranks == {"w0": 0, "w2": 1, "w3": 2, "w4": 3}
    assert m.ctx.workers == 4 and m.ctx.options["order"] == [3, 2, 1, 0]


def test_separate_parameter_servers_keep_one_shard_each_and_follow_the_workers():
    ctx = Context(5, None, (), {"shards": 2})
    m = reform("ps", ctx, WORKERS, ["s0", "s1"], {"w0", "s1"})
    assert m.ranks == {"w1": 0, "w2": 1, "w3": 2, "w4": 3, "s0": 4}
    assert m.ctx.options["shards"] == 1
    with pytest.raises(ValueError, match="every parameter server"):
        reform("ps", ctx, WORKERS, ["s0", "s1"], {"s0", "s1"})


@pytest.mark.parametrize("shards,dead,expected", [(5, {"w2"}, 4), (5, {"w0", "w4"}, 3), (2, {"w0"}, 2)])
def test_colocated_shards_never_outnumber_the_live_workers(shards, dead, expected):
    """16 colocated shards on 16 workers (the HiPS table's PS) lose a worker: 15 shards."""
    m = reform("ps", Context(5, None, (), {"colocated": True, "shards": shards}), WORKERS, [], dead)
    assert m.ctx.options["shards"] == expected and m.ctx.workers == 5 - len(dead)


@pytest.mark.parametrize("algorithm", ["bml", "hips"])
def test_bml_and_hips_keep_their_ranks_and_are_told_who_failed(algorithm):
    m = reform(algorithm, Context(5, None, tuple(WORKERS), {}), WORKERS, [], {"w3", "w1"})
    assert m.ranks == {"w0": 0, "w2": 2, "w4": 4}
    assert m.ctx.options["failed"] == ["w1", "w3"] and m.ctx.workers == 5


def test_nobody_left_is_an_error():
    with pytest.raises(ValueError, match="every worker"):
        reform("ring", Context(2, None, (), {}), ["a", "b"], [], {"a", "b"})
