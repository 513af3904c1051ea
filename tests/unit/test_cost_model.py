"""The cost model (orchestrator.cost): closed forms, hand-worked flows, every topology, the CLI.

- REFERENCE.md §2's closed forms within 2 % (α = 0, efficiency 1), over generated sizes and
  topology parameters: ring, mesh, PS (separate and colocated), halving-doubling, HiPS on
  BCube and torus, BML, HDRM; the forms themselves against REFERENCE's printed numbers;
- flows worked by hand: two flows share a link, one finishes, the survivor speeds up;
  a forwarded range pipelines chunk by chunk (no barrier between steps); latencies;
- routes: ECMP splits, the NIC a transfer names, byte conservation on every kind;
- `testbed predict` as a user runs it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.collectives.partition import Partition
from orchestrator.collectives.schedule import Schedule, Transfer
from orchestrator.cost import Network, predict, predict_schedules, tcp_efficiency
from orchestrator.cost.closed_forms import closed_form
from orchestrator.cost.predict import entry_spread
from orchestrator.cost.compiled import build_schedules
from orchestrator.cost.ranges import Ranges
from orchestrator.cost.routes import Routes
from orchestrator.cost.simulate import simulate
from tests.unit.conftest import make_topology

RATE = 100e6  # bits/s
IDEAL = Network(RATE, efficiency=1.0)  # what the closed forms count: bandwidth terms only
SETTINGS = settings(max_examples=12, deadline=None)
SIZES = st.integers(min_value=200_000, max_value=40_000_000)  # bytes


def in_units(seconds: float, size: int, network: Network = IDEAL) -> float:
    """A time in units of S/B."""
    return seconds * network.payload_rate / size


def check_form(topology, algorithm: str, size: int, expected: float | None = None, workers=None, options=None,
               chunk_bytes: int = 512 * 1024) -> float:
    """Predict, compare with the closed form (and with `expected`, REFERENCE's own figure)."""
    prediction = predict(topology, algorithm, size, IDEAL, workers=workers, options=options, chunk_bytes=chunk_bytes)
    schedules, _ = build_schedules(topology, algorithm, size, workers, options)
    form = closed_form(schedules[0][1], topology)
    assert form is not None, (algorithm, topology.kind)
    if expected is not None:
        assert form.factor == pytest.approx(expected, rel=1e-3), form.source
    got = in_units(prediction.seconds, prediction.size_bytes)
    assert got == pytest.approx(form.factor, rel=0.02), (algorithm, topology.kind, topology.params, size, form.source)
    return got


# -- closed forms ----------------------------------------------------------------------------
@SETTINGS
@given(size=SIZES, n=st.integers(2, 12))
def test_ring_and_mesh_on_a_star_take_2_n_minus_1_over_n(size, n):
    star = make_topology("star", servers=n)
    check_form(star, "ring", size, 2 * (n - 1) / n)
    check_form(star, "mesh", size, 2 * (n - 1) / n)


@SETTINGS
@given(size=SIZES, nk=st.sampled_from([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (5, 1)]))
def test_on_bcube_ring_mesh_and_colocated_ps_match_the_hips_table(size, nk):
    n, k = nk
    h, servers = k + 1, n ** (k + 1)
    bcube = make_topology("bcube", n=n, k=k)
    check_form(bcube, "ring", size, 2 * (servers - 1) / servers)
    check_form(bcube, "mesh", size, 2 * (n - 1) / n)  # relayed: every NIC carries (n−1)/n·w per phase
    check_form(bcube, "ps", size, 2 * (n - 1) / n, options={"colocated": True})
    check_form(bcube, "hips", size, 2 * (servers - 1) / (h * servers))
    check_form(bcube, "bml", size, 2 * (servers - 1) / (h * servers))


def test_hips_reproduces_the_seed_figures():
    # REFERENCE: BCube HiPS 0.938 / 0.656 / 0.498 w/B for n = 4, h = 2 / 3 / 4 (h = 4 is 256 servers: left out)
    for k, figure in ((1, 0.938), (2, 0.656)):
        assert check_form(make_topology("bcube", n=4, k=k), "hips", 12_500_000) == pytest.approx(figure, abs=5e-4)


@SETTINGS
@given(size=SIZES, kd=st.sampled_from([(3, 1), (3, 2), (4, 1), (4, 2), (5, 2), (2, 2), (2, 3)]))
def test_hips_on_a_torus_uses_both_ring_directions(size, kd):
    k, d = kd
    servers = k**d
    expected = (servers - 1) / (d * servers) * (2 if k == 2 else 1)  # k = 2: one NIC faces both ways
    check_form(make_topology("torus", k=k, d=d), "hips", size, expected)


@SETTINGS
@given(size=SIZES, kd=st.sampled_from([(3, 1), (3, 2), (5, 1), (5, 2), (4, 2), (6, 1)]))
def test_flat_mesh_on_a_torus_follows_dimension_order_routes(size, kd):
    k, d = kd
    # odd k: (k²−1)/(4k) (HiPS table); even k: the lab routes ties +1, so k/4 + 1/2, not REFERENCE's k/4
    expected = (k * k - 1) / (4 * k) if k % 2 else k / 4 + 0.5
    check_form(make_topology("torus", k=k, d=d), "mesh", size, expected)


def unbuffered(topology, algorithm: str, size: int, network: Network = IDEAL, **kwargs) -> float:
    """S/B of one allreduce with neither buffers nor pipelining: each transfer one message,
    sent only as fast as its receiver applies it, a rank's next step after its sends arrived
    (the schedule's steps in turn: what the closed forms count)."""
    schedules, nodes = build_schedules(topology, algorithm, size)
    run = simulate(Routes(topology), schedules, nodes, network, 2**40, receive_buffer_bytes=0, send_buffer_bytes=0,
                   **kwargs)
    return in_units(run.period, size, network)


@SETTINGS
@given(size=SIZES, n=st.sampled_from([2, 4, 8, 16]))
def test_halving_doubling_on_non_blocking_fabrics(size, n):
    # step by step it is the closed form; as the agents run it, a step's first bytes start
    # while the last step's still flow and share its links, so never faster than the form
    for topology, form in ((make_topology("star", servers=n), 2 * (n - 1) / n),
                           (make_topology("fattree", k=4), 2 * 15 / 16)):
        assert unbuffered(topology, "halving-doubling", size) == pytest.approx(form, rel=1e-3)
        prediction = predict(topology, "halving-doubling", size, IDEAL)
        assert in_units(prediction.seconds, size) >= form * (1 - 1e-4)


@pytest.mark.parametrize("n", [3, 5, 6, 9])
def test_halving_doubling_off_powers_of_two_against_its_schedule_by_hand(n):
    # p = 2^⌊log2 n⌋ ranks halve and double; first the n − p ranks sitting out each send S to
    # a partner (reduce) and last get S back (copy): on a star, one transfer at a time per
    # rank, S + 2(p − 1)/p·S + S
    p = 1 << (n.bit_length() - 1)
    star = make_topology("star", servers=n)
    assert unbuffered(star, "halving-doubling", 4_000_000) == pytest.approx(2 + 2 * (p - 1) / p, rel=1e-6)
    # back to back the same: the partner of a rank sitting out is on every step's critical path
    assert unbuffered(star, "halving-doubling", 4_000_000, iterations=3) == pytest.approx(2 + 2 * (p - 1) / p, rel=1e-6)


@SETTINGS
@given(size=SIZES, nm=st.sampled_from([(4, 2), (8, 2), (8, 4), (4, 1), (8, 1)]))
def test_hdrm_on_bigraph_keeps_one_flow_per_switch_link(size, nm):
    n, m = nm
    servers = n * m
    bigraph = make_topology("bigraph", switches=n, servers_per_switch=m)
    assert unbuffered(bigraph, "hdrm", size) == pytest.approx(2 * (servers - 1) / servers, rel=1e-3)
    assert in_units(predict(bigraph, "hdrm", size, IDEAL).seconds, size) >= 2 * (servers - 1) / servers * (1 - 1e-4)


@SETTINGS
@given(size=SIZES, workers=st.integers(2, 12), shards=st.integers(1, 4))
def test_ps_with_separate_servers_reaches_its_lower_bound(size, workers, shards):
    star = make_topology("star", servers=workers + shards)
    # a server pulls a message once every worker pushed it, so the pull trails the push by
    # one message: with messages of 1/200 of a shard that costs ≤ 0.5 %
    chunk = max(4, size // shards // 200)
    check_form(star, "ps", size, max(1, workers / shards), workers=workers, options={"shards": shards}, chunk_bytes=chunk)


def test_ps_separate_trails_its_bound_by_one_message_at_the_agents_message_size():
    # 12 workers, 4 servers, 25 MiB: a shard is 6.25 MiB, 12.5 messages of 512 KiB: 3 × (1 + 1/12.5)
    star = make_topology("star", servers=16)
    prediction = predict(star, "ps", 25 * 2**20, IDEAL, workers=12, options={"shards": 4})
    assert in_units(prediction.seconds, prediction.size_bytes) == pytest.approx(3 * (1 + 0.5 / 6.25), rel=1e-6)


def test_forms_are_absent_where_the_schedule_breaks_their_assumption():
    star = make_topology("star", servers=6)
    schedules, _ = build_schedules(star, "halving-doubling", 10_000)
    assert closed_form(schedules[0][1], star) is None  # 6 is no power of two
    bigraph = make_topology("bigraph", switches=4, servers_per_switch=4)  # m > n/2: links shared
    schedules, _ = build_schedules(bigraph, "hdrm", 10_000)
    assert closed_form(schedules[0][1], bigraph) is None
    schedules, _ = build_schedules(star, "tree", 10_000)
    assert closed_form(schedules[0][1], star) is None


# -- flows worked by hand --------------------------------------------------------------------
def one_partition(schedule: Schedule) -> list[tuple[Partition, Schedule]]:
    return [(Partition(0, schedule.size, 0), schedule)]


def run(topology, schedule: Schedule, network: Network, chunk_bytes: int = 2**30):
    nodes = [s.name for s in topology.servers]
    return simulate(Routes(topology), one_partition(schedule), nodes, network, chunk_bytes)


def test_two_flows_share_a_link_then_the_survivor_takes_all_of_it():
    # h0 and h1 both send to h2 through sw→h2 (1000 B/s): 400 B and 1200 B at 500 B/s each;
    # the first ends at 0.8 s having sent 400 B, the second has 800 B left at 1000 B/s
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 400)
    schedule.add_step([Transfer(0, 2, 0, 100, "reduce"), Transfer(1, 2, 100, 300, "reduce")])
    result = run(star, schedule, Network(8000, efficiency=1.0))
    short, long = result.flows
    assert short.finished == pytest.approx(0.8, rel=1e-12)
    assert long.finished == pytest.approx(1.6, rel=1e-12)
    assert result.seconds == pytest.approx(1.6, rel=1e-12)
    loads = {str(result.routes.directions[i]): b for i, b in enumerate(result.link_bytes) if b}
    assert loads == {"h0→sw": 400, "h1→sw": 1200, "sw→h2": 1600}


def test_a_forwarded_range_pipelines_message_by_message():
    # 0 → 1 in step 0, 1 → 2 the same 4000 B in step 1, 1000 B messages, 1000 B/s per link
    # (disjoint links): 1 forwards message i as soon as it has it, so the second transfer
    # ends one message after the first (5 s), not after it (8 s, a barrier between steps)
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 1000)
    schedule.add_step([Transfer(0, 1, 0, 1000, "reduce")])
    schedule.add_step([Transfer(1, 2, 0, 1000, "copy")])
    result = run(star, schedule, Network(8000, efficiency=1.0), chunk_bytes=1000)
    first, second = result.flows
    assert (first.finished, second.finished) == (pytest.approx(4.0), pytest.approx(5.0))


