"""What a lab needs of the host's limits, and the one-line refusals when it does not fit."""

from __future__ import annotations

import resource

import pytest

from orchestrator.emulation import capacity
from orchestrator.emulation.capacity import HostLimits, estimate, neighbour_entries, refusal
from orchestrator.errors import HostLimit, TopologyError
from orchestrator.spec import lab_from_argument
from tests.unit.conftest import make_topology

ROOMY = HostLimits(gc_thresh3=1 << 20, open_files_soft=1 << 20, open_files_hard=1 << 20, mem_available_mib=1 << 20)
STOCK = HostLimits(gc_thresh3=1024, open_files_soft=1024, open_files_hard=524288, mem_available_mib=20000)


def need_of(kind: str, runtime: str = "netns", **params) -> capacity.Need:
    return estimate(make_topology(kind, **params), runtime, f"lab {kind}")


@pytest.mark.parametrize("kind,params,routed,all_pairs", [
    # per access LAN: the router resolves its k/2 hosts, each host its gateway (all pairs:
    # hosts also resolve each other); per router-to-router link: both ends
    ("fattree", {"k": 8}, 32 * 8 + 256 * 2, 32 * 20 + 256 * 2),
    ("fattree", {"k": 16}, 128 * 16 + 2048 * 2, 128 * 72 + 2048 * 2),
    # BCube servers relay: every one resolves every other on each of its switches
    ("bcube", {"n": 4, "k": 1}, 8 * 12, 8 * 12),
    ("bcube", {"n": 32, "k": 1}, 64 * 32 * 31, 64 * 32 * 31),
    # a star's servers have nobody to route through: they resolve each other
    ("star", {"servers": 32}, 32 * 31, 32 * 31),
    ("torus", {"k": 4, "d": 2}, 32 * 2, 32 * 2),
])
def test_neighbour_entries_per_segment(kind, params, routed, all_pairs):
    assert neighbour_entries(make_topology(kind, **params)) == (routed, all_pairs)


def test_fattree_8_fits_a_stock_host_and_fattree_12_does_not():
    # measured: an all-pairs ping over fattree,8 peaked at 992 learnt entries and passed at the
    # default 1,024; over fattree,12 25,438 of 31,032 pairs failed
    assert refusal(need_of("fattree", k=8), STOCK) is None
    error = refusal(need_of("fattree", k=12), STOCK)
    assert isinstance(error, HostLimit) and error.exit_code == 3
    message = str(error)
    assert "\n" not in message
    for part in ("lab fattree", "2,592", "4,752", "net.ipv4.neigh.default.gc_thresh3 is 1,024",
                 "sysctl -w net.ipv4.neigh.default.gc_thresh3=8192"):
        assert part in message, message


def test_a_switch_wider_than_a_bridge_is_a_topology_error_before_any_host_limit():
    need = need_of("star", servers=1100)
    assert need.widest_switch == ("sw", 1100)
    error = refusal(need, STOCK)
    assert isinstance(error, TopologyError)
    assert "switch sw" in str(error) and "1,100 ports" in str(error) and "1,023" in str(error)
    assert "BR_MAX_PORTS" in str(error)
    assert refusal(need_of("star", servers=1023), ROOMY) is None


def test_open_files_refused_only_beyond_the_hard_limit():
    need = need_of("fattree", k=16)
    assert need.open_files == capacity.FILES_BASE + capacity.FILES_PER_NAMESPACE * 1344
    low_hard = HostLimits(gc_thresh3=1 << 20, open_files_soft=1024, open_files_hard=1024, mem_available_mib=1 << 20)
    error = refusal(need, low_hard)
    assert isinstance(error, HostLimit)
    assert "RLIMIT_NOFILE hard limit" in str(error) and "1,024" in str(error) and "ulimit -Hn" in str(error)
    unlimited = HostLimits(1 << 20, 1024, resource.RLIM_INFINITY, 1 << 20)
    assert refusal(need, unlimited) is None


def test_memory_refused_against_mem_available():
    need = need_of("fattree", k=16)
    short = HostLimits(1 << 20, 1 << 20, 1 << 20, mem_available_mib=need.memory_mib)  # 90 % of it is too little
    error = refusal(need, short)
    assert isinstance(error, HostLimit)
    assert "MemAvailable" in str(error) and f"{need.memory_mib:,} MiB" in str(error) and "1,344 namespaces" in str(error)
    docker = need_of("bcube", "docker", n=8, k=1)
    assert docker.memory_mib - need_of("bcube", n=8, k=1).memory_mib == 64 * capacity.CONTAINER_MIB


def test_fattree_16_memory_estimate_is_inside_the_goal():
    assert need_of("fattree", k=16).memory_mib <= 1536  # the goal: 1.5 GiB


@pytest.mark.parametrize("soft,hard,expected", [
    (1024, 524288, "wanted"),  # a shell's default: raised to what the build needs
    (1024, 1024, None),  # nothing to raise to
    (1024, 1500, 1500),  # as far as the hard limit goes
    (1 << 20, 1 << 20, None),  # already enough
    (resource.RLIM_INFINITY, resource.RLIM_INFINITY, None),
    (1024, resource.RLIM_INFINITY, "wanted"),
])
def test_open_files_target(soft, hard, expected):
    need = need_of("fattree", k=8)
    wanted = capacity.FD_FLOOR + need.open_files
    target = capacity.open_files_target(need, HostLimits(1 << 20, soft, hard, 1 << 20))
    assert target == (wanted if expected == "wanted" else expected)


def test_require_refuses_or_raises_the_soft_limit(monkeypatch):
    calls = []
    monkeypatch.setattr(capacity.resource, "setrlimit", lambda what, limits: calls.append(limits))
    monkeypatch.setattr(capacity, "host_limits", lambda: STOCK)
    spec = lab_from_argument("fattree,8")
    topology = make_topology("fattree", k=8)
    need = capacity.require(spec, topology)
    assert calls == [(capacity.FD_FLOOR + need.open_files, STOCK.open_files_hard)]
    with pytest.raises(HostLimit, match="gc_thresh3"):
        capacity.require(lab_from_argument("fattree,12"), make_topology("fattree", k=12))
    assert len(calls) == 1  # nothing raised for a refused lab


def test_host_limits_reads_this_host():
    host = capacity.host_limits()
    assert host.gc_thresh3 > 0 and host.mem_available_mib > 0
    assert (host.open_files_soft, host.open_files_hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
