"""A rebuilt image of ours leaves nothing behind: the image it replaced goes, through a real
engine (a tiny image imported twice under a reference of this test's own, with our label)."""

from __future__ import annotations

import io
import tarfile

import pytest
from docker.errors import ImageNotFound

from orchestrator.emulation import docker_engine, images

REFERENCE = "testbed-test/replaced:latest"  # this test's own: never one of the lab images


def _import(tmp_path, recipe: str) -> str:
    tarball = tmp_path / f"{recipe}.tar"
    with tarfile.open(tarball, "w") as tar:
        data = recipe.encode()
        entry = tarfile.TarInfo("recipe")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    docker_engine.import_image(tarball, REFERENCE, changes=[f"LABEL {images.RECIPE_LABEL}={recipe}"])
    return docker_engine.client().images.get(REFERENCE).id


@pytest.fixture
def engine():
    try:
        client = docker_engine.client(start=False)
    except Exception as exc:  # noqa: BLE001 - no engine: say why
        pytest.skip(f"no Docker engine: {exc}")
    yield client
    try:
        client.images.remove(REFERENCE, force=True)
    except ImageNotFound:
        pass


def test_the_image_a_rebuild_replaced_is_removed_and_the_current_one_kept(engine, tmp_path):
    old = _import(tmp_path, "first")
    current = _import(tmp_path, "second")
    assert old != current
    assert engine.images.get(old).tags == []  # replaced: untagged, still on disk
    assert docker_engine.prune_replaced(images.RECIPE_LABEL) >= 1
    with pytest.raises(ImageNotFound):
        engine.images.get(old)
    assert engine.images.get(REFERENCE).id == current
    for name in (images.BASE, images.SERVER):  # the lab images, where present, keep their tags
        try:
            assert name in engine.images.get(name).tags
        except ImageNotFound:
            pass