def test_a_later_step_starts_once_the_earlier_ones_sends_are_handed_over():
    # rank 0 sends 1000 B to 1 in step 0 and 1000 B to 2 in step 1: the agents write a rank's
    # steps in order, so the second starts when the first is written into its socket, though
    # its range is ready
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 500)
    schedule.add_step([Transfer(0, 1, 0, 250, "reduce")])
    schedule.add_step([Transfer(0, 2, 250, 250, "reduce")])
    network = Network(8000, efficiency=1.0)  # 1000 B/s
    nodes = [s.name for s in star.servers]
    # a socket that holds none of it: written once sent, so one after the other
    result = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, send_buffer_bytes=0)
    assert [f.finished for f in result.flows] == [pytest.approx(1.0), pytest.approx(2.0)]
    # a socket of 600 B: the first is handed over once 400 B have left (0.4 s); then both
    # share h0's uplink, the first's last 600 B at 500 B/s (1.6 s), the second's rest alone
    result = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, send_buffer_bytes=600)
    assert [f.finished for f in result.flows] == [pytest.approx(1.6), pytest.approx(2.0)]
    # one that holds all of it: both at once from the start
    result = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, send_buffer_bytes=1000)
    assert [f.flowing_at for f in result.flows] == [0.0, 0.0]


