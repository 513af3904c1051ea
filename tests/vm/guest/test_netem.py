"""Labs with delay, jitter and loss on a kernel that has sch_netem (runs inside the VM).

Every link is shaped at both ends, so a ping crosses each link's netem twice per round trip:
a path of L links adds 2·L·delay to the RTT and survives with probability (1 - loss)^(2·L).
Tolerances are honest for software emulation: netem never delivers early, so the fastest
RTT is bounded below by the delay asked for; above, qemu's emulated CPU now and then holds a
packet for tens of ms (more while other work loads the host), so the typical RTT (median,
quartiles, 95th percentile) is judged, never the slowest. Loss is judged against a ±5σ
binomial band (a false alarm about once in a million runs).
"""

from __future__ import annotations

import math
import re
import statistics

from orchestrator.emulation import Lab, features
from orchestrator.spec import lab_from_argument

EMULATION_SLACK_MS = 25.0  # what qemu's emulated CPU may add to one round trip


def ping(lab: Lab, src: str, address: str, count: int, interval: float) -> tuple[list[float], int]:
    """(RTTs in ms of the replies, packets sent) for `count` pings `interval` s apart.

    No -w: with a deadline ping sends until `count` replies came back, and counts the
    packets still in flight when it stops as lost. A few slow pings first resolve ARP and
    give the emulated kernel time to finish tearing down the previous test's lab."""
    lab.exec(src, ["ping", "-n", "-c", "5", "-i", "0.2", address], timeout=60)
    result = lab.exec(src, ["ping", "-n", "-c", str(count), "-i", str(interval), address], timeout=count * interval + 60)
    rtts = [float(m) for m in re.findall(r"time=([\d.]+) ms", result.stdout)]
    sent = re.search(r"(\d+) packets transmitted", result.stdout)
    assert sent, result.stdout[-500:] + result.stderr
    return rtts, int(sent.group(1))


def assert_netem(lab: Lab, node: str, ifname: str, expected: str) -> None:
    """The kernel's own account of the netem under the link's HTB class (units included)."""
    shown = lab.exec(node, ["tc", "qdisc", "show", "dev", ifname]).stdout
    assert f"qdisc netem 2: parent 1:1 {expected}" in shown, shown


def netem_crossings(lab: Lab, src: str, dst: str) -> int:
    """netem qdiscs one ping meets on its round trip: two per link of the path."""
    path = lab.topology.layered_paths(src, dst, first_only=True)[0]
    return 2 * (len(path) - 1)


def binomial_band(n: int, p: float, z: float = 5.0) -> tuple[float, float]:
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return max(0.0, mean - z * sd), mean + z * sd


def test_netem_labs_are_not_refused_on_this_kernel():
    assert features.kernel_features()["netem"], "the VM's kernel must have sch_netem"
    spec = lab_from_argument("star,2", name="vmaccepted", **{"servers.runtime": "netns", "links.delay": "5ms", "links.loss": 1})
    features.require(spec)  # raises MissingFeature where netem is absent


def test_delay_and_loss_are_what_the_lab_asked_for(make_lab, figure):
    delay_ms, loss_percent, count = 20.0, 1.0, 1000
    lab = make_lab("star,2", name="vmnetem", **{"servers.runtime": "netns", "links.delay": f"{delay_ms:g}ms", "links.loss": loss_percent})
    crossings = netem_crossings(lab, "h0", "h1")
    assert_netem(lab, "h0", "h0-eth0", f"limit 1000 delay {delay_ms:g}ms loss {loss_percent:g}%")
    rtts, sent = ping(lab, "h0", str(lab.topology.address_of("h1")), count, 0.005)
    lost = sent - len(rtts)
    expected_rtt = crossings * delay_ms
    p_lost = 1 - (1 - loss_percent / 100) ** crossings
    low, high = binomial_band(sent, p_lost)
    figure("netem_rtt_ms", {"asked": expected_rtt, "min": min(rtts), "median": statistics.median(rtts),
                            "p95": round(statistics.quantiles(rtts, n=20)[-1], 2), "max": max(rtts)})
    figure("netem_loss", {"asked_per_link_percent": loss_percent, "expected_percent": round(100 * p_lost, 2),
                          "measured_percent": round(100 * lost / sent, 2), "sent": sent})
    assert min(rtts) >= expected_rtt, f"netem delivered early: {min(rtts)} ms < {expected_rtt} ms"
    assert statistics.median(rtts) <= expected_rtt + EMULATION_SLACK_MS, rtts[:20]
    assert low <= lost <= high, f"{lost} of {sent} lost; {p_lost:.2%} per ping allows {low:.0f}–{high:.0f}"


