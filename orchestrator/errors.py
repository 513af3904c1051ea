"""The one exception tree of testbed.

Every error a user can cause or meet is one of these, and its message is one line that says
what is wrong and what to do. The CLI prints `str(error)` and exits with `error.exit_code`;
it never shows a traceback for these.

    TestbedError                  base; exit code 1
    ├── SpecError                 a lab or experiment file is invalid (names the field); exit 2
    ├── BadUsage                  a command's arguments do not fit together; exit 2
    ├── PluginError               a user's plugin is missing, unsafe, broken or takes a taken name
    │                             (names its file and line); exit 2
    ├── TopologyError             parameters that no topology or address plan can satisfy; exit 2
    ├── HostError                 this machine lacks something (root, a tool, a kernel feature)
    │   ├── MissingFeature        the lab asks for a kernel feature this kernel lacks; exit 3
    │   └── HostLimit             the lab needs more than a limit of this host (neighbour
    │                             table, open files, memory); names it and the fix; exit 3
    ├── LabError                  about a lab's lifecycle
    │   ├── BadLabName            a command names a lab by a name no lab can have; exit 2
    │   ├── LabExists             `up` of a lab whose name is already live
    │   ├── LabNotFound           a command names a lab that is not live
    │   ├── LabBusy               another process is building or removing that lab
    │   ├── LabCrashed            the process building that lab died: `testbed clean` it
    │   └── NodeNotFound          a command names a node the lab does not have
    ├── Interrupted               a signal stopped a build, which was rolled back; exit 128+signal
    ├── EmulationError            the kernel or Docker refused an operation while building
    ├── MonitorError              the lab's Prometheus could not start or be reached (names its log)
    ├── FaultError                a fault names an action, target or parameter that does not fit
    │                             the lab (names it and what would); nothing was changed; exit 2
    ├── DeployError               deploying agents failed: names the host, the task and the log
    └── RunError                  a run failed on some agent: names the rank, the node and, for a
                                  stall, the peer, the path and the dead link
"""

from __future__ import annotations


class TestbedError(Exception):
    """Base of every error testbed raises on purpose."""

    exit_code = 1
    __test__ = False  # not a pytest test class, despite the name


class SpecError(TestbedError):
    """A lab or experiment file is invalid; the message names the file and field."""

    exit_code = 2


class BadUsage(TestbedError):
    """A command's arguments that cannot work together (the CLI's own checks)."""

    exit_code = 2


class PluginError(TestbedError):
    """A plugin (an algorithm from a file or an entry point) that cannot be loaded."""

    exit_code = 2


class TopologyError(TestbedError):
    """Topology parameters or an address plan that cannot be built."""

    exit_code = 2


class HostError(TestbedError):
    """This machine lacks something testbed needs (root, a tool, a kernel feature)."""


class MissingFeature(HostError):
    """The lab asks for a kernel feature this kernel does not have."""

    exit_code = 3


class HostLimit(HostError):
    """The lab needs more of a limit of this host than it allows (a sysctl, RLIMIT_NOFILE,
    memory); the message names the limit and what to change."""

    exit_code = 3


class LabError(TestbedError):
    """About a lab's lifecycle (exists, not found)."""


class BadLabName(LabError):
    """A name that no lab can have (the lab file's rule): never turned into a path."""

    exit_code = 2


class LabExists(LabError):
    pass


class LabBusy(LabError):
    """Another process holds the lab's lock (a build in progress)."""


class LabCrashed(LabError):
    """The lab's build was cut short by a process that died; only `clean` applies."""


class LabNotFound(LabError):
    pass


class NodeNotFound(LabError):
    pass


class Interrupted(TestbedError):
    """SIGINT, SIGTERM or SIGHUP arrived during a build; what was built has been removed."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class EmulationError(TestbedError):
    """The kernel or Docker refused an operation while building or changing a lab."""


class MonitorError(TestbedError):
    """The lab's Prometheus could not be started or reached."""


class FaultError(TestbedError):
    """A fault that cannot be injected on this lab: an unknown action, a node or link the lab
    lacks, an action that does not apply to that kind of node, a bad parameter. Raised
    before anything is journalled or changed."""

    exit_code = 2


class DeployError(TestbedError):
    """Deploying or removing agents failed; the message names the host, the task that failed
    and the path of Ansible's full log."""


class RunError(TestbedError):
    """A run failed on some agent; the message names the rank and node. `cut`: pairs of
    servers (by node) between which data did not move, when the failure names them (a stall's
    dead edges, an agent's failed send): a surviving run finds a cut-off server with them."""

    def __init__(self, message: str, cut: frozenset[frozenset[str]] = frozenset()) -> None:
        super().__init__(message)
        self.cut = cut