def _two_senders_into_rank_two():
    """star,3 at 1000 B/s per link: rank 0 sends 1000 B to rank 2 in step 0, rank 1 another
    1000 B to rank 2 in step 1 (which Schedule.rendezvous marks)."""
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 500)
    schedule.add_step([Transfer(0, 2, 0, 250, "reduce")])
    schedule.add_step([Transfer(1, 2, 250, 250, "reduce")])
    nodes = [s.name for s in star.servers]
    network = Network(8000, efficiency=1.0)
    return star, schedule, nodes, network


def test_with_a_rendezvous_a_send_waits_for_its_receiver_to_enter_its_step():
    # rank 0 sends 1000 B to rank 2 in step 0, rank 1 another 1000 B to rank 2 in step 1, at
    # 1000 B/s per link. Eager, rank 1 (nothing to wait for) sends at once and both share
    # sw→h2 to the end (2 s each); with a rendezvous it waits for rank 2 to have applied step
    # 0's receive: 1 s, then 2 s, and the step-0 transfer keeps its link to itself
    star, schedule, nodes, network = _two_senders_into_rank_two()
    eager = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, rendezvous=False)
    assert [f.finished for f in eager.flows] == [pytest.approx(2.0), pytest.approx(2.0)]
    met = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, rendezvous=True)
    assert [f.finished for f in met.flows] == [pytest.approx(1.0), pytest.approx(2.0)]
    # the receiver's word takes its α and the path's delay back, then the sender's message its
    # own α: the wait grows by both
    slow = simulate(Routes(star), one_partition(schedule), nodes, Network(8000, efficiency=1.0, latency=0.1),
                    2**30, rendezvous=True)
    first, second = slow.flows
    assert second.flowing_at == pytest.approx(first.finished + 0.2)


