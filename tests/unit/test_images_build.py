"""`testbed images build` removes the images a rebuild replaced, and only after a rebuild."""

from __future__ import annotations

import pytest

from orchestrator.emulation import docker_engine, images


@pytest.mark.parametrize("base,server", [(False, False), (True, False), (False, True), (True, True)])
def test_build_all_prunes_what_it_replaced_only_when_it_built(monkeypatch, base, server):
    pruned: list[str] = []
    monkeypatch.setattr(images, "build_base", lambda progress: base)
    monkeypatch.setattr(images, "build_server", lambda progress: server)
    monkeypatch.setattr(docker_engine, "prune_replaced", lambda label: pruned.append(label) or 3)
    said: list[str] = []
    built = images.build_all(said.append)
    assert built == [name for name, did in ((images.BASE, base), (images.SERVER, server)) if did]
    assert pruned == ([images.RECIPE_LABEL] if built else [])
    assert any("removed 3 image layers" in line for line in said) == bool(built)
