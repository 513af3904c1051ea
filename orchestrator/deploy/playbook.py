"""The one place that talks to Ansible: a playbook of playbooks/ run by ansible-runner.

Every run keeps ansible-runner's artifacts under the lab's state directory,
`deploy/ansible/artifacts/<playbook>-<time>/` (status, rc, stdout, job_events/), the last
twenty of them. Ansible's events drive the caller's progress (stage, done, total); a failed
host ends the run in one line naming the host, the task and the full log.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.errors import DeployError

PROJECT = Path(__file__).resolve().parents[2]
PLAYBOOKS = PROJECT / "playbooks"
KEEP_ARTIFACTS = 20
FORKS = 16  # every server of a 16-server lab at once (README: Deploying agents)
Progress = Callable[[str, int, int], None]  # (stage, done, total), as Lab.up reports
RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


@dataclass
class Failure:
    host: str
    task: str
    message: str

    def line(self) -> str:
        first = (self.message.strip().splitlines() or ["(no message)"])[0]
        return f"{self.host}: task '{self.task}' failed: {first[:300]}"


@dataclass
class PlaybookResult:
    playbook: str
    status: str  # ansible-runner's: successful | failed | timeout | canceled
    rc: int
    stdout: Path  # the full log
    seconds: float
    changed: dict[str, int] = field(default_factory=dict)  # host → tasks that changed something
    ok: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)

    def error(self) -> DeployError:
        if self.failures:
            first, more = self.failures[0], len({f.host for f in self.failures}) - 1
            also = f" (and {more} more host{'s' * (more > 1)})" if more else ""
            return DeployError(f"{first.line()}{also}; full log: {self.stdout}")
        return DeployError(f"{self.playbook} ended {self.status} (rc {self.rc}); full log: {self.stdout}")


def expected_results(playbook: str, hosts: int) -> int:
    """Task results a run should report: hosts × the tasks of the playbook's role (an
    estimate for the progress bar: includes and handlers make it move a little)."""
    import yaml

    role = {"deploy.yml": "agent/tasks/main.yml", "undeploy.yml": "agent/tasks/remove.yml",
            "sshd.yml": "sshd/tasks/main.yml", "hosts.yml": "worker/tasks/main.yml",
            "hosts-down.yml": "worker/tasks/remove.yml"}.get(playbook)
    if role is None:
        return 0
    return hosts * len(yaml.safe_load((PLAYBOOKS / "roles" / role).read_text()) or [])


class _Events:
    """Folds ansible-runner's events into progress and failures."""

    def __init__(self, total: int, progress: Progress) -> None:
        self.total, self.progress = total, progress
        self.done = 0
        self.failures: list[Failure] = []

    def __call__(self, event: dict) -> bool:
        kind, data = event.get("event", ""), event.get("event_data") or {}
        if kind in RESULTS:
            self.done += 1
            failed = kind == "runner_on_unreachable" or (kind == "runner_on_failed" and not data.get("ignore_errors"))
            if failed:
                result = data.get("res") or {}
                message = result.get("msg") or result.get("stderr") or result.get("reason") or str(result)[:300]
                if "censored" in result:
                    message = "its output is hidden (no_log: it handles the token); rerun with -e agent_no_log=false"
                self.failures.append(Failure(data.get("host", "?"), data.get("task", "?"), str(message)))
            self.progress(f"{data.get('host', '')}: {data.get('task', '')}", min(self.done, self.total), self.total)
        return True  # keep the event in the artifacts


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """ansible-runner (utils.signal_handler) replaces the SIGINT and SIGTERM handlers with a
    flag of its own and never puts them back: Ctrl-C would be ignored for the rest of the
    process. Its handlers stay in force while it runs (it cancels the playbook), ours after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def run(
    private_dir: Path,
    playbook: str,
    inventory: Path,
    hosts: int,
    progress: Progress,
    extravars: dict | None = None,
    limit: str | None = None,
    forks: int = FORKS,
    timeout: int = 900,
) -> PlaybookResult:
    """Run playbooks/`playbook` over `inventory`; never raises for a failed host (see
    PlaybookResult.error)."""
    import ansible_runner

    private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ident = f"{Path(playbook).stem}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
    events = _Events(expected_results(playbook, hosts), progress)
    bin_dir = Path(sys.executable).parent
    started = time.monotonic()
    with _signal_handlers_kept():
        runner = ansible_runner.run(
            private_data_dir=str(private_dir),
            project_dir=str(PLAYBOOKS),
            playbook=playbook,
            inventory=str(inventory),
            extravars=extravars or {},
            limit=limit,
            forks=forks,
            ident=ident,
            rotate_artifacts=KEEP_ARTIFACTS,
            timeout=timeout,
            quiet=True,
            suppress_env_files=True,
            event_handler=events,
            envvars={
                "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
                "ANSIBLE_HOME": str(private_dir / "home"),  # not root's ~/.ansible
                "ANSIBLE_LOCAL_TEMP": str(private_dir / "tmp"),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(private_dir / "cp"),
                "ANSIBLE_FORKS": str(forks),
                "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            },
        )
    if runner.status == "canceled":  # by a signal ansible-runner's handler caught: ours now
        raise KeyboardInterrupt
    stats = runner.stats or {}
    return PlaybookResult(
        playbook=playbook, status=runner.status, rc=runner.rc,
        stdout=Path(runner.config.artifact_dir) / "stdout", seconds=time.monotonic() - started,
        changed=dict(stats.get("changed") or {}), ok=dict(stats.get("ok") or {}), failures=events.failures,
    )