def test_the_transfers_that_meet_their_receiver_are_those_into_a_rank_that_heard_from_others():
    # rank 2 hears from 0, then from 1: 1 waits; a ring, a mesh and a parameter server hear
    # from the same ranks step after step: none waits; halving-doubling on 8: every transfer
    # after the first step
    star = make_topology("star", servers=8)
    schedule = Schedule("by-hand", 3, 500)
    schedule.add_step([Transfer(0, 2, 0, 250, "reduce")])
    schedule.add_step([Transfer(1, 2, 250, 250, "reduce"), Transfer(2, 0, 0, 250, "copy")])
    assert schedule.rendezvous() == {(1, 1, 2)}
    for algorithm, workers in (("ring", None), ("mesh", None), ("ps", 4)):
        schedules, _ = build_schedules(star, algorithm, 4 * 2**20, workers)
        assert all(not s.rendezvous() for _, s in schedules), algorithm
    [(_, hd)] = build_schedules(star, "halving-doubling", 4 * 2**20)[0]
    assert hd.rendezvous() == {(i, t.src, t.dst) for i, step in enumerate(hd.steps) if i for t in step}


def test_with_a_rendezvous_halving_doubling_keeps_its_links_to_one_flow():
    # eager, a step's first message leaves once the step before's first has landed, into a
    # partner still receiving that step: two flows on its downlink (2.5 S/B on star,8 at 4
    # MiB, 1 MiB messages); a rendezvous keeps each step's links to its own flow: a ring's
    # 2(n − 1)/n
    star = make_topology("star", servers=8)
    schedules, nodes = build_schedules(star, "halving-doubling", 4 * 2**20)
    eager, met = (in_units(simulate(Routes(star), schedules, nodes, IDEAL, 2**20, rendezvous=flag).seconds,
                           4 * 2**20) for flag in (False, True))
    assert eager > 2.2
    assert met == pytest.approx(2 * 7 / 8, rel=1e-3)


def test_a_run_takes_the_rendezvous_unless_the_model_finds_it_costs():
    # offered the rendezvous, halving-doubling on star,8 at 4 MiB takes it (1.75 S/B against
    # eager's 2.5), at 25 MiB not (a few % in the model, transfers over MEETS_BYTES); a binomial tree would hold its second child until the first one's whole
    # transfer is in (a pipelined tree: much slower), so it sends eagerly, and so does a
    # latency-bound exchange (64 KiB with α 150 µs: each step pays the READY's way back);
    # the compiled run's plan follows the prediction's choice, and a run predicted again
    # keeps it
    from orchestrator.cost.compiled import over_servers
    from orchestrator.cost.predict import MEETS_BYTES, MEETS_COST, MEETS_GAIN, _largest_meeting

    star = make_topology("star", servers=8)
    slow = Network(RATE, efficiency=1.0, latency=150e-6)
    for algorithm, size, network, met in (("halving-doubling", 4 * 2**20, IDEAL, True),
                                          ("tree", 4 * 2**20, IDEAL, False),
                                          ("halving-doubling", 2**16, slow, False),
                                          ("halving-doubling", 25 * 2**20, slow, False)):
        run = over_servers(star, algorithm, size, rendezvous=True, prediction_only=True)
        chosen = run.predicted(network, star)
        assert chosen.prediction.rendezvous is met and chosen.meets is met, algorithm
        both = [predict_schedules(star, run.schedules, list(run.nodes), network, run.chunk_bytes,
                                  rendezvous=flag, choose=False).per_run for flag in (False, True)]
        assert chosen.prediction.per_run == pytest.approx(both[1] if met else both[0])
        # taken unless it costs more than MEETS_COST, and for transfers over MEETS_BYTES only
        # if it gains MEETS_GAIN (at 25 MiB it is faster in the model, by less)
        large = _largest_meeting(run.schedules, 4) > MEETS_BYTES
        assert (both[1] <= both[0] * ((1 - MEETS_GAIN) if large else (1 + MEETS_COST))) is met, (algorithm, both)
        if size == 25 * 2**20:
            assert both[1] < both[0]
    # a run predicted again (other routes, another α) keeps what its plans were built with
    chosen = over_servers(star, "halving-doubling", 4 * 2**20, rendezvous=True, prediction_only=True).predicted(
        IDEAL, star)
    laggy = Network(RATE, efficiency=1.0, latency=0.05)
    assert chosen.meets and not over_servers(star, "halving-doubling", 4 * 2**20, rendezvous=True,
                                             prediction_only=True).predicted(laggy, star).meets
    again = chosen.predicted(laggy, star)
    assert again.meets and again.prediction.rendezvous
    # not offered: never; nothing marked (a ring): not taken, the plan has nothing to wait for
    run = over_servers(star, "halving-doubling", 4 * 2**20, rendezvous=False, prediction_only=True)
    assert not run.predicted(IDEAL, star).meets
    ring = over_servers(star, "ring", 4 * 2**20, rendezvous=True, prediction_only=True)
    assert ring.meets and not ring.predicted(IDEAL, star).meets


