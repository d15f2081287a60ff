"""The gRPC channel to the Pub/Sub API, with auth headers added to every call.

Salesforce authenticates every RPC from three metadata headers (``accesstoken``,
``instanceurl``, ``tenantid``; lower-case, as gRPC requires). A client interceptor asks the
:class:`~ingest.auth.TokenManager` for current credentials on each call, so a refreshed token
is picked up by the next call without rebuilding the channel, and adds an
``x-client-trace-id`` that Salesforce support can correlate with its logs.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from ingest.auth import TokenManager
from ingest.errors import ConfigError

__all__ = ["DEFAULT_ENDPOINT", "TlsSettings", "connect", "is_loopback"]

DEFAULT_ENDPOINT = "api.pubsub.salesforce.com:7443"

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
    loopback endpoints only.
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
        channel = grpc.secure_channel(endpoint, credentials, options=channel_options)
    else:
        if not is_loopback(endpoint):
            raise ConfigError(
                f"TLS can only be turned off for a local emulator on a loopback address "
                f"(got endpoint {endpoint!r}); Salesforce requires TLS"
            )
        channel = grpc.insecure_channel(endpoint, options=channel_options)
    return grpc.intercept_channel(channel, _AuthInterceptor(tokens, trace_id))
