"""Mutual TLS for the host engine: the workers act as root on their hosts, so only a party
holding a certificate from the lab's own CA may talk to the scheduler, and the scheduler only
to such parties. One CA per state directory; a certificate per party (scheduler, client,
each host's worker), kept in a 0700 directory no symlink leads out of."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.emulation.journal import write_inside
from orchestrator.errors import BadUsage

VALID_DAYS = 365


@dataclass(frozen=True)
class Credentials:
    ca: Path
    cert: Path
    key: Path

    def security(self):
        """distributed's Security for this party, encryption required."""
        from distributed.security import Security

        return Security(tls_ca_file=str(self.ca), tls_client_cert=str(self.cert), tls_client_key=str(self.key),
                        tls_scheduler_cert=str(self.cert), tls_scheduler_key=str(self.key),
                        tls_worker_cert=str(self.cert), tls_worker_key=str(self.key), require_encryption=True)

    def worker_args(self) -> list[str]:
        return ["--tls-ca-file", str(self.ca), "--tls-cert", str(self.cert), "--tls-key", str(self.key)]


def credentials(directory: Path, party: str) -> Credentials:
    """The CA of `directory` (made on first use) and a certificate for `party`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.is_symlink():  # its keys would be read and written wherever it leads
        raise BadUsage(f"{directory}: is a symlink; testbed keeps no key behind one: remove the link")
    if directory.stat().st_mode & 0o077:
        os.chmod(directory, 0o700)
    pem = serialization.Encoding.PEM
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(name: str, key, issuer_name, issuer_key, ca: bool):
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        return builder.sign(issuer_key or key, hashes.SHA256())

    def private(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_cert, ca_key = directory / "ca.pem", directory / "ca.key"
    if not ca_cert.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        write_inside(directory, "ca.key", private(key))
        write_inside(directory, "ca.pem", certificate("testbed hosts CA", key, None, None, True).public_bytes(pem))
    authority = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    authority_key = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    cert, key_file = directory / f"{party}.pem", directory / f"{party}.key"
    if not cert.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        write_inside(directory, key_file.name, private(key))
        write_inside(directory, cert.name,
                     certificate(party, key, authority.subject, authority_key, False).public_bytes(pem))
    return Credentials(ca_cert, cert, key_file)
