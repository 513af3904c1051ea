"""The docker tier shares the netns tier's lab fixtures and its end-of-tier trace check."""

from tests.netns.conftest import leaves_no_trace, make_lab  # noqa: F401 (pytest fixtures)
