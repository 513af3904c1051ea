"""The host engine's keys (orchestrator/hosts/tls.py): one CA per directory, a certificate per
party signed by it, and never a key behind a symlink (all inside the test's own directory)."""

from __future__ import annotations

import pytest

from orchestrator.errors import BadUsage
from orchestrator.hosts.tls import credentials


def test_parties_share_one_ca_and_a_symlinked_directory_is_refused(tmp_path):
    from cryptography import x509

    first, second = credentials(tmp_path / "tls", "client"), credentials(tmp_path / "tls", "worker-x")
    assert first.ca == second.ca and first.cert != second.cert
    authority = x509.load_pem_x509_certificate(first.ca.read_bytes())
    for party in (first, second):
        assert x509.load_pem_x509_certificate(party.cert.read_bytes()).issuer == authority.subject
    assert (tmp_path / "tls").stat().st_mode & 0o077 == 0
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadUsage, match="is a symlink; testbed keeps no key behind one"):
        credentials(tmp_path / "link", "client")
    assert not list((tmp_path / "elsewhere").iterdir())
