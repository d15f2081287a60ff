"""Connecting to the event source ``conf/pipeline.yml`` describes: Salesforce or the emulator.

:func:`connect` turns the ``connection:`` section into a :class:`Source`: an authenticated gRPC
channel and the token manager behind it, plus the emulator itself when it runs inside this
process. Secret references in the spec are resolved here, by the injected resolver
(:func:`secret_resolver`: environment variables, or Databricks secret scopes in a job), and
only handed to the login flow as :class:`~ingest.auth.Secret` values.

- ``source: salesforce``: the login flow ``auth.type`` names, TLS always verified (against
  ``tls.ca_file`` when given), ``tenant_id`` overriding the org id of the token response.
- ``source: emulator``, ``mode: external``: an emulator already running (``sfcdc emulator``, a
  test), reached at ``host:grpc_port``; the pipeline logs in with client credentials at
  ``http(s)://host:http_port``, trusting ``tls.ca_file`` when it serves TLS.
- ``source: emulator``, ``mode: in_process``: the emulator is started here with the shipped
  catalogue, its event log kept in ``state_dir``; the first start of an empty log generates
  ``workload`` (a seeded org's change events and platform events).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import httpx

from ingest.auth import (
    ClientCredentials,
    Credentials,
    DatabricksSecrets,
    Dbutils,
    EnvRef,
    EnvSecrets,
    JwtBearer,
    RefreshToken,
    ScopeRef,
    Secret,
    SecretResolver,
    SoapLogin,
    StaticToken,
    TokenManager,
    TokenProvider,
    UsernamePassword,
)
from ingest.client import TlsSettings
from ingest.client import connect as open_channel
from ingest.errors import ConfigError
from pipelines.spec.connection import (
    AuthSpec,
    ClientCredentialsAuth,
    ConnectionSpec,
    EmulatorSpec,
    JwtBearerAuth,
    RefreshTokenAuth,
    SalesforceSpec,
    SoapLoginAuth,
    StaticTokenAuth,
    UsernamePasswordAuth,
)
from pipelines.spec.models import TopicSpec

if TYPE_CHECKING:
    from ingest.emulator.server import Emulator
    from ingest.emulator.topics import EmittedEvent

__all__ = ["ChannelFactory", "Source", "connect", "secret_resolver", "token_provider"]

_log = logging.getLogger(__name__)

ChannelFactory = Callable[..., grpc.Channel]
_GENERATE_CHUNK = 500


class Source:
    """An open connection to the event source: ``channel`` authenticates every call through
    ``tokens``. ``emulator`` is the emulator this process runs (``None`` otherwise);
    ``ca_file`` the CA that HTTPS calls to the source trust (REST, the Streaming API). Close it
    (or use it as a context manager) to close the channel and stop that emulator."""

    def __init__(
        self,
        *,
        channel: grpc.Channel,
        tokens: TokenManager,
        endpoint: str,
        description: str,
        emulator: Emulator | None = None,
        generator: threading.Thread | None = None,
        stop_generating: threading.Event | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.channel = channel
        self.tokens = tokens
        self.endpoint = endpoint
        self.description = description
        self.emulator = emulator
        # The CA certificate HTTPS calls trust (the emulator's own; None: the public roots).
        self.ca_file = ca_file
        self._generator = generator
        self._stop_generating = stop_generating

    def close(self) -> None:
        """Close the channel; stop the in-process emulator and its workload, if any."""
        if self._stop_generating is not None:
            self._stop_generating.set()
        if self._generator is not None:
            self._generator.join(timeout=10)
        self.channel.close()
        if self.emulator is not None:
            self.emulator.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Source({self.description})"


def secret_resolver(
    *,
    environ: Mapping[str, str] | None = None,
    dbutils: Dbutils | None = None,
) -> SecretResolver:
    """The resolver for the spec's secret references: ``{env: NAME}`` from ``environ`` (default:
    the process environment), and with ``dbutils`` (Databricks' own, which a notebook has as a
    global and a job obtains, see :mod:`pipelines.jobs`) ``{secret: {scope, key}}`` as well."""
    env = os.environ if environ is None else environ
    if dbutils is not None:
        return DatabricksSecrets(dbutils, environ=env)
    return EnvSecrets(env)


def _value(value: str | EnvRef | ScopeRef, secrets: SecretResolver) -> str:
    # Identifiers (client ids, user names) are not secret, but may sit in the same stores.
    return value if isinstance(value, str) else secrets.resolve(value).reveal()


def _secret(ref: EnvRef | ScopeRef | None, secrets: SecretResolver) -> Secret | None:
    return None if ref is None else secrets.resolve(ref)


class _TenantOverride:
    """A provider whose credentials carry a configured org id instead of the login's."""

    def __init__(self, inner: TokenProvider, tenant_id: str) -> None:
        self._inner = inner
        self._tenant_id = tenant_id
        self.name = inner.name

    def fetch(self) -> Credentials:
        return dataclasses.replace(self._inner.fetch(), tenant_id=self._tenant_id)

    def __repr__(self) -> str:
        return f"{self._inner!r} (tenant {self._tenant_id})"


