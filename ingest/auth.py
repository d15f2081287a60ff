"""Credentials for the Pub/Sub API: secrets, token providers and a refreshing token manager.

Every RPC carries three headers: ``accesstoken`` (an OAuth access token or SOAP session id),
``instanceurl`` (the org's My Domain URL) and ``tenantid`` (the org id). A
:class:`TokenProvider` obtains them with one of Salesforce's login flows; a
:class:`TokenManager` caches them, refreshes them before they expire and after the server
rejects them, and is what the gRPC channel asks on every call.

Secrets never travel as plain strings: configuration names them with a :data:`SecretRef`
(``{env: NAME}`` or ``{secret: {scope: ..., key: ...}}``), an injected
:class:`SecretResolver` turns the reference into a :class:`Secret`, and only
:meth:`Secret.reveal` gives the value back, at the moment it is put on the wire.

Salesforce access tokens carry no expiry: the manager assumes a session lifetime (two hours
unless configured) counted from the token's ``issued_at`` and refreshes ahead of it.

The secrets and their resolvers live in :mod:`ingest.auth_secrets`, the login flows in
:mod:`ingest.auth_flows`; this module keeps the :class:`TokenManager` and re-exports every
public name of both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ingest.auth_flows import (
    ClientCredentials,
    Credentials,
    DeprecatedAuthFlowWarning,
    JwtBearer,
    RefreshToken,
    SoapLogin,
    StaticToken,
    TokenProvider,
    UsernamePassword,
    http_client,
)
from ingest.auth_secrets import (
    DatabricksSecrets,
    Dbutils,
    DbutilsSecrets,
    EnvRef,
    EnvSecrets,
    ScopeRef,
    Secret,
    SecretRef,
    SecretResolver,
    StaticSecrets,
    parse_secret_ref,
)

__all__ = [
    "ClientCredentials",
    "Credentials",
    "DatabricksSecrets",
    "Dbutils",
    "DbutilsSecrets",
    "DeprecatedAuthFlowWarning",
    "EnvRef",
    "EnvSecrets",
    "JwtBearer",
    "RefreshToken",
    "ScopeRef",
    "Secret",
    "SecretRef",
    "SecretResolver",
    "SoapLogin",
    "StaticSecrets",
    "StaticToken",
    "TokenManager",
    "TokenProvider",
    "UsernamePassword",
    "http_client",
    "parse_secret_ref",
]

_log = logging.getLogger(__name__)

_DEFAULT_SESSION_LIFETIME = 2 * 60 * 60.0
_DEFAULT_REFRESH_MARGIN = 10 * 60.0


@dataclass
class _State:
    credentials: Credentials | None = None
    refresh_at: float = 0.0
    stale: bool = True
    refreshes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class TokenManager:
    """The current credentials of one provider, refreshed ahead of expiry and on rejection.

    Thread-safe: many streams share one manager and at most one login runs at a time; callers
    that arrive during a login wait for it and reuse its result. ``session_lifetime`` is
    assumed for tokens that carry no expiry (Salesforce's default session timeout is two
    hours); a refresh happens ``refresh_margin`` seconds before the expiry.
    """

    def __init__(
        self,
        provider: TokenProvider,
        *,
        clock: Callable[[], float] = time.time,
        session_lifetime: float = _DEFAULT_SESSION_LIFETIME,
        refresh_margin: float = _DEFAULT_REFRESH_MARGIN,
        logger: logging.Logger | None = None,
    ) -> None:
        if session_lifetime <= 0:
            raise ValueError(f"session_lifetime must be > 0 seconds (got {session_lifetime})")
        if refresh_margin < 0:
            raise ValueError(f"refresh_margin must be >= 0 seconds (got {refresh_margin})")
        self._provider = provider
        self._clock = clock
        self._lifetime = session_lifetime
        self._margin = refresh_margin
        self._log = logger or _log
        self._state = _State()

    @property
    def provider(self) -> TokenProvider:
        return self._provider

    @property
    def refreshes(self) -> int:
        """How many logins this manager has made."""
        return self._state.refreshes

    def current(self) -> Credentials:
        """Valid credentials, logging in first if there are none or they are due."""
        state = self._state
        with state.lock:
            if state.stale or state.credentials is None or self._clock() >= state.refresh_at:
                self._refresh(state)
            assert state.credentials is not None
            return state.credentials

    def invalidate(self, rejected: Credentials | None = None) -> None:
        """Mark the credentials stale after the server rejected them.

        With ``rejected`` (the credentials that were used), nothing happens when they have
        already been replaced: several streams failing on the same expired token cause a
        single login.
        """
        state = self._state
        with state.lock:
            if rejected is not None and state.credentials is not rejected:
                return
            state.stale = True
        self._log.info("credentials of %s invalidated after a rejection", self._provider.name)

    def _refresh(self, state: _State) -> None:
        started = self._clock()
        credentials = self._provider.fetch()
        expires_at = credentials.expires_at
        if expires_at is None:
            expires_at = credentials.issued_at + self._lifetime
        lifetime = max(expires_at - credentials.issued_at, 0.0)
        margin = min(self._margin, lifetime / 2)
        state.credentials = credentials
        state.refresh_at = expires_at - margin
        state.stale = False
        state.refreshes += 1
        self._log.info(
            "logged in with %s: tenant %s at %s, refresh due in %.0f s (login took %.2f s)",
            self._provider.name,
            credentials.tenant_id,
            credentials.instance_url,
            max(state.refresh_at - self._clock(), 0.0),
            self._clock() - started,
        )

    def __repr__(self) -> str:
        return f"TokenManager({self._provider!r})"
