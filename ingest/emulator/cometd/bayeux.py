"""The Bayeux side of the Streaming API: ``POST /cometd/<version>`` with long polling.

Each request body is a JSON message or an array of them; the answer is an array with one
reply per message, and the events a ``/meta/connect`` delivers come before its reply. Messages
of one request are processed in order, a ``/meta/connect`` last.

Sessions. A successful ``/meta/handshake`` creates a client id and sets the ``BAYEUX_BROWSER``
cookie; later requests must send both. A session expires when its client does not reconnect
within ``reconnect_deadline`` (40 s) of a reply that carried events or answered a handshake or
subscribe, or within ``idle_reconnect_deadline`` (110 s) of an empty connect reply (both on the
emulator's clock); its next request then gets ``403::Unknown client`` with ``reconnect:
handshake`` advice.

A connect is answered at once when the session has messages waiting (at most ``batch_size``
per reply), otherwise held for ``poll_timeout`` real seconds, or less when the connect's own
``advice.timeout`` asks for less (CometD keeps a client's connect advice as the session's
transient timeout), or until a message arrives. Every request must carry ``Authorization:
Bearer <token>`` (or ``OAuth <token>``); the token is checked on each one, so a revoked token
ends a connected client with ``401::Authentication invalid`` and ``reconnect: none`` (the
session ends with that answer).

Sessions left open. A session that ends by expiring (its client neither reconnected nor sent
``/meta/disconnect``) is counted in :attr:`BayeuxServer.abandoned`;
:meth:`BayeuxServer.left_open` adds the sessions still open. An org allows a limited number of
concurrent CometD clients, so a client that stops or handshakes again must disconnect first;
sessions the server ends itself (``expire``, a revoked token) do not count.

The guide's error replies (``error`` field ``<code>::<message>``) are in :data:`ERRORS`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.emulator.cometd.channels import Delivery, Hub, channel_kind
from ingest.emulator.faults import Faults
from ingest.emulator.oauth import GrantInfo, TokenStore
from ingest.emulator.routes import HttpAnswer, HttpRequest

__all__ = ["BROWSER_COOKIE", "ERRORS", "BayeuxServer", "CometdSettings"]

BROWSER_COOKIE = "BAYEUX_BROWSER"
_MIN_VERSION = 23.0

ERRORS = {
    "version_missing": "400::API version in the URI is mandatory. URI format: '/cometd/{v}'",
    "version_unsupported": "400::Unsupported API version. Only API versions '23.0' and above "
    "are supported. URI format: '/cometd/{v}'",
    "connection_type": "400::Invalid connection type {v}",
    "no_channel": "400::The channel you requested to subscribe to does not exist {v}",
    "channel_missing": "400::Channel name not specified",
    "channel_slash": "400::Channel subscriptions must start with a leading '/'",
    "no_cookie": "400::Client {v} has established a session, but no BAYEUX_BROWSER cookie present",
    "replay": "400::The replayId {v} you provided was invalid. Please provide a valid ID, -2 to "
    "replay all events, or -1 to replay only new events.",
    "auth_invalid": "401::Authentication invalid",
    "auth_missing": "401::Request requires authentication",
    "handshake_denied": "403::Handshake denied",
    "not_handshaken": "403::Client has not completed handshake",
    "unknown_client": "403::Unknown client",
    "restricted": "403::Restricted channel",
    "subscription_limit": "403::Subscription limit exceeded for this topic",
    "concurrent_limit": "403::Organization concurrent user limit exceeded",
    "too_large": "413::Maximum Request Size Exceeded",
    "unknown_channel": "404::Unknown channel",
    "case": "404::channel names may not vary only by case",
}


@dataclass(frozen=True)
class CometdSettings:
    """The Streaming API side of an emulator (see :mod:`ingest.emulator.cometd`).

    ``poll_timeout`` is real seconds a connect is held (Salesforce: 110); the two deadlines are
    seconds on the emulator's clock; ``batch_size`` bounds the events of one connect reply;
    ``retention`` keeps PushTopic and generic messages (24 h); ``max_request_bytes`` is the
    request body limit (32,768); ``max_clients`` the org's concurrent clients and
    ``max_subscribers`` the clients of one channel (Salesforce allocations vary by edition).
    """

    poll_timeout: float = 110.0
    reconnect_deadline: float = 40.0
    idle_reconnect_deadline: float = 110.0
    batch_size: int = 100
    retention: float = 24 * 3600.0
    max_request_bytes: int = 32_768
    max_clients: int = 2000
    max_subscribers: int = 2000
    interval_ms: int = 0

    def problems(self) -> list[str]:
        out = []
        for name in ("poll_timeout", "reconnect_deadline", "idle_reconnect_deadline", "retention"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                out.append(f"streaming.{name}: expected positive seconds, got {value!r}")
        for name in ("batch_size", "max_request_bytes", "max_clients", "max_subscribers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                out.append(f"streaming.{name}: expected an int >= 1, got {value!r}")
        if not isinstance(self.interval_ms, int) or self.interval_ms < 0:
            out.append(f"streaming.interval_ms: expected an int >= 0, got {self.interval_ms!r}")
        return out


@dataclass
class _Session:
    client_id: str
    browser: str
    user_id: str
    generation: int
    deadline: float
    subscriptions: dict[str, int] = field(default_factory=dict)
    connected: bool = False
    poll: int = 0
    revoked: bool = False


class _Drop(Exception):
    """The long poll is lost: close the connection without an answer."""


def _reply(message: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"channel": message.get("channel")}
    if "id" in message:
        out["id"] = message["id"]
    out.update(fields)
    return out


def _error(message: Mapping[str, Any], error: str, **fields: Any) -> dict[str, Any]:
    return _reply(message, successful=False, error=error, **fields)


def _token(request: HttpRequest) -> str | None:
    scheme, _, value = request.header("authorization").partition(" ")
    if scheme.lower() not in ("bearer", "oauth") or not value.strip():
        return None
    return value.strip()


def _cookie(request: HttpRequest, name: str) -> str:
    for part in request.header("cookie").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


class BayeuxServer:
    """Sessions and the Bayeux exchange (see the module docstring). Thread-safe."""

    def __init__(
        self,
        hub: Hub,
        *,
        tokens: TokenStore,
        faults: Faults,
        settings: CometdSettings,
        clock: Callable[[], float],
        channel_error: Callable[[str], str | None],
        secure_cookies: bool,
    ) -> None:
        self._hub = hub
        self._tokens = tokens
        self._faults = faults
        self.settings = settings
        self.batch_size = settings.batch_size
        self.poll_timeout = settings.poll_timeout
        self._clock = clock
        self._channel_error = channel_error
        self._secure = secure_cookies
        self._sessions: dict[str, _Session] = {}
        self._closed = False
        self.requests = 0
        self.disconnected = 0
        self.abandoned = 0

    # -- public helpers ----------------------------------------------------------------------

    def close(self) -> None:
        """End every waiting long poll (their connections are dropped)."""
        with self._hub.lock:
            self._closed = True
            self._hub.wake()

    def reopen(self) -> None:
        with self._hub.lock:
            self._closed = False

    def client_ids(self) -> list[str]:
        with self._hub.lock:
            return list(self._sessions)

    def left_open(self) -> int:
        """Sessions that expired without a ``/meta/disconnect``, plus those still open (on
        the emulator's clock, expired ones are counted as they are found)."""
        with self._hub.lock:
            self._sweep()
            return self.abandoned + len(self._sessions)

    def _end(self, session: _Session, *, abandoned: bool) -> None:
        # Under the lock.
        if self._sessions.pop(session.client_id, None) is not None and abandoned:
            self.abandoned += 1

    def subscriptions(self, client_id: str) -> dict[str, int]:
        """A session's channels and the replay id of the last message it received on each."""
        with self._hub.lock:
            session = self._sessions.get(client_id)
            return dict(session.subscriptions) if session else {}

    def online_users(self, channel: str) -> set[str]:
        with self._hub.lock:
            return {s.user_id for s in self._sessions.values() if channel in s.subscriptions}

    def expire(self, client_id: str | None = None) -> int:
        """Forget one session (or all): its next request gets ``403::Unknown client``."""
        with self._hub.lock:
            ids = [client_id] if client_id is not None else list(self._sessions)
            n = sum(self._sessions.pop(c, None) is not None for c in ids)
            self._hub.wake()
            return n

    def revoke(self, client_id: str | None = None) -> None:
        """Invalidate the authentication of one session (or all): its next request gets
        ``401::Authentication invalid``; a new handshake with a valid token works again."""
        with self._hub.lock:
            for session in self._sessions.values():
                if client_id is None or session.client_id == client_id:
                    session.revoked = True
            self._hub.wake()

    # -- the exchange --------------------------------------------------------------------------

    def answer(self, request: HttpRequest, version: str) -> HttpAnswer:
        """Answer ``POST /cometd/<version>`` (``version`` as in the path, maybe empty)."""
        self.requests += 1
        messages, problem = self._messages(request)
        if problem is not None:
            status, error = problem
            return self._json(status, [_error(m, error) for m in messages or [{}]])
        assert messages is not None
        bad_version = self._version_error(version)
        if bad_version is not None:
            return self._json(400, [_error(m, bad_version) for m in messages])
        token = _token(request)
        grant = self._tokens.check(token) if token else None
        replies: list[Any] = []
        cookies: list[tuple[str, str]] = []
        connect: Mapping[str, Any] | None = None
        for message in messages:
            channel = message.get("channel")
            if channel == "/meta/connect" and connect is None:
                connect = message
                continue
            if channel == "/meta/handshake":
                reply, cookie = self._handshake(message, request, token, grant)
                if cookie:
                    cookies.append(("Set-Cookie", cookie))
                replies.append(reply)
            else:
                replies.append(self._other(message, request, token, grant))
        if connect is not None:
            try:
                replies.extend(self._connect(connect, request, token, grant))
            except _Drop:
                return HttpAnswer(0, drop=True)
        return self._json(200, replies, headers=tuple(cookies))

    def _json(
        self, status: int, replies: Sequence[Any], *, headers: tuple[tuple[str, str], ...] = ()
    ) -> HttpAnswer:
        parts = [r if isinstance(r, str) else json.dumps(r, separators=(",", ":")) for r in replies]
        return HttpAnswer(status, "[" + ",".join(parts) + "]", headers=headers)

    def _messages(
        self, request: HttpRequest
    ) -> tuple[list[Mapping[str, Any]] | None, tuple[int, str] | None]:
        if len(request.body) > self.settings.max_request_bytes:
            return None, (413, ERRORS["too_large"])
        try:
            body = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            return None, (400, "400::Invalid JSON: expected a Bayeux message or an array of them")
        items = body if isinstance(body, list) else [body]
        if not items or not all(isinstance(m, dict) for m in items):
            return None, (400, "400::Invalid message: expected JSON objects with a channel")
        return items, None

    @staticmethod
    def _version_error(version: str) -> str | None:
        if not version:
            return ERRORS["version_missing"].format(v="62.0")
        try:
            number = float(version)
        except ValueError:
            number = 0.0
        if number < _MIN_VERSION:
            return ERRORS["version_unsupported"].format(v="62.0")
        return None

    # -- handshake -------------------------------------------------------------------------

    def _handshake(
        self,
        message: Mapping[str, Any],
        request: HttpRequest,
        token: str | None,
        grant: GrantInfo | None,
    ) -> tuple[dict[str, Any], str]:
        def denied(reason: str) -> tuple[dict[str, Any], str]:
            reply = _error(
                message,
                ERRORS["handshake_denied"],
                advice={"reconnect": "none"},
                ext={"sfdc": {"failureReason": reason}, "replay": True, "payload.format": True},
            )
            return reply, ""

        if token is None:
            return denied(ERRORS["auth_missing"])
        if grant is None:
            return denied(ERRORS["auth_invalid"])
        forced = self._faults.handshake_denial
        if forced is not None:
            return denied(forced)
        types = message.get("supportedConnectionTypes")
        if not isinstance(types, list) or "long-polling" not in types:
            return denied(ERRORS["connection_type"].format(v=types))
        with self._hub.lock:
            self._sweep()
            if len(self._sessions) >= self.settings.max_clients:
                return denied(ERRORS["concurrent_limit"])
            browser = _cookie(request, BROWSER_COOKIE) or secrets.token_hex(12)
            client_id = secrets.token_hex(14)
            self._sessions[client_id] = _Session(
                client_id,
                browser,
                grant.user_id,
                self._faults.session_generation,
                self._clock() + self.settings.reconnect_deadline,
            )
        cookie = f"{BROWSER_COOKIE}={browser}; Path=/; HttpOnly"
        if self._secure:
            cookie += "; Secure"
        reply = _reply(
            message,
            successful=True,
            clientId=client_id,
            version="1.0",
            minimumVersion="1.0",
            supportedConnectionTypes=["long-polling"],
            reestablish=False,
            ext={"replay": True, "payload.format": True},
            advice=self._advice(),
        )
        return reply, cookie

    def _advice(self) -> dict[str, Any]:
        return {
            "reconnect": "retry",
            "interval": self.settings.interval_ms,
            "timeout": int(self.poll_timeout * 1000),
        }

    def _sweep(self) -> None:
        now = self._clock()
        generation = self._faults.session_generation
        for session in list(self._sessions.values()):
            if session.generation != generation:
                self._end(session, abandoned=False)
            elif now > session.deadline and not session.poll:
                self._end(session, abandoned=True)

    # -- session checks ------------------------------------------------------------------------

    def _session(
        self,
        message: Mapping[str, Any],
        request: HttpRequest,
        token: str | None,
        grant: GrantInfo | None,
    ) -> _Session | dict[str, Any]:
        """The message's live session, or the error reply to send (call under the lock)."""
        client_id = message.get("clientId")
        if not client_id:
            return _error(message, ERRORS["not_handshaken"], advice={"reconnect": "handshake"})
        session = self._sessions.get(str(client_id))
        if session is not None and session.generation != self._faults.session_generation:
            self._end(session, abandoned=False)
            session = None
        elif session is not None and self._clock() > session.deadline and not session.poll:
            self._end(session, abandoned=True)
            session = None
        if session is None:
            return _error(
                message, ERRORS["unknown_client"], advice={"reconnect": "handshake", "interval": 0}
            )
        if token is None:
            return _error(message, ERRORS["auth_missing"], advice={"reconnect": "none"})
        if grant is None or session.revoked:
            if session.revoked:
                self._end(session, abandoned=False)
            return _error(
                message, ERRORS["auth_invalid"], advice={"reconnect": "none", "interval": 0}
            )
        if _cookie(request, BROWSER_COOKIE) != session.browser:
            return _error(message, ERRORS["no_cookie"].format(v=session.client_id))
        return session

    # -- subscribe, unsubscribe, disconnect ------------------------------------------------

    def _other(
        self,
        message: Mapping[str, Any],
        request: HttpRequest,
        token: str | None,
        grant: GrantInfo | None,
    ) -> dict[str, Any]:
        channel = message.get("channel")
        if not isinstance(channel, str) or not channel.startswith("/meta/"):
            return _error(message, ERRORS["restricted"])
        with self._hub.lock:
            session = self._session(message, request, token, grant)
            if isinstance(session, dict):
                return session
            session.deadline = self._clock() + self.settings.reconnect_deadline
            if channel == "/meta/subscribe":
                return self._subscribe(message, session)
            if channel == "/meta/unsubscribe":
                sub = message.get("subscription")
                session.subscriptions.pop(str(sub), None)
                return _reply(
                    message, successful=True, clientId=session.client_id, subscription=sub
                )
            if channel == "/meta/disconnect":
                self._end(session, abandoned=False)
                self.disconnected += 1
                self._hub.wake()
                return _reply(message, successful=True, clientId=session.client_id)
        return _error(message, f"400::Unknown meta channel {channel}")

    def _subscribe(self, message: Mapping[str, Any], session: _Session) -> dict[str, Any]:
        sub = message.get("subscription")

        def fail(error: str) -> dict[str, Any]:
            return _error(message, error, clientId=session.client_id, subscription=sub)

        if not isinstance(sub, str) or not sub:
            return fail(ERRORS["channel_missing"])
        if not sub.startswith("/"):
            return fail(ERRORS["channel_slash"])
        forced = self._faults.subscribe_denial
        if forced is not None:
            return fail(forced)
        problem = self._channel_error(sub)
        if problem is not None:
            return fail(problem)
        subscribers = sum(sub in s.subscriptions for s in self._sessions.values())
        if sub not in session.subscriptions and subscribers >= self.settings.max_subscribers:
            return fail(ERRORS["subscription_limit"])
        replay_map = (message.get("ext") or {}).get("replay")
        replay = replay_map.get(sub, -1) if isinstance(replay_map, dict) else -1
        if not isinstance(replay, int) or isinstance(replay, bool):
            return fail(ERRORS["replay"].format(v=replay))
        position = self._hub.resolve(sub, replay)
        if position is None:
            return fail(ERRORS["replay"].format(v=replay))
        session.subscriptions[sub] = position
        self._hub.wake()
        return _reply(message, successful=True, clientId=session.client_id, subscription=sub)

    # -- connect ---------------------------------------------------------------------------

    def _connect(
        self,
        message: Mapping[str, Any],
        request: HttpRequest,
        token: str | None,
        grant: GrantInfo | None,
    ) -> list[Any]:
        kind = message.get("connectionType")
        if kind != "long-polling":
            return [_error(message, ERRORS["connection_type"].format(v=kind))]
        hub = self._hub
        with hub.lock:
            session = self._session(message, request, token, grant)
            if isinstance(session, dict):
                return [session]
            session.poll += 1
            mine = session.poll
            first = not session.connected
            session.connected = True
            ends = time.monotonic() + self._hold(message)
            try:
                while True:
                    if self._closed or self._faults.claim_poll_drop():
                        raise _Drop
                    current = self._sessions.get(session.client_id)
                    generation = self._faults.session_generation
                    if current is not session or session.generation != generation:
                        return [
                            _error(
                                message,
                                ERRORS["unknown_client"],
                                advice={"reconnect": "handshake", "interval": 0},
                            )
                        ]
                    if session.revoked or (token and self._tokens.check(token) is None):
                        if session.revoked:
                            self._end(session, abandoned=False)
                        return [
                            _error(
                                message,
                                ERRORS["auth_invalid"],
                                advice={"reconnect": "none", "interval": 0},
                            )
                        ]
                    deliveries = self._gather(session)
                    left = ends - time.monotonic()
                    if deliveries or first or left <= 0 or session.poll != mine:
                        return self._connect_reply(message, session, deliveries)
                    hub.changed.wait(left)
            finally:
                if session.poll == mine:
                    session.poll = 0

    def _hold(self, message: Mapping[str, Any]) -> float:
        """Seconds to hold a connect: the poll timeout, or less when the client's advice asks."""
        advice = message.get("advice")
        asked = advice.get("timeout") if isinstance(advice, Mapping) else None
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked >= 0:
            return min(self.poll_timeout, asked / 1000.0)
        return self.poll_timeout

    def _connect_reply(
        self, message: Mapping[str, Any], session: _Session, deliveries: list[Delivery]
    ) -> list[Any]:
        grace = (
            self.settings.reconnect_deadline
            if deliveries
            else self.settings.idle_reconnect_deadline
        )
        session.deadline = self._clock() + grace
        out: list[Any] = [d.message(session.client_id) for d in deliveries]
        out.append(
            _reply(message, successful=True, clientId=session.client_id, advice=self._advice())
        )
        return out

    def _gather(self, session: _Session) -> list[Delivery]:
        out: list[Delivery] = []
        room = self.batch_size
        for channel, after in list(session.subscriptions.items()):
            if room <= 0:
                break
            if channel_kind(channel) in ("topic", "generic") and not self._hub.exists(channel):
                continue
            got, position = self._hub.read(channel, after, room, session.user_id)
            session.subscriptions[channel] = position
            out.extend(got)
            room -= len(got)
        return out