def token_provider(
    auth: AuthSpec,
    *,
    secrets: SecretResolver,
    tenant_id: str | None = None,
    ca_file: str | Path | None = None,
    http: httpx.Client | None = None,
    clock: Callable[[], float] = time.time,
) -> TokenProvider:
    """The login flow an ``auth:`` section describes, with its secrets resolved."""
    common: dict[str, Any] = {"http": http, "ca_file": ca_file, "clock": clock}
    provider: TokenProvider
    if isinstance(auth, ClientCredentialsAuth):
        provider = ClientCredentials(
            auth.login_url,
            client_id=_value(auth.client_id, secrets),
            client_secret=secrets.resolve(auth.client_secret),
            **common,
        )
    elif isinstance(auth, JwtBearerAuth):
        provider = JwtBearer(
            auth.login_url,
            client_id=_value(auth.client_id, secrets),
            username=_value(auth.username, secrets),
            private_key=secrets.resolve(auth.private_key),
            audience=auth.audience,
            **common,
        )
    elif isinstance(auth, UsernamePasswordAuth):
        provider = UsernamePassword(
            auth.login_url,
            client_id=_value(auth.client_id, secrets),
            client_secret=secrets.resolve(auth.client_secret),
            username=_value(auth.username, secrets),
            password=secrets.resolve(auth.password),
            security_token=_secret(auth.security_token, secrets),
            **common,
        )
    elif isinstance(auth, RefreshTokenAuth):
        provider = RefreshToken(
            auth.login_url,
            client_id=_value(auth.client_id, secrets),
            refresh_token=secrets.resolve(auth.refresh_token),
            client_secret=_secret(auth.client_secret, secrets),
            **common,
        )
    elif isinstance(auth, SoapLoginAuth):
        provider = SoapLogin(
            auth.login_url,
            username=_value(auth.username, secrets),
            password=secrets.resolve(auth.password),
            security_token=_secret(auth.security_token, secrets),
            api_version=auth.api_version,
            **common,
        )
    elif isinstance(auth, StaticTokenAuth):
        token = secrets.resolve(auth.access_token)
        org = tenant_id or _org_of_token(token)
        provider = StaticToken(token, instance_url=auth.instance_url, tenant_id=org, clock=clock)
    else:  # pragma: no cover - the spec's union is closed
        raise ConfigError(f"unknown auth flow {type(auth).__name__}")
    if tenant_id is not None and not isinstance(auth, StaticTokenAuth):
        provider = _TenantOverride(provider, tenant_id)
    return provider


def _org_of_token(token: Secret) -> str:
    # Salesforce access tokens start with the 15-character org id and '!'.
    prefix, bang, _rest = token.reveal().partition("!")
    if bang and len(prefix) == 15 and prefix.startswith("00D"):
        return prefix
    raise ConfigError(
        "connection.salesforce.tenant_id is required with a static_token whose value does not "
        "start with the org id (00D...!)"
    )


