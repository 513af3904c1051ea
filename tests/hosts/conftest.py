"""The hosts tier: several hosts faked as namespaces on an underlay bridge
(orchestrator/hosts/fake.py). Like the netns tier, it ends with a check that nothing is left."""

from orchestrator.hosts.fake import engine_on_fake_hosts  # noqa: F401 - the tests' engine
from tests.netns.conftest import leaves_no_trace  # noqa: F401 - the session-wide check