def test_jobs_together_take_the_rendezvous_each_as_its_own_run_chose():
    # two copies of the by-hand schedule (rank 1's send into rank 2 waits for rank 2's step)
    # simulated together: the first takes the rendezvous, the second sends eagerly
    star, schedule, nodes, network = _two_senders_into_rank_two()
    both = [(Partition(0, 250, 0), schedule), (Partition(250, 250, 1), schedule)]
    run = simulate(Routes(star), both, nodes, network, 2**30, rendezvous=[True, False])
    assert [f.meets for f in run.flows] == [False, True, False, False]
    with pytest.raises(ValueError, match="one flag per schedule"):
        simulate(Routes(star), both, nodes, network, 2**30, rendezvous=[True])


def test_bytes_cross_into_the_receivers_buffer_before_they_may_be_applied():
    # step 0: rank 1 sends [0, 250) to rank 0; step 1: rank 2 sends the same range to rank 1,
    # which may apply it only once its own send of that range is written. Without buffers the
    # second waits for the first to arrive (1 s) and then takes 1 s; with them it crosses
    # h2→sw→h1 (idle links) at once and is applied when it has arrived: both done at 1 s
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 250)
    schedule.add_step([Transfer(1, 0, 0, 250, "reduce")])
    schedule.add_step([Transfer(2, 1, 0, 250, "reduce")])
    network = Network(8000, efficiency=1.0)
    nodes = [s.name for s in star.servers]
    held = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, receive_buffer_bytes=0,
                    send_buffer_bytes=0)
    assert held.seconds == pytest.approx(2.0)
    buffered = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, receive_buffer_bytes=1000,
                        send_buffer_bytes=1000)
    assert buffered.seconds == pytest.approx(1.0)
    # the kernel buffers bytes, not messages: 400 B cross at once, the other 600 once rank 1's
    # send is written (1 s)
    small = simulate(Routes(star), one_partition(schedule), nodes, network, 2**30, receive_buffer_bytes=400,
                     send_buffer_bytes=0)
    assert small.seconds == pytest.approx(1.6)
    # no buffers but messages of 200 B: each may cross once rank 1 has written the same
    # message of its own send, so the second trails the first by one message
    pipelined = simulate(Routes(star), one_partition(schedule), nodes, network, 200, receive_buffer_bytes=0,
                         send_buffer_bytes=0)
    assert pipelined.seconds == pytest.approx(1.2)


def test_back_to_back_a_rank_done_early_starts_the_next_allreduce():
    # halving-doubling on 5 ranks: rank 0 sits out (it sends S to 1 first and gets it back
    # last). Ranks 2-4 leave an iteration a copy's time before ranks 0 and 1 and start the
    # next among themselves, so a run's time per allreduce is below one allreduce alone
    star = make_topology("star", servers=5)
    schedules, nodes = build_schedules(star, "halving-doubling", 4_000_000)
    run_ = simulate(Routes(star), schedules, nodes, IDEAL, 2**20, iterations=4)
    alone = simulate(Routes(star), schedules, nodes, IDEAL, 2**20)
    first, second = run_.exits[0], run_.exits[1]
    assert min(first.values()) < max(first.values())  # some leave early
    assert run_.period < alone.seconds
    assert run_.link_bytes == pytest.approx(alone.link_bytes)  # per allreduce either way