def connect(
    connection: ConnectionSpec,
    *,
    secrets: SecretResolver,
    topics: Sequence[TopicSpec] = (),
    clock: Callable[[], float] = time.time,
    channel_factory: ChannelFactory = open_channel,
    http: httpx.Client | None = None,
    logger: logging.Logger | None = None,
    on_start: Callable[[TokenManager, Path | None], None] | None = None,
) -> Source:
    """Open the source ``connection`` describes. ``topics`` lets an in-process emulator
    create the managed subscriptions they name; ``channel_factory`` (default
    :func:`ingest.client.connect`) opens the gRPC channel. ``on_start(tokens, ca_file)`` is
    called once an in-process emulator serves and before its workload is generated (so
    PushTopics it creates see the workload's changes); other sources never call it."""
    ctx = _Context(secrets, clock, channel_factory, http, logger or _log, on_start)
    if connection.source == "salesforce":
        if connection.salesforce is None:
            raise ConfigError("connection.salesforce is required when source is salesforce")
        return _salesforce(connection.salesforce, ctx)
    spec = connection.emulator
    if spec.mode == "external":
        return _external_emulator(spec, ctx)
    return _in_process_emulator(spec, topics, ctx)


@dataclasses.dataclass(frozen=True)
class _Context:
    secrets: SecretResolver
    clock: Callable[[], float]
    channel_factory: ChannelFactory
    http: httpx.Client | None
    log: logging.Logger
    on_start: Callable[[TokenManager, Path | None], None] | None = None


def _salesforce(spec: SalesforceSpec, ctx: _Context) -> Source:
    provider = token_provider(
        spec.auth,
        secrets=ctx.secrets,
        tenant_id=spec.tenant_id,
        ca_file=spec.tls.ca_file,
        http=ctx.http,
        clock=ctx.clock,
    )
    tokens = TokenManager(
        provider, clock=ctx.clock, session_lifetime=spec.session_lifetime_seconds, logger=ctx.log
    )
    ca = Path(spec.tls.ca_file) if spec.tls.ca_file else None
    channel = ctx.channel_factory(
        spec.pubsub_endpoint, tokens=tokens, tls=TlsSettings(enabled=True, ca_file=ca)
    )
    ctx.log.info("connecting to Salesforce at %s (%s)", spec.pubsub_endpoint, provider.name)
    return Source(
        channel=channel,
        tokens=tokens,
        endpoint=spec.pubsub_endpoint,
        description=f"salesforce {spec.pubsub_endpoint}",
        ca_file=ca,
    )


def _emulator_login(
    spec: EmulatorSpec, login_url: str, ca_file: Path | None, ctx: _Context
) -> TokenManager:
    if spec.client_secret is not None:
        secret = ctx.secrets.resolve(spec.client_secret)
    else:
        from ingest.emulator.server import DEFAULT_CLIENT

        secret = Secret(DEFAULT_CLIENT.client_secret)
    provider = ClientCredentials(
        login_url,
        client_id=_value(spec.client_id, ctx.secrets),
        client_secret=secret,
        http=ctx.http,
        ca_file=ca_file,
        clock=ctx.clock,
    )
    return TokenManager(provider, clock=ctx.clock, logger=ctx.log)


def _external_emulator(spec: EmulatorSpec, ctx: _Context) -> Source:
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    endpoint = f"{host}:{spec.grpc_port}"
    scheme = "https" if spec.tls.enabled else "http"
    ca = Path(spec.tls.ca_file) if spec.tls.enabled and spec.tls.ca_file else None
    tokens = _emulator_login(spec, f"{scheme}://{host}:{spec.http_port}", ca, ctx)
    channel = ctx.channel_factory(
        endpoint, tokens=tokens, tls=TlsSettings(enabled=spec.tls.enabled, ca_file=ca)
    )
    ctx.log.info("connecting to the emulator at %s (tls=%s)", endpoint, spec.tls.enabled)
    return Source(
        channel=channel,
        tokens=tokens,
        endpoint=endpoint,
        description=f"emulator {endpoint}",
        ca_file=ca,
    )


