"""The one exception tree of testbed.

Every error a user can cause or meet is one of these, and its message is one line that says
what is wrong and what to do. The CLI prints `str(error)` and exits with `error.exit_code`;
it never shows a traceback for these.

    TestbedError                  base; exit code 1
    ├── SpecError                 a lab or experiment file is invalid (names the field); exit 2
    ├── TopologyError             parameters that no topology or address plan can satisfy; exit 2
    ├── HostError                 this machine lacks something (root, a tool, a kernel feature)
    │   └── MissingFeature        the lab asks for a kernel feature this kernel lacks; exit 3
    ├── LabError                  about a lab's lifecycle
    │   ├── LabExists             `up` of a lab whose name is already live
    │   ├── LabNotFound           a command names a lab that is not live
    │   └── NodeNotFound          a command names a node the lab does not have
    └── EmulationError            the kernel or Docker refused an operation while building
"""

from __future__ import annotations


class TestbedError(Exception):
    """Base of every error testbed raises on purpose."""

    exit_code = 1
    __test__ = False  # not a pytest test class, despite the name


class SpecError(TestbedError):
    """A lab or experiment file is invalid; the message names the file and field."""

    exit_code = 2


class TopologyError(TestbedError):
    """Topology parameters or an address plan that cannot be built."""

    exit_code = 2


class HostError(TestbedError):
    """This machine lacks something testbed needs (root, a tool, a kernel feature)."""


class MissingFeature(HostError):
    """The lab asks for a kernel feature this kernel does not have."""

    exit_code = 3


class LabError(TestbedError):
    """About a lab's lifecycle (exists, not found)."""


class LabExists(LabError):
    pass


class LabNotFound(LabError):
    pass


class NodeNotFound(LabError):
    pass


class EmulationError(TestbedError):
    """The kernel or Docker refused an operation while building or changing a lab."""