def test_the_workers_entries_back_to_back_as_the_model_has_them():
    """Prediction.entry_spread: how far apart the workers enter an allreduce back to back (the
    median over the ones in a row). Symmetric schedules keep them together; a tree's leaves
    get the broadcast's last bytes after its first ones, one hop each; halving-doubling on 5
    ranks lets 2-4 leave before 0 and 1 (above), by rank 0's extra copy."""
    star = make_topology("star", servers=8)
    for algorithm in ("ring", "halving-doubling"):
        prediction = predict(star, algorithm, 4_000_000, IDEAL)
        assert prediction.entry_spread == pytest.approx(0.0, abs=1e-9), algorithm
    tree = predict(star, "tree", 4_000_000, IDEAL)
    assert 0.05 * tree.per_run < tree.entry_spread < tree.per_run
    five = make_topology("star", servers=5)
    schedules, nodes = build_schedules(five, "halving-doubling", 4_000_000)
    in_a_row = simulate(Routes(five), schedules, nodes, IDEAL, 2**20, iterations=4)
    by_hand = statistics.median(max(exits.values()) - min(exits.values()) for exits in in_a_row.exits[:-1])
    assert by_hand > 0 and predict_schedules(five, schedules, nodes, IDEAL, 2**20).entry_spread == pytest.approx(by_hand)


def test_the_entries_of_a_run_with_stragglers_are_its_own():
    # a ring on star,4 whose rank 3 computes 0.1 s longer in every iteration enters each
    # allreduce 0.1 s after the others, as the run with those draws has it; late in the first
    # only, the ring takes it back: from the warm-up on they enter together
    star = make_topology("star", servers=4)
    schedules, nodes = build_schedules(star, "ring", 4_000_000)
    every = predict_schedules(star, schedules, nodes, IDEAL, 2**20, compute=[[0.0, 0.0, 0.0, 0.1]] * 8, warmup=1)
    assert every.entry_spread == pytest.approx(0.1)
    first = predict_schedules(star, schedules, nodes, IDEAL, 2**20,
                              compute=[[0.0, 0.0, 0.0, 0.1]] + [[0.0] * 4] * 7, warmup=1)
    assert first.entry_spread == pytest.approx(0.0, abs=1e-9)


def test_entry_spread_counts_the_workers_that_entered_every_allreduce():
    # ranks 0-1 are the workers (a parameter server, rank 2, is left out); an allreduce a
    # worker is missing from is skipped; the median of what is left
    rows = [{0: 1.0, 1: 1.5, 2: 9.0}, {0: 2.0, 1: 2.1, 2: 9.0}, {0: 3.0}, {0: 4.0, 1: 4.3, 2: 9.0}]
    assert entry_spread(rows, 2) == pytest.approx(0.3)  # counting rank 2 would make it 5.0
    assert entry_spread([{0: 1.0}], 2) is None and entry_spread([], 2) is None and entry_spread(rows, 0) is None


def test_latency_and_link_delay_come_before_the_first_byte():
    # α = 0.1 s, 0.05 s per link over h0→sw→h1: 0.2 s, then 4000 B at 1000 B/s
    star = make_topology("star", servers=2)
    schedule = Schedule("by-hand", 2, 1000)
    schedule.add_step([Transfer(0, 1, 0, 1000, "reduce")])
    result = run(star, schedule, Network(8000, efficiency=1.0, latency=0.1, delay=0.05))
    assert result.seconds == pytest.approx(4.2)


def test_ring_pays_alpha_per_step_and_efficiency_scales_bandwidth():
    # worked by hand: one message per transfer, no buffers: each of the 2(N−1) steps waits α,
    # then sends S/N at the payload rate
    star = make_topology("star", servers=4)
    size = 4_000_000
    network = Network(RATE, efficiency=tcp_efficiency(1500), latency=1e-3)
    bandwidth = 2 * 3 / 4 * size / (RATE / 8 * tcp_efficiency(1500))
    assert unbuffered(star, "ring", size, network) * size / network.payload_rate == \
        pytest.approx(bandwidth + 2 * 3 * 1e-3, rel=1e-6)
    # as the agents run it, a step's α passes while the last step's bytes still flow: at
    # least the first step's α, at most every step's
    seconds = predict(star, "ring", size, network).seconds
    assert bandwidth + 1e-3 - 1e-9 <= seconds <= bandwidth + 2 * 3 * 1e-3 + 1e-9


def test_tcp_efficiency_is_what_iperf3_measured_through_htb():
    assert tcp_efficiency(1500) == pytest.approx(0.956, abs=5e-4)  # REFERENCE §5: 95.6 % of 100 Mbit
    assert tcp_efficiency(9000) > tcp_efficiency(1500)


def test_partitions_in_flight_are_bounded_by_credit():
    # a 4-rank ring in 8 partitions: one at a time (credit = one partition) gives 8 × the
    # per-partition latency terms, all at once shares the links: both move the same bytes
    star = make_topology("star", servers=4)
    size = 8 * 2**20
    slow = Network(RATE, efficiency=1.0, latency=0.01)
    one = predict(star, "ring", size, slow, partition_bytes=2**20, credit_bytes=2**20)
    every = predict(star, "ring", size, slow, partition_bytes=2**20)
    assert one.link_bytes == pytest.approx(every.link_bytes)
    bandwidth = 1.5 * size / slow.payload_rate
    assert one.seconds == pytest.approx(bandwidth + 8 * 6 * 0.01, rel=1e-6)
    assert every.seconds < one.seconds


