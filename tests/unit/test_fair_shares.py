"""Each transfer's fair share of the link (cost.shares), what the agents pace at, and the
plan fields that carry it to them (agent.plan)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.agent import plan as plan_format
from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network
from orchestrator.cost.compiled import build_schedules
from orchestrator.cost.routes import Routes
from orchestrator.cost.shares import fair_shares
from tests.unit.conftest import make_topology


def shares_of(kind: str, algorithm: str, options: dict | None = None, workers: int | None = None, **params):
    topology = make_topology(kind, **params)
    schedules, nodes = build_schedules(topology, algorithm, 4_000_000, workers=workers, options=options)
    return schedules, nodes, fair_shares(Routes(topology), schedules, nodes)


@pytest.mark.parametrize("servers", [3, 4, 7])
def test_a_mesh_on_a_star_shares_every_link_among_the_peers(servers):
    _, _, shares = shares_of("star", "mesh", servers=servers)
    assert shares and all(share == pytest.approx(1 / (servers - 1)) for share in shares.values())


def test_a_ring_has_each_link_to_itself():
    _, _, shares = shares_of("star", "ring", servers=5)
    assert shares and set(shares.values()) == {1.0}


def test_separate_parameter_servers_bound_by_their_downlinks():
    # 12 workers push to 4 servers: a server's downlink takes 12 connections, a worker's
    # uplink only 4, so max-min gives every push 1/12 (and every pull, symmetrically)
    schedules, _, shares = shares_of("star", "ps", {"shards": 4}, workers=12, servers=16)
    assert len(shares) == 2 * 12 * 4
    assert all(share == pytest.approx(1 / 12) for share in shares.values())


def test_hips_on_bcube_shares_each_nic_among_its_group():
    # every step of HiPS on BCube(4,1): each NIC sends to and receives from its 3 group peers
    _, _, shares = shares_of("bcube", "hips", n=4, k=1)
    assert shares and all(share == pytest.approx(1 / 3) for share in shares.values())


def test_a_hand_worked_step():
    # star,4: h0→h1 and h0→h2 share h0's uplink (1/2 each); h3→h1 shares h1's downlink with
    # h0→h1, which is frozen at 1/2, so h3→h1 gets the other half
    topology = make_topology("star", servers=4)
    schedule = Schedule("hand", 4, 100)
    first = [Transfer(0, 1, 0, 10, "reduce"), Transfer(0, 2, 10, 10, "reduce"), Transfer(3, 1, 20, 10, "reduce")]
    schedule.add_step(first)
    schedule.add_step([Transfer(2, 3, 0, 10, "copy")])  # a step alone: the whole link
    nodes = [s.name for s in topology.servers]
    shares = fair_shares(Routes(topology), [(Partition(0, 0, 100), schedule)], nodes)
    assert [shares[(0, 0, t)] for t in first] == pytest.approx([0.5, 0.5, 0.5])
    assert shares[(0, 1, Transfer(2, 3, 0, 10, "copy"))] == 1.0


def test_transfers_on_one_connection_each_carry_its_share():
    """h0 writes two transfers to h1 on one connection and h2 one: h1's downlink is split
    between the two connections, and both of h0's transfers carry its connection's half
    (the agent paces the connection at it while it writes either, pacing.py)."""
    topology = make_topology("star", servers=3)
    schedule = Schedule("hand", 3, 100)
    pair = [Transfer(0, 1, 0, 10, "reduce"), Transfer(0, 1, 50, 30, "copy")]
    schedule.add_step(pair + [Transfer(2, 1, 20, 10, "reduce")])
    shares = fair_shares(Routes(topology), [(Partition(0, 0, 100), schedule)], [s.name for s in topology.servers])
    assert [shares[(0, 0, t)] for t in pair] == [0.5, 0.5]
    assert shares[(0, 0, Transfer(2, 1, 20, 10, "reduce"))] == 0.5


def test_plans_carry_shares_and_the_link_rate_only_when_paced():
    topology = make_topology("star", servers=4)
    schedules, nodes = build_schedules(topology, "mesh", 400_000)
    shares = fair_shares(Routes(topology), schedules, nodes)
    rate = Network(100e6).payload_rate
    paced = [plan_format.parse(text) for text in plan_format.build_rank_plans(schedules, 4, shares, rate)]
    sends = [send for plans in paced for p in plans for step in p.steps for send in step.sends]
    assert sends and all(send.share == pytest.approx(1 / 3) for send in sends)
    text = plan_format.build_rank_plans(schedules, 4, shares, rate)[0]
    assert plan_format.link_rate(text) == pytest.approx(100e6 / 8 * 1448 / 1514)
    plain = plan_format.build_rank_plans(schedules, 4)
    assert plan_format.link_rate(plain[0]) == 0.0 and "link_bytes_per_second" not in json.loads(plain[0])
    assert all(send.share == 1.0 for p in plan_format.parse(plain[0]) for step in p.steps for send in step.sends)
    # a plan from before pacing (five fields per send) still parses
    assert plan_format.parse(plain[0])[0].steps[0].sends[0].nic == -1


def test_the_payload_rate_of_a_link_leaves_out_every_header():
    # what agents pace at: TCP's pacing counts payload bytes, HTB every header of every frame
    links = SimpleNamespace(bandwidth=1e9, delay=0.0, mtu=9000)
    assert Network.from_links(links).payload_rate == pytest.approx(1e9 / 8 * (9000 - 52) / 9014)
