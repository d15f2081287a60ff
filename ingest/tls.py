"""Telling a server certificate that fails verification apart from an outage.

An untrusted certificate does not start working on its own, so retrying it like an outage
only delays the answer (ten attempts took over a minute) and hides the cause. Both
transports hide it in their own way:

- httpx raises a ``ConnectError`` whose cause is an :class:`ssl.SSLCertVerificationError`;
- a gRPC channel that reaches none of its target's addresses reports the failure of the
  address it tried *last*: for ``localhost`` that also resolves to ``::1`` while the server
  listens on 127.0.0.1, that is "Connection refused" for ``::1``, and the handshake's
  ``CERTIFICATE_VERIFY_FAILED`` appears only in gRPC's debug log.

:func:`verification_failure` reads the cause out of an exception or a gRPC status text;
:func:`probe` finds it when gRPC named another address, with one TLS handshake per address
of the target, verified against the roots the channel uses; :func:`untrusted_message` says
what failed and how to trust the server.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = [
    "VERIFY_FAILED",
    "Untrusted",
    "grpc_root_certificates",
    "probe",
    "trusted_roots",
    "untrusted_message",
    "verification_failure",
]

VERIFY_FAILED = "CERTIFICATE_VERIFY_FAILED"
# gRPC checks the server name itself, after OpenSSL accepted the chain.
_GRPC_NAME_MISMATCH = "is not in peer certificate"
_PROBE_TIMEOUT = 3.0
_PROBE_MAX_ADDRESSES = 4


@dataclass(frozen=True, slots=True)
class Untrusted:
    """Where a certificate failed verification (``host:port``) and OpenSSL's reason."""

    address: str
    reason: str


def verification_failure(error: BaseException | str) -> str | None:
    """The verification failure in ``error`` (an exception with its causes, or a status
    text), as ``CERTIFICATE_VERIFY_FAILED: <reason>``; ``None`` when it is something else."""
    if isinstance(error, str):
        return _in_text(error)
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    for exc in chain:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return f"{VERIFY_FAILED}: {exc.verify_message or exc.reason or exc}"
    for exc in chain:
        found = _in_text(str(exc))
        if found is not None:
            return found
    return None


def _in_text(text: str) -> str | None:
    at = text.find(VERIFY_FAILED)
    if at >= 0:
        # OpenSSL's "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: <why>
        # (_ssl.c:1006)", gRPC's "...:CERTIFICATE_VERIFY_FAILED: <why>: OK".
        rest = text[at + len(VERIFY_FAILED) :].split(" (_ssl.c", 1)[0]
        rest = rest.lstrip("]: ").removeprefix("certificate verify failed").lstrip(": ")
        rest = rest.removesuffix(": OK").strip()
        return f"{VERIFY_FAILED}: {rest or 'certificate verify failed'}"
    if _GRPC_NAME_MISMATCH in text:
        start = text.rfind("Peer name")
        return f"{VERIFY_FAILED}: {text[max(start, 0) :].strip()}"
    return None


def trusted_roots(ca_file: str | Path | None) -> str:
    """What a client configured with ``ca_file`` verifies certificates against."""
    return f"the CA file {ca_file}" if ca_file else "the public root certificates"


def untrusted_message(where: str, reason: str, *, checked_against: str | None = None) -> str:
    """What to tell the user: the server, the reason, what was trusted (when known, see
    :func:`trusted_roots`) and the fix."""
    against = f"; it was checked against {checked_against}" if checked_against else ""
    return (
        f"the server's certificate at {where} is not trusted ({reason}){against}. Retrying "
        "cannot help: trust the CA that signed it by giving its PEM file as ca_file "
        "(tls.ca_file in conf/pipeline.yml); an emulator serving TLS writes its CA as ca.pem "
        "in its certificate directory (`sfcdc emulator serve` prints its path). Check too that "
        "the endpoint is the server you mean"
    )


def grpc_root_certificates() -> Path | None:
    """The roots a gRPC channel verifies against when given none: the file named by
    ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, else the bundle shipped with grpcio."""
    configured = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    if configured:
        return Path(configured)
    try:
        bundled = resources.files("grpc").joinpath("_cython/_credentials/roots.pem")
    except ModuleNotFoundError:
        return None
    return Path(str(bundled)) if bundled.is_file() else None


def probe(
    target: str,
    *,
    ca_file: str | Path | None,
    server_name: str | None = None,
    roots: Path | None = None,
    timeout: float = _PROBE_TIMEOUT,
) -> Untrusted | None:
    """Shake hands with each address of ``target`` (``host:port`` or a gRPC ``ipv4:`` /
    ``ipv6:`` / ``dns:`` target) and return the first whose certificate fails verification
    against ``ca_file`` (or ``roots``, default :func:`grpc_root_certificates`). Addresses
    that refuse or time out are skipped: they are the outage case."""
    cafile = Path(ca_file) if ca_file else (roots or grpc_root_certificates())
    try:
        context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError):
        return None
    for host, port, name in _addresses(target):
        try:
            with (
                socket.create_connection((host, port), timeout=timeout) as sock,
                context.wrap_socket(sock, server_hostname=server_name or name),
            ):
                pass
        except ssl.SSLCertVerificationError as exc:
            reason = exc.verify_message or exc.reason or str(exc)
            return Untrusted(_show(host, port), f"{VERIFY_FAILED}: {reason}")
        except (OSError, ValueError):
            continue
    return None


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(target: str) -> Iterator[tuple[str, int, str]]:
    """(address, port, name to verify) for each address ``target`` stands for."""
    text = target.strip()
    for scheme in ("ipv4:", "ipv6:"):
        if text.startswith(scheme):
            for item in text.removeprefix(scheme).split(",")[:_PROBE_MAX_ADDRESSES]:
                host, port = _split(item)
                if host and port:
                    yield host, port, host
            return
    if text.startswith("dns:"):
        text = text.removeprefix("dns:").lstrip("/")
        text = text.split("/", 1)[-1] if "/" in text else text
    host, port = _split(text)
    if not host or not port:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return
    seen: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in seen:
            seen.append(address)
    for address in seen[:_PROBE_MAX_ADDRESSES]:
        yield address, port, host


def _split(endpoint: str) -> tuple[str, int]:
    text = endpoint.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":")
    return host, int(port_text) if port_text.isdigit() else 0
