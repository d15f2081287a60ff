"""The gRPC channel to the Pub/Sub API, with auth headers added to every call.

Salesforce authenticates every RPC from three metadata headers (``accesstoken``,
``instanceurl``, ``tenantid``; lower-case, as gRPC requires). A client interceptor asks the
:class:`~ingest.auth.TokenManager` for current credentials on each call, so a refreshed token
is picked up by the next call without rebuilding the channel, and adds an
``x-client-trace-id`` that Salesforce support can correlate with its logs.

A TLS channel also tells a server certificate that fails verification apart from an outage:
gRPC reports both as ``UNAVAILABLE`` (naming, for a host with several addresses, only the one
it tried last), so when a call cannot connect at all the channel shakes hands with the
target's addresses itself (:func:`ingest.tls.probe`) and, when a certificate fails
verification, fails the call with an
:class:`~ingest.client.errors.UntrustedServerError` that says so and how to fix it.
"""

from __future__ import annotations

import ipaddress
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from ingest.auth import TokenManager
from ingest.client.errors import UntrustedServerError
from ingest.errors import ConfigError
from ingest.tls import probe, trusted_roots, untrusted_message, verification_failure

__all__ = ["DEFAULT_ENDPOINT", "TlsSettings", "connect", "is_loopback"]

DEFAULT_ENDPOINT = "api.pubsub.salesforce.com:7443"

_log = logging.getLogger(__name__)
# How gRPC words a call that reached none of the target's addresses.
_NO_CONNECTION = "failed to connect to all addresses"

# A FetchResponse is split at ~3 MB but a single event may be 1 MB, so one response can
# approach the 4 MB gRPC default; leave ample room rather than fail a stream on a big batch.
_DEFAULT_MAX_RECEIVE = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """How to secure the channel.

    By default the server certificate is verified against the system's public roots.
    ``ca_file`` trusts one PEM CA instead (the emulator's self-signed one); ``server_name``
    overrides the name checked in the certificate. ``enabled=False`` is refused unless the
    endpoint is a loopback address (a local emulator without TLS).
    """

    enabled: bool = True
    ca_file: Path | None = None
    server_name: str | None = None


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str | bytes]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _AuthInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    def __init__(self, tokens: TokenManager | None, trace_id: Callable[[], str]) -> None:
        self._tokens = tokens
        self._trace_id = trace_id

    def _details(self, details: Any) -> _CallDetails:
        metadata: list[tuple[str, str | bytes]] = list(details.metadata or ())
        if self._tokens is not None:
            metadata.extend(self._tokens.current().metadata())
        metadata.append(("x-client-trace-id", self._trace_id()))
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _TlsDiagnosis(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Replaces a failure to connect that is really an untrusted certificate."""

    def __init__(self, target: str, tls: TlsSettings) -> None:
        self._target = target
        self._tls = tls

    def diagnose(self, error: grpc.RpcError) -> grpc.RpcError:
        if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.UNAVAILABLE:
            return error
        details = error.details() or ""
        where, reason = self._target, verification_failure(details)
        if reason is None:
            if _NO_CONNECTION not in details:
                return error
            found = probe(
                self._target, ca_file=self._tls.ca_file, server_name=self._tls.server_name
            )
            if found is None:
                return error
            where, reason = found.address, found.reason
        message = untrusted_message(where, reason, checked_against=trusted_roots(self._tls.ca_file))
        _log.debug("%s: %s (gRPC said: %s)", self._target, message, details)
        return UntrustedServerError(message, error)

    def _outcome(self, outcome: Any) -> Any:
        return self.diagnose(outcome) if isinstance(outcome, grpc.RpcError) else outcome

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._outcome(continuation(details, request))

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._outcome(continuation(details, requests))

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return _DiagnosedResponses(continuation(details, request), self.diagnose)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return _DiagnosedResponses(continuation(details, requests), self.diagnose)


class _DiagnosedResponses:
    """A streaming call whose failure, raised while iterating, is diagnosed first; every
    other attribute is the call's own."""

    __slots__ = ("_call", "_diagnose")

    def __init__(self, call: Any, diagnose: Callable[[grpc.RpcError], grpc.RpcError]) -> None:
        self._call = call
        self._diagnose = diagnose

    def __iter__(self) -> _DiagnosedResponses:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            replaced = self._diagnose(exc)
            if replaced is exc:
                raise
            raise replaced from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def is_loopback(endpoint: str) -> bool:
    """Whether ``host:port`` names this machine (127.0.0.0/8, ::1 or localhost)."""
    host = _host(endpoint)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host(endpoint: str) -> str:
    text = endpoint.strip()
    if text.startswith("["):
        return text[1 : text.index("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def connect(
    endpoint: str = DEFAULT_ENDPOINT,
    *,
    tokens: TokenManager | None,
    tls: TlsSettings | None = None,
    max_receive_bytes: int = _DEFAULT_MAX_RECEIVE,
    trace_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """Open a channel to ``endpoint`` (``host:port``) that authenticates every call.

    ``tokens`` may be ``None`` only for servers that do not check credentials. The channel is
    TLS with certificate verification unless ``tls.enabled`` is false, which is accepted for
    loopback endpoints only. A certificate that fails verification fails the call with an
    :class:`~ingest.client.errors.UntrustedServerError` (classified permanent), not with the
    ``UNAVAILABLE`` of an outage.
    """
    tls = tls or TlsSettings()
    if ":" not in endpoint:
        raise ConfigError(f"endpoint must be host:port (got {endpoint!r})")
    if max_receive_bytes < 4 * 1024 * 1024:
        raise ConfigError(
            f"max_receive_bytes must be at least 4 MiB, the size of one full FetchResponse "
            f"(got {max_receive_bytes})"
        )
    channel_options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", max_receive_bytes),
        # Streams can sit idle for minutes between keepalive responses; HTTP/2 pings keep
        # NATs and load balancers from dropping them, at a rate servers accept.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),
    ]
    if tls.server_name:
        channel_options.append(("grpc.ssl_target_name_override", tls.server_name))
    channel_options.extend(options)
    if tls.enabled:
        root = None
        if tls.ca_file is not None:
            path = Path(tls.ca_file)
            if not path.is_file():
                raise ConfigError(f"TLS CA file {path} does not exist")
            root = path.read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=root)
        channel = grpc.intercept_channel(
            grpc.secure_channel(endpoint, credentials, options=channel_options),
            _TlsDiagnosis(endpoint, tls),
        )
    else:
        if not is_loopback(endpoint):
            raise ConfigError(
                f"TLS can only be turned off for a local emulator on a loopback address "
                f"(got endpoint {endpoint!r}); Salesforce requires TLS"
            )
        channel = grpc.insecure_channel(endpoint, options=channel_options)
    return grpc.intercept_channel(channel, _AuthInterceptor(tokens, trace_id))