# -- routes ----------------------------------------------------------------------------------
def test_ecmp_splits_a_connection_evenly_at_every_hop():
    fattree = make_topology("fattree", k=4)
    routes = Routes(fattree)
    usage, hops = routes.usage("p0e0h0", "p1e0h0")  # across pods: 2 aggregations × 2 cores
    shares = {str(routes.directions[i]): share for i, share in usage}
    assert shares["p0e0h0→p0e0"] == 1 and shares["p1e0→p1e0h0"] == 1
    assert sorted(v for k, v in shares.items() if k.startswith("p0e0→")) == [0.5, 0.5]
    assert sorted(v for k, v in shares.items() if k.startswith("c")) == [0.25] * 4
    assert hops == 6


@pytest.mark.parametrize("kind, params", [("bcube", {"n": 3, "k": 1}), ("torus", {"k": 4, "d": 2}),
                                          ("torus", {"k": 2, "d": 2})])
def test_the_model_sends_to_the_address_the_agents_name_per_nic(kind, params):
    from orchestrator.cost.routes import target_address
    from orchestrator.deploy.lab_agents import nic_addresses

    topology = make_topology(kind, **params)
    for server in topology.servers:
        theirs = nic_addresses(topology, server.name)
        assert theirs and {nic: str(target_address(topology, server.name, nic)) for nic in theirs} == theirs
        # each NIC reaches the server on a NIC of its own: no two indices share an address
        assert len(set(theirs.values())) == len(theirs)


def test_a_named_nic_takes_its_own_link():
    bcube = make_topology("bcube", n=4, k=1)
    routes = Routes(bcube)
    # h00 and h01 share the level-0 switch; h00 and h10 the level-1 one
    assert [str(routes.directions[i]) for i, _ in routes.usage("h00", "h01", 0)[0]] == ["h00→l0s0", "l0s0→h01"]
    assert [str(routes.directions[i]) for i, _ in routes.usage("h00", "h10", 1)[0]] == ["h00→l1s0", "l1s0→h10"]


EVERY_KIND = [
    ("bcube", {"n": 3, "k": 1}, ["ring", "mesh", "hips", "bml", "tree"]),
    ("fattree", {"k": 4}, ["ring", "mesh", "halving-doubling", "double-tree"]),
    ("torus", {"k": 3, "d": 2}, ["ring", "mesh", "hips", "hierarchical"]),
    ("bigraph", {"switches": 4, "servers_per_switch": 2}, ["ring", "hdrm", "flextree"]),
    ("leafspine", {"leaves": 3, "spines": 2, "servers_per_leaf": 2}, ["ring", "mesh", "hierarchical"]),
    ("star", {"servers": 5}, ["ring", "mesh", ("ps", 3, {"shards": 2}), "tree", "double-tree", "halving-doubling"]),
]


@pytest.mark.parametrize("kind, params, algorithms", EVERY_KIND, ids=[k for k, _, _ in EVERY_KIND])
def test_predict_on_every_topology_kind_conserves_bytes(kind, params, algorithms):
    topology = make_topology(kind, **params)
    routes = Routes(topology)
    for entry in algorithms:
        algorithm, workers, options = entry if isinstance(entry, tuple) else (entry, None, None)
        schedules, nodes = build_schedules(topology, algorithm, 3 * 2**20, workers, options)
        prediction = predict_schedules(topology, schedules, nodes, IDEAL, routes=routes)
        # every byte of every transfer crosses every link of its path(s): Σ link bytes = Σ bytes × hops
        carried = sum(t.length * 4 * routes.usage(nodes[t.src], nodes[t.dst], t.nic)[1]
                      for _, s in schedules for _, t in s.transfers())
        assert sum(prediction.link_bytes.values()) == pytest.approx(carried), algorithm
        assert prediction.seconds >= max(prediction.link_bytes.values()) / IDEAL.payload_rate * (1 - 1e-9)
        assert prediction.bottlenecks() and prediction.busbw > 0


def test_ranges_keep_the_latest_writers_and_the_sends_since():
    ranges: Ranges[str] = Ranges()
    ranges.put(0, 100, 0, "a")
    ranges.put(50, 150, 1, "b")
    ranges.put(50, 100, 1, "c")  # same step: joins b
    assert sorted(ranges.touching(0, 200)) == [("a", 0, 50), ("b", 50, 150), ("c", 50, 100)]
    ranges.clear(0, 60)
    assert sorted(ranges.touching(0, 200)) == [("b", 60, 150), ("c", 60, 100)]
    ranges.add(140, 160, "d")
    assert sorted(ranges.touching(145, 155)) == [("b", 145, 150), ("d", 145, 155)]


