"""Building the lab images without a registry: debootstrap → `docker import` → `docker build`.

Each image carries a `testbed.recipe` label, a hash of everything it was built from; a build
is skipped when the local image already has the current hash, so `testbed images build`
is idempotent and quick when nothing changed.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from orchestrator.emulation import docker_engine
from orchestrator.errors import EmulationError, HostError

BASE = "testbed/base:bookworm"
SERVER = "testbed/server:latest"
SERVER_TORCH = "testbed/server-torch:latest"  # SERVER with PyTorch: built only when a lab asks for it
RECIPE_LABEL = "testbed.recipe"
CACHE = Path("/var/cache/testbed")
PROJECT = Path(__file__).resolve().parents[2]
SERVER_CONTEXT = PROJECT / "images" / "server"
TORCH_CONTEXT = PROJECT / "images" / "server-torch"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

Progress = Callable[[str], None]


def _mirror() -> str:
    """The Debian mirror this host's apt uses (it is the one we can reach)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return DEFAULT_MIRROR


def _hash(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def base_recipe() -> str:
    return _hash(b"debootstrap minbase bookworm v1", _mirror().encode())


def server_recipe() -> str:
    """Hash of the Dockerfile, its requirements and every file of the package."""
    files = _context_files() + [PROJECT / "pyproject.toml"]
    files += sorted(p for p in (PROJECT / "orchestrator").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _hash(base_recipe().encode(), *(str(p.relative_to(PROJECT)).encode() + p.read_bytes() for p in files))


def build_base(progress: Progress) -> bool:
    """Build testbed/base:bookworm if it is missing or stale; True if it built."""
    recipe = base_recipe()
    if docker_engine.image_label(BASE, RECIPE_LABEL) == recipe:
        return False
    if shutil.which("debootstrap") is None:
        raise HostError("debootstrap is not installed: apt-get install debootstrap (or run ./setup.sh)")
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{recipe}.tar"
    if not tarball.exists():
        with tempfile.TemporaryDirectory(prefix="testbed-rootfs-", dir=CACHE) as root:
            progress(f"debootstrap bookworm from {_mirror()} (about 25 s)")
            _run(["debootstrap", "--variant=minbase", "bookworm", root, _mirror()], progress)
            progress("packing the root filesystem")
            partial = tarball.with_suffix(".partial")
            _run(["tar", "-C", root, "--numeric-owner", "-cf", str(partial), "."], progress)
            partial.rename(tarball)
    progress(f"docker import → {BASE}")
    docker_engine.import_image(
        tarball, BASE, changes=['CMD ["/bin/bash"]', f"LABEL {RECIPE_LABEL}={recipe}"]
    )
    return True


def build_server(progress: Progress) -> bool:
    """Build testbed/server:latest if it is missing or stale; True if it built."""
    recipe = server_recipe()
    if docker_engine.image_label(SERVER, RECIPE_LABEL) == recipe:
        return False
    with tempfile.TemporaryDirectory(prefix="testbed-image-") as tmp:
        context = Path(tmp)
        for path in _context_files():
            shutil.copy2(path, context)  # copy2: an entry point keeps its mode
        shutil.copytree(_agent_wheels(progress), context / "wheels")
        progress("building this project's wheel")
        _run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "-w", str(context / "dist"), str(PROJECT)],
            progress,
        )
        progress(f"docker build → {SERVER}")
        docker_engine.build_image(context, SERVER, {RECIPE_LABEL: recipe}, progress)
    return True


def torch_recipe() -> str:
    return _hash(server_recipe().encode(), *(p.read_bytes() for p in _context_files(TORCH_CONTEXT)))


def build_torch(progress: Progress) -> bool:
    """Build testbed/server-torch:latest (on top of a current testbed/server) if it is
    missing or stale; True if it built. The torch wheels (~200 MB) are downloaded once."""
    build_all(progress)
    recipe = torch_recipe()
    if docker_engine.image_label(SERVER_TORCH, RECIPE_LABEL) == recipe:
        return False
    with tempfile.TemporaryDirectory(prefix="testbed-image-") as tmp:
        context = Path(tmp)
        for path in _context_files(TORCH_CONTEXT):
            shutil.copy2(path, context)
        shutil.copytree(_wheels(TORCH_CONTEXT / "requirements.txt", "PyTorch's wheels (about 200 MB)", progress),
                        context / "wheels")
        progress(f"docker build → {SERVER_TORCH}")
        docker_engine.build_image(context, SERVER_TORCH, {RECIPE_LABEL: recipe}, progress)
    _prune(progress)
    return True


def _context_files(context: Path = SERVER_CONTEXT) -> list[Path]:
    """The files of an image's directory (Dockerfile, requirements, the boot script; not README)."""
    return sorted(p for p in context.iterdir() if p.is_file() and p.suffix != ".md")


def _agent_wheels(progress: Progress) -> Path:
    """The agent's dependency wheels, downloaded once on the host (cached by requirements)."""
    return _wheels(SERVER_CONTEXT / "requirements.txt", "the agent's dependency wheels", progress)


def _wheels(requirements: Path, what: str, progress: Progress) -> Path:
    """The wheels of a requirements file, downloaded once on the host (cached by its hash)."""
    cache = CACHE / f"wheels-{_hash(requirements.read_bytes())}"
    if not cache.is_dir():
        progress(f"downloading {what}")
        partial = cache.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
             "-d", str(partial), "-r", str(requirements)],
            progress,
        )
        partial.rename(cache)
    return cache


def build_all(progress: Progress) -> list[str]:
    """Build every image that is missing or stale; the names of those built. The images they
    replaced go (unless a container still uses one)."""
    built = []
    if build_base(progress):
        built.append(BASE)
    if build_server(progress):
        built.append(SERVER)
    if built:
        _prune(progress)
    return built


def _prune(progress: Progress) -> None:
    removed = docker_engine.prune_replaced(RECIPE_LABEL)
    if removed:
        progress(f"removed {removed} image layers the rebuilt images replaced")


def ensure(reference: str, progress: Progress) -> None:
    """Make sure a lab's image exists: build ours, refuse others that are absent."""
    if reference == SERVER_TORCH:
        build_torch(progress)
        return
    if reference in (BASE, SERVER):
        if reference == SERVER:
            build_all(progress)
        else:
            build_base(progress)
        return
    if not docker_engine.image_exists(reference):
        raise EmulationError(
            f"image {reference} is not present and no registry can be reached: build it "
            f"locally, or use {SERVER} (servers.image)"
        )


def _run(command: list[str], progress: Progress) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise EmulationError(f"{command[0]} failed: {tail[0]}")