def _in_process_emulator(spec: EmulatorSpec, topics: Sequence[TopicSpec], ctx: _Context) -> Source:
    # The emulator is only loaded when it runs here: a landing process that reaches Salesforce
    # or an external emulator starts faster without it.
    from ingest.emulator.catalogue import default_catalogue
    from ingest.emulator.cometd import CometdSettings
    from ingest.emulator.managed import ManagedSubscriptionConfig
    from ingest.emulator.server import Emulator, EmulatorConfig

    catalogue = default_catalogue()
    state = Path(spec.state_dir) if spec.state_dir else None
    managed = tuple(
        ManagedSubscriptionConfig(t.managed_subscription, t.topic, default_replay="EARLIEST")
        for t in topics
        if t.managed_subscription is not None and t.topic in catalogue
    )
    emulator = Emulator(
        catalogue,
        EmulatorConfig(
            host=spec.host,
            grpc_port=spec.grpc_port,
            http_port=spec.http_port,
            tls=spec.tls.enabled,
            cert_dir=state / "tls" if state is not None and spec.tls.enabled else None,
            state_dir=state,
            keepalive_interval=spec.keepalive_seconds,
            managed_subscriptions=managed,
            # A Streaming API long poll is the CometD counterpart of a keepalive.
            streaming=CometdSettings(poll_timeout=spec.keepalive_seconds),
        ),
        clock=ctx.clock,
    )
    emulator.start()
    try:
        tokens = _emulator_login(spec, emulator.http_url, emulator.ca_cert_path, ctx)
        if ctx.on_start is not None:
            ctx.on_start(tokens, emulator.ca_cert_path)
        generator, stop = _generate(emulator, spec, ctx.log)
        channel = ctx.channel_factory(
            emulator.grpc_target,
            tokens=tokens,
            tls=TlsSettings(enabled=spec.tls.enabled, ca_file=emulator.ca_cert_path),
        )
    except BaseException:
        emulator.close()
        raise
    ctx.log.info("started the in-process emulator at %s", emulator.grpc_target)
    return Source(
        channel=channel,
        tokens=tokens,
        endpoint=emulator.grpc_target,
        description=f"in-process emulator {emulator.grpc_target}",
        emulator=emulator,
        generator=generator,
        stop_generating=stop,
        ca_file=emulator.ca_cert_path,
    )


def _generate(
    emulator: Emulator, spec: EmulatorSpec, log: logging.Logger
) -> tuple[threading.Thread | None, threading.Event | None]:
    """Generate the workload into an emulator whose log is empty (a fresh org); a log kept in
    ``state_dir`` from an earlier run is served as it is."""
    from ingest.emulator.workload import Workload

    if any(emulator.log(t.name) for t in emulator.catalogue):
        return None, None
    workload = spec.workload
    # `timestamps: now` stamps each transaction with the moment it is generated, so the lag
    # `sfcdc status` shows is the real time an event took to reach the lake.
    clock_ms = (lambda: time.time_ns() // 1_000_000) if workload.timestamps == "now" else None
    generator = Workload(emulator.catalogue, seed=spec.seed, clock_ms=clock_ms)
    # REST queries and Bulk API jobs answer from what this workload generates; with a
    # state_dir the records are kept there too, so a later command (`sfcdc resync`) that
    # starts the emulator again on the same directory still reads them.
    emulator.serve_records(generator.truth)
    rate = workload.events_per_second
    # Paced generation appends about a tenth of a second's worth at a time.
    size = _GENERATE_CHUNK if rate is None else max(1, min(_GENERATE_CHUNK, int(rate / 10)))

    def chunks() -> Iterator[list[EmittedEvent]]:
        remaining = workload.events
        while remaining > 0:
            batch = list(generator.events(min(remaining, size)))
            remaining -= len(batch)
            yield batch
        remaining = workload.platform_events
        while remaining > 0:
            batch = generator.platform_events(min(remaining, size))
            remaining -= len(batch)
            yield batch

    if rate is None:
        count = sum(len(emulator.append(batch)) for batch in chunks())
        log.info("generated %d events into the emulator (seed %d)", count, spec.seed)
        return None, None
    stop = threading.Event()

    def run() -> None:
        count = 0
        started = time.monotonic()
        for batch in chunks():
            count += len(emulator.append(batch))
            # Pace the appends so the average rate is the configured one.
            if stop.wait(max(0.0, started + count / rate - time.monotonic())):
                return
        log.info("generated %d events into the emulator (seed %d)", count, spec.seed)

    thread = threading.Thread(target=run, name="sfcdc-emulator-workload", daemon=True)
    thread.start()
    return thread, stop