# -- the command -----------------------------------------------------------------------------
def _testbed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=120)


def test_predict_command_prints_the_prediction_beside_the_closed_form():
    result = _testbed("predict", "bcube,4,1", "-a", "hips", "--size", "12.5MB", "--bandwidth", "100Mbit", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    payload = 100e6 / 8 * tcp_efficiency(1500)
    assert report["seconds"] == pytest.approx(0.9375 * 12.5 * 2**20 / payload, rel=1e-6)
    assert report["closed_form"]["factor"] == pytest.approx(0.9375)
    assert report["busbw_bytes_per_s"] == pytest.approx(report["algbw_bytes_per_s"] * 2 * 15 / 16)
    assert len(report["bottlenecks"]) == 64 and report["bottlenecks"][0]["utilisation"] == pytest.approx(1.0)
    text = _testbed("predict", "bcube,4,1", "-a", "ps", "--workers", "12", "-o", "shards=4", "--size", "25MB")
    assert text.returncode == 0, text.stderr
    assert "time per allreduce" in text.stdout and "closed form" in text.stdout and "h3" in text.stdout


@pytest.mark.parametrize("args, says", [
    (["-a", "nope"], "unknown algorithm 'nope'"),
    (["-a", "ring", "--size", "12XB"], "--size: unknown size unit"),
    (["-a", "hips", "--size", "1MB", "--workers", "3"], "hips on bcube-4-1"),
    (["-a", "ps", "-o", "shards"], "KEY=VALUE"),
])
def test_predict_command_refuses_bad_input_in_one_line(args, says):
    result = _testbed("predict", "bcube,4,1", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


# -- what a review of the buffered model found (each failed before its fix) ------------------
def test_a_rank_with_nothing_to_do_still_enters_every_iteration_after_its_compute():
    star = make_topology("star", servers=3)
    schedule = Schedule("by-hand", 3, 100)
    schedule.add_step([Transfer(0, 1, 0, 100, "reduce")])  # rank 2 has nothing to do
    nodes = [s.name for s in star.servers]
    result = simulate(Routes(star), one_partition(schedule), nodes, Network(8000, efficiency=1.0), 400,
                      iterations=2, compute_s=0.5)
    # 400 B at 1000 B/s, 0.5 s of compute, again: every rank left both iterations
    assert result.seconds == pytest.approx(1.3)
    assert all(len(exits) == 3 for exits in result.exits)


def test_a_partial_message_goes_as_soon_as_its_data_is_there_when_the_buffer_has_room():
    # receive buffer 300 B, messages of 400 B: 0→2 needs rank 0's [0, 250) from 1 (1 s)
    # and rank 2's own receive from 3 to be applied; it starts once its data is there (0.4 s,
    # the first message), not once the buffer has room for a whole one
    star = make_topology("star", servers=4)
    schedule = Schedule("by-hand", 4, 500)
    schedule.add_step([Transfer(1, 0, 0, 250, "reduce"), Transfer(3, 2, 0, 250, "reduce"),
                       Transfer(3, 1, 250, 250, "reduce")])
    schedule.add_step([Transfer(0, 2, 0, 250, "reduce")])
    nodes = [s.name for s in star.servers]
    result = simulate(Routes(star), one_partition(schedule), nodes, Network(8000, efficiency=1.0), 400,
                      receive_buffer_bytes=300, send_buffer_bytes=0)
    assert result.flows[-1].flowing_at == pytest.approx(0.4)
    assert result.seconds == pytest.approx(2.2)


def test_a_send_whose_inputs_clear_while_it_flows_is_handed_over_then():
    # 1→2 forwards [0, 100) of what 0 sends it; it is handed over (a socket of 1 MB) once
    # that has arrived (0.4 s), and rank 1's next step (1→4) starts then
    star = make_topology("star", servers=5)
    schedule = Schedule("by-hand", 5, 600)
    schedule.add_step([Transfer(0, 1, 0, 200, "reduce"), Transfer(3, 2, 300, 300, "reduce")])
    schedule.add_step([Transfer(1, 2, 0, 100, "reduce")])
    schedule.add_step([Transfer(1, 4, 200, 100, "reduce")])
    nodes = [s.name for s in star.servers]
    result = simulate(Routes(star), one_partition(schedule), nodes, Network(8000, efficiency=1.0), 100,
                      send_buffer_bytes=10**6)
    assert result.flows[-1].flowing_at == pytest.approx(0.4)


def test_a_thousand_partitions_a_rank_has_no_part_in_do_not_recurse():
    star = make_topology("star", servers=4)
    schedules, nodes = build_schedules(star, "ps", 4000, workers=2, partition_bytes=4)
    assert len(schedules) == 1000
    assert simulate(Routes(star), schedules, nodes, IDEAL, 4, iterations=2).seconds > 0
