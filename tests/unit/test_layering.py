"""DESIGN.md's import rules, read from the source (every import, module level or inside a
function): the pure layers touch nothing of the system, deploy imports the control layer
(control/) and never the reverse, nothing imports experiment or cli, the agent imports nothing
outside itself. Fails naming the module, the line and the rule it breaks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
SYSTEM = {"emulation", "deploy", "control", "agent", "faults", "monitoring", "experiment", "cli", "doctor", "plugins",
          "files", "frameworks"}

# (the importing package, the packages it must not import, why)
RULES = [
    ("collectives", SYSTEM | {"cost", "spec"}, "collectives is pure: schedules from ranks and topology facts"),
    ("cost", SYSTEM | {"spec"}, "cost is pure: schedules × routes × capacities"),
    ("topology", SYSTEM | {"collectives", "cost"}, "topology is pure"),
    ("control", {"deploy", "experiment", "cli"}, "deploy imports the control layer (control/), never the reverse"),
    ("deploy", {"experiment", "cli", "faults", "monitoring"}, "deploy puts agents on servers and knows no experiment"),
    ("emulation", {"deploy", "control", "experiment", "cli", "faults", "monitoring", "collectives", "cost"},
     "emulation makes a topology live and knows nothing above it"),
    ("faults", {"experiment", "cli", "deploy"}, "faults call the Lab API"),
    ("monitoring", {"experiment", "cli"}, "nothing imports experiment or cli"),
    ("frameworks", {"experiment", "cli", "deploy", "faults", "monitoring", "emulation", "cost"},
     "a framework runs processes on a live lab it is handed, and knows no experiment"),
]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, the orchestrator package imported) for every import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "orchestrator" else [f"orchestrator.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "orchestrator" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def modules(package: str) -> list[Path]:
    where = PACKAGE / package
    return sorted(where.rglob("*.py")) if where.is_dir() else [where.with_suffix(".py")]


@pytest.mark.parametrize("package, banned, why", RULES, ids=[r[0] for r in RULES])
def test_a_layer_imports_nothing_above_it(package, banned, why):
    broken = [f"{path.relative_to(PACKAGE.parent)}:{line} imports orchestrator.{target}"
              for path in modules(package) for line, target in imports(path) if target in banned]
    assert not broken, f"{why}: {broken}"


def test_the_agent_imports_nothing_outside_itself():
    broken = [f"{path.relative_to(PACKAGE.parent)}:{line} imports orchestrator.{target}"
              for path in modules("agent") for line, target in imports(path) if target not in ("agent",)]
    assert not broken, broken


def test_nothing_imports_experiment_or_cli():
    broken = [f"{path.relative_to(PACKAGE.parent)}:{line} imports orchestrator.{target}"
              for path in PACKAGE.rglob("*.py") if path.parent.name != "experiment" and path.name != "cli.py"
              for line, target in imports(path) if target in ("experiment", "cli")]
    assert not broken, broken


def test_the_rules_see_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from orchestrator.deploy import lab_agents\n")
    assert imports(probe) == [(2, "deploy")]
