"""Certificates for the emulator's TLS mode: a private CA and a server certificate it signs.

Clients verify the server exactly as they verify Salesforce, only against this CA instead of
the public roots: the server certificate carries ``127.0.0.1``, ``::1`` and ``localhost`` (plus
any extra host asked for) as subject alternative names. EC P-256 keys keep generation fast.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT",
    "SERVER_CERT",
    "SERVER_KEY",
    "TlsMaterial",
    "ensure_tls",
    "generate_tls",
]

CA_CERT = "ca.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes of the CA certificate and of the server's certificate and private key."""

    ca_cert_pem: bytes
    server_cert_pem: bytes
    server_key_pem: bytes = field(repr=False)

    def write(self, directory: Path) -> None:
        """Write ``ca.pem``, ``server.pem`` and ``server-key.pem`` (owner-only) into it."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CA_CERT).write_bytes(self.ca_cert_pem)
        (directory / SERVER_CERT).write_bytes(self.server_cert_pem)
        key = directory / SERVER_KEY
        key.touch(mode=0o600, exist_ok=True)
        key.chmod(0o600)
        key.write_bytes(self.server_key_pem)

    @classmethod
    def read(cls, directory: Path) -> TlsMaterial:
        return cls(
            (directory / CA_CERT).read_bytes(),
            (directory / SERVER_CERT).read_bytes(),
            (directory / SERVER_KEY).read_bytes(),
        )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def generate_tls(
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    valid_days: int = 365,
    now: Callable[[], dt.datetime] = _now,
) -> TlsMaterial:
    """A new CA and a server certificate for ``hosts`` (IP addresses and DNS names)."""
    if not hosts:
        raise ValueError("generate_tls needs at least one host name or IP address")
    start = now() - dt.timedelta(minutes=5)
    end = start + dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sfcdc emulator CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return TlsMaterial(
        ca_cert_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        server_cert_pem=server_cert.public_bytes(serialization.Encoding.PEM),
        server_key_pem=server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def ensure_tls(directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS) -> TlsMaterial:
    """Reuse the CA and server certificate in ``directory``, or generate and write them there.

    Reusing them lets clients keep trusting the same ``ca.pem`` across emulator restarts.
    """
    if all((directory / name).is_file() for name in (CA_CERT, SERVER_CERT, SERVER_KEY)):
        return TlsMaterial.read(directory)
    material = generate_tls(hosts)
    material.write(directory)
    return material
