"""The lab Prometheus's recording rules and configuration, checked by promtool: the rules
against series worked by hand (tests/unit/data/rules_test.yml), the generated config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.monitoring.prometheus import RULES, config_text

DATA = Path(__file__).with_name("data")
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool is not installed (./setup.sh installs Debian's prometheus)")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd)


def test_the_rules_are_valid_and_compute_what_was_worked_by_hand():
    assert promtool("check", "rules", str(RULES)).returncode == 0
    result = promtool("test", "rules", "rules_test.yml", cwd=DATA)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_generated_config_passes_promtool(tmp_path):
    lab = SimpleNamespace(spec=SimpleNamespace(name="x"))
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES.read_text())
    targets, fabric = tmp_path / "agents.json", tmp_path / "fabric.json"
    targets.write_text("[]\n")
    fabric.write_text('[{"targets": ["127.0.0.1:9999"], "labels": {"lab": "x"}}]\n')
    config = tmp_path / "prometheus.yml"
    config.write_text(config_text(lab, targets, fabric, rules))
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