def test_jitter_spreads_the_delay_around_what_was_asked(make_lab, figure):
    delay_ms, jitter_ms, count = 20.0, 5.0, 400
    lab = make_lab("star,2", name="vmjitter", **{"servers.runtime": "netns", "links.delay": f"{delay_ms:g}ms", "links.jitter": f"{jitter_ms:g}ms"})
    crossings = netem_crossings(lab, "h0", "h1")
    assert_netem(lab, "sw", "sw-eth1", f"limit 1000 delay {delay_ms:g}ms  {jitter_ms:g}ms")
    rtts, sent = ping(lab, "h0", str(lab.topology.address_of("h1")), count, 0.01)
    assert len(rtts) == sent  # no loss asked for, none allowed
    # netem draws each delay uniformly in delay ± jitter; the RTT is the sum of `crossings`
    # draws: nearly normal, sd = √crossings·jitter/√3, interquartile range ≈ 1.349·sd
    expected_iqr = 1.349 * math.sqrt(crossings) * jitter_ms / math.sqrt(3)
    q1, median, q3 = statistics.quantiles(rtts, n=4)
    p95 = statistics.quantiles(rtts, n=20)[-1]
    figure("netem_jitter_rtt_ms", {"asked": crossings * delay_ms, "asked_iqr": round(expected_iqr, 2),
                                   "min": min(rtts), "q1": round(q1, 2), "median": round(median, 2),
                                   "q3": round(q3, 2), "p95": round(p95, 2), "max": max(rtts)})
    asked = crossings * delay_ms
    assert min(rtts) >= crossings * (delay_ms - jitter_ms)
    assert p95 <= crossings * (delay_ms + jitter_ms) + EMULATION_SLACK_MS
    # the draws are symmetric about the delay (the median of 400 is within ±1 ms of it); the
    # emulated CPU only ever adds
    assert asked - 2 <= median <= asked + EMULATION_SLACK_MS
    # half catches jitter that was not applied, double one applied at the wrong scale; the
    # emulated CPU's own noise widens the spread a little
    assert 0.5 * expected_iqr <= q3 - q1 <= 2 * expected_iqr, f"RTT IQR {q3 - q1:.2f} ms, netem should give ≈{expected_iqr:.2f} ms"


def test_a_degrade_fault_adds_netem_delay_and_its_undo_takes_it_away(make_lab, figure):
    """link-degrade --delay on a lab without netem: the link's FIFO becomes netem (the kernel
    cannot change a qdisc's kind in place), and the undo puts the FIFO back."""
    from orchestrator.faults import Injector

    delay_ms, count = 30.0, 50
    lab = make_lab("star,2", name="vmdegrade", **{"servers.runtime": "netns"})
    address = str(lab.topology.address_of("h1"))
    injector = Injector(lab)
    fault = injector.inject("link-degrade", "h0-sw", {"delay": f"{delay_ms:g}ms"}).fault
    assert_netem(lab, "h0", "h0-eth0", f"limit 1000 delay {delay_ms:g}ms")
    assert_netem(lab, "sw", "sw-eth0", f"limit 1000 delay {delay_ms:g}ms")
    degraded, _ = ping(lab, "h0", address, count, 0.02)
    injector.undo(fault.id)
    shown = lab.exec("h0", ["tc", "qdisc", "show", "dev", "h0-eth0"]).stdout
    assert "netem" not in shown and "qdisc pfifo 2: parent 1:1 limit 1000p" in shown, shown
    healed, _ = ping(lab, "h0", address, count, 0.02)
    figure("degrade_rtt_ms", {"asked_added": 2 * delay_ms, "degraded_median": statistics.median(degraded),
                              "healed_median": statistics.median(healed)})
    # one link, both ends delayed: each round trip crosses two of its netems
    assert min(degraded) >= 2 * delay_ms
    assert statistics.median(degraded) <= 2 * delay_ms + EMULATION_SLACK_MS
    assert statistics.median(healed) < delay_ms, healed


def test_a_link_with_a_delay_and_queue_of_its_own_delays_only_its_crossings(make_lab, figure):
    """links.overrides: h0-sw alone at 15 ms with a 50-packet queue, both ends; h1's link as
    the lab's (no delay). A ping h0 → h1 meets h0-sw's netem twice per round trip."""
    delay_ms, count = 15.0, 60
    lab = make_lab("star,3", name="vmownlink", **{"servers.runtime": "netns",
                                                   "links.overrides": [{"link": "h0-sw", "delay": f"{delay_ms:g}ms",
                                                                        "queue": 50}]})
    assert_netem(lab, "h0", "h0-eth0", f"limit 50 delay {delay_ms:g}ms")
    assert_netem(lab, "sw", "sw-eth0", f"limit 50 delay {delay_ms:g}ms")
    plain = lab.exec("h1", ["tc", "qdisc", "show", "dev", "h1-eth0"]).stdout
    assert "netem" not in plain and "limit 1000p" in plain, plain
    own, _ = ping(lab, "h0", str(lab.topology.address_of("h1")), count, 0.01)
    other, _ = ping(lab, "h1", str(lab.topology.address_of("h2")), count, 0.01)
    figure("own_link_rtt_ms", {"asked": 2 * delay_ms, "median": statistics.median(own),
                               "other_pair_median": statistics.median(other)})
    assert min(own) >= 2 * delay_ms
    assert statistics.median(own) <= 2 * delay_ms + EMULATION_SLACK_MS
    assert statistics.median(other) < delay_ms, other
