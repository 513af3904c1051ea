"""The host settings setup.sh writes (/etc/sysctl.d/60-testbed.conf, from
capacity.sysctl_conf): enough for the README's largest lab and every file in topologies/,
each line with why, and never lower than what the host already has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.emulation import capacity
from orchestrator.emulation.capacity import GC_THRESH3, HostLimits, estimate, refusal, sysctl_conf
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab

ROOT = Path(__file__).resolve().parents[2]


def settings(text: str) -> dict[str, int]:
    """name → value of a sysctl.d file, as `sysctl -p` reads it; every setting preceded by a comment."""
    found, lines = {}, text.splitlines()
    for number, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            name, value = (part.strip() for part in line.split("=", 1))
            assert lines[number - 1].startswith("# "), f"{name} has no comment saying why"
            found[name] = int(value)
    return found


def host_with(written: dict[str, int]) -> HostLimits:
    return HostLimits(gc_thresh3=written[GC_THRESH3], open_files_soft=1 << 20, open_files_hard=1 << 20,
                      mem_available_mib=1 << 20)


def test_a_fresh_host_gets_what_fattree_16_needs():
    # Regression: on a fresh machine `testbed up fattree,16` was refused: gc_thresh3 was 1,024.
    written = settings(sysctl_conf(current=lambda name: 1024))
    need = estimate(from_lab(lab_from_argument("fattree,16")), "netns", "lab fattree,16")
    assert written[GC_THRESH3] >= need.neighbours_all_pairs >= need.neighbours
    assert written == {GC_THRESH3: 16384}  # the figure `up` names for fattree,16
    assert refusal(need, host_with(written)) is None
    assert refusal(need, host_with({GC_THRESH3: 1024})) is not None  # the stock host: refused


@pytest.fixture(scope="module")
def written() -> dict[str, int]:
    return settings(sysctl_conf(current=lambda name: None))  # a host without /proc/sys values


@pytest.mark.parametrize("path", sorted((ROOT / "topologies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_lab_file_fits_what_setup_writes(path, written):
    spec = lab_from_argument(str(path))
    assert refusal(estimate(from_lab(spec), "netns", spec.name), host_with(written)) is None


def test_a_value_the_host_has_higher_is_kept_and_said():
    text = sysctl_conf(current=lambda name: 100_000)
    assert settings(text) == {GC_THRESH3: 100_000}
    assert "needs 16,384; this host had 100,000, kept" in text


def test_setup_sh_writes_the_file_from_sysctl_conf_and_applies_it():
    script = (ROOT / "setup.sh").read_text()
    assert str(capacity.SYSCTL_CONF) in script
    assert re.search(r"from orchestrator\.emulation\.capacity import sysctl_conf", script)
    assert re.search(r'sysctl -q -p "\$SYSCTL_CONF"', script)
