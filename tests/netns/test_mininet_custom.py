"""Mininet users' path: Debian's `mn` with our custom file routes every pair."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CUSTOM = Path(__file__).resolve().parents[2] / "topologies" / "mn_custom.py"


@pytest.mark.parametrize("topo,pairs", [("bcube,3,1", 72), ("fattree,4", 240), ("torus,3,2", 72), ("bigraph,4,1", 12)])
def test_mn_custom_pingall(topo, pairs):
    if shutil.which("mn") is None:
        pytest.skip("Mininet's mn is not installed (apt-get install mininet)")
    result = subprocess.run(
        ["mn", "--custom", str(CUSTOM), "--topo", topo, "--controller", "none", "--test", "pingall"],
        capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    match = re.search(r"Results: (\d+)% dropped \((\d+)/(\d+) received\)", output)
    assert match, output[-2000:]
    assert match.group(1) == "0" and int(match.group(3)) == pairs, match.group(0)
