"""The history checker on hand-made histories: a clean one, a lost contribution, a
duplicated one, an unclaimed one counted, divergent survivors, and a dead worker's
contribution recomputed (emulated) or left unverified."""

from __future__ import annotations

import numpy as np

from orchestrator.agent import workload
from orchestrator.control.checker import Observation, check, emulated_fallback

SIZE = 5000


def gradient(identity: int, iteration: int) -> np.ndarray:
    out = np.zeros(SIZE, dtype=np.float32)
    workload.emulated_gradient(identity, iteration, SIZE, out)
    return out


def history(iterations: int, members: tuple[int, ...], counted=None, digests=None) -> list[Observation]:
    """Every member observes each iteration; `counted(iteration)` → identities (with repeats)
    really summed into the aggregate (default: the members)."""
    found = []
    for i in range(iterations):
        summed = counted(i) if counted else members
        aggregate = workload.checksum(sum((gradient(w, i) for w in summed), np.zeros(SIZE, np.float32)))
        for w in members:
            found.append(Observation(i, f"h{w}", w, members, workload.checksum(gradient(w, i)), aggregate,
                                     (digests or {}).get((i, w), "")))
    return found


def test_the_checksum_is_exactly_linear_in_the_contributions():
    total = gradient(0, 3) + gradient(1, 3) + gradient(1, 3)
    assert workload.checksum(total) == workload.checksum(gradient(0, 3)) + 2 * workload.checksum(gradient(1, 3))
    assert workload.checksum(gradient(2, 5)) == workload.emulated_checksum(2, 5, SIZE)


def test_a_clean_history_is_clean():
    report = check(history(4, (0, 1, 2)))
    assert report.clean and report.iterations == 4 and not report.unverified
    assert str(report).startswith("4 iterations checked: 0 lost, 0 duplicated")


def test_a_lost_contribution_is_reported_with_its_iteration_and_worker():
    report = check(history(3, (0, 1, 2), counted=lambda i: (0, 2) if i == 1 else (0, 1, 2)))
    assert report.lost == [(1, 1)] and not report.duplicated and not report.clean


def test_a_contribution_counted_twice_is_reported_as_duplicated():
    report = check(history(3, (0, 1, 2), counted=lambda i: (0, 1, 2, 2) if i == 2 else (0, 1, 2)))
    assert report.duplicated == [(2, 2)] and not report.lost and not report.clean


def test_a_lost_and_a_duplicated_one_in_the_same_iteration_are_both_named():
    report = check(history(2, (0, 1, 2), counted=lambda i: (0, 0, 2) if i == 0 else (0, 1, 2)))
    assert report.lost == [(0, 1)] and report.duplicated == [(0, 0)]


def test_an_unclaimed_dead_workers_gradient_counted_is_extra():
    observations = history(2, (0, 1), counted=lambda i: (0, 1, 2) if i == 1 else (0, 1))
    observations.append(Observation(1, "h2", 2, (0, 1, 2), workload.checksum(gradient(2, 1)), None))
    report = check(observations)
    assert report.extra == [(1, 2)] and not report.clean


def test_survivors_with_different_parameters_diverge():
    report = check(history(2, (0, 1), digests={(0, 0): "aa", (0, 1): "aa", (1, 0): "bb", (1, 1): "cc"}))
    assert report.divergent == [(1, "parameters differ across h0, h1")] and not report.clean


def test_a_dead_workers_missing_contribution_is_recomputed_or_left_unverified():
    observations = [o for o in history(2, (0, 1, 2)) if o.node != "h2"]  # h2 died before reporting
    assert check(observations, emulated_fallback(SIZE)).clean
    unverified = check(observations)
    assert unverified.clean and unverified.unverified == [(0, 2), (1, 2)]


def test_membership_changes_are_listed():
    report = check(history(2, (0, 1, 2)) + [o for o in history(4, (0, 2)) if o.iteration >= 2])
    assert report.clean and report.membership == [(0, (0, 1, 2)), (2, (0, 2))]
