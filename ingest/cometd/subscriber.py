"""A resilient Streaming API subscription: handshake, subscribe, then long-poll connects.

:class:`CometdSubscription` is an iterator of the items of :mod:`ingest.cometd.messages`.
The session follows the server's ``advice``: after each connect reply the next connect is sent
after ``interval``, never later than the guide's deadlines allow (40 s after a reply with
events, 110 s after an idle one, less a safety margin), and each long poll waits ``timeout``
plus a margin before it counts as lost. How long the caller keeps an item before asking for
the next is the caller's: a caller that holds a batch past 40 s finds the session expired and
the subscription reconnects (nothing is lost, see below).

Recovery:

- ``403::Unknown client``, ``reconnect: handshake`` advice, a network failure, a server error,
  a lost long poll or a body that is not JSON: a new handshake and new subscriptions, each
  channel from the position the *caller* has durably stored (``durable_position(channel)``),
  or after the last notification handed out when no callback is given; announced by a
  :class:`~ingest.cometd.messages.Reconnected` item. Consecutive failures wait a
  full-jitter backoff (:class:`~ingest.client.retry.RetryPolicy`) and are bounded by it.
- ``401::Authentication invalid`` (on connect, or as a denied handshake's failure reason):
  the token manager logs in again, then a new handshake; at most ``retry.auth_retries`` times
  in a row.
- ``400`` invalid replay id on subscribe: ``on_corrupted="fail"`` raises
  :class:`~ingest.errors.StreamingReplayError`; ``"earliest"`` / ``"latest"`` yield a
  :class:`~ingest.cometd.messages.ReplayGap` and subscribe the channel with ``-2`` / ``-1``.
- Anything else the guide lists (channel, limit, protocol errors, a denied handshake) raises
  its :mod:`ingest.errors` class at once.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal

import httpx

from ingest.auth import TokenManager
from ingest.auth_flows import Credentials, http_client
from ingest.client.retry import RetryPolicy
from ingest.cometd.messages import (
    REPLAY_ALL,
    REPLAY_NEW,
    IdleConnect,
    MalformedMessage,
    Notification,
    NotificationBatch,
    Reconnected,
    ReplayGap,
    StreamItem,
    parse_notification,
    split_messages,
)
from ingest.cometd.protocol import (
    MAX_REQUEST_BYTES,
    Advice,
    classify,
    connect_message,
    disconnect_message,
    handshake_message,
    pack,
    subscribe_message,
)
from ingest.cometd.transport import BayeuxTransport, RawAnswer
from ingest.errors import (
    AuthUnavailableError,
    HandshakeDeniedError,
    StreamingAuthError,
    StreamingError,
    StreamingProtocolError,
    StreamingReplayError,
    StreamingUnavailableError,
    UnknownClientError,
)

__all__ = ["CometdSubscription", "CorruptedReplayPolicy"]

CorruptedReplayPolicy = Literal["fail", "earliest", "latest"]

_log = logging.getLogger(__name__)
_VERSION = re.compile(r"^\d{2}\.\d$")
MAX_GAP_AFTER_EVENTS = 40.0
MAX_GAP_IDLE = 110.0
_GAP_MARGIN = 10.0
_POLL_MARGIN = 15.0
_META_TIMEOUT = 60.0
# A /meta/disconnect is a courtesy to the server: never wait long for its answer.
_DISCONNECT_TIMEOUT = 5.0
# How long past the requested poll time a quiet-mode connect may take before it counts as idle.
_QUIET_MARGIN = 5.0


class _MalformedBody(StreamingProtocolError):
    """An answer that is not a JSON array of messages; ``raw`` is its text."""

    def __init__(self, message: str, *, raw: str, code: int, channel: str) -> None:
        super().__init__(message, code=code, channel=channel)
        self.raw = raw


class CometdSubscription:
    """Subscribes to Streaming API channels and yields :data:`StreamItem` values.

    ``channels`` maps each channel (``/topic/<Name>``, ``/u/<name>``, ``/event/<Name>__e``,
    ``/data/<Object>ChangeEvent``) to its first replay value: ``-1`` new events only, ``-2``
    every retained event, or a stored replay id (events after it); a plain sequence of
    channels starts them all at ``-1``. ``durable_position(channel)`` returns the replay id of
    the last notification the caller has durably stored for ``channel`` (or the channel's
    initial value when none is stored); it is called, in the caller's thread, before each
    re-subscription. ``tokens`` supplies the access token and the instance URL.

    ``poll_timeout`` (seconds) asks the server to hold each long poll at most that long (the
    connect's ``advice.timeout``, which CometD servers honour) instead of its own ``advice``
    (110 s on Salesforce), so an :class:`~ingest.cometd.messages.IdleConnect` comes within
    that time of the last notification: what a landing that stops once caught up uses. A
    connect still unanswered a few seconds after it counts as idle too.

    Sessions end with a ``/meta/disconnect``: on :meth:`close` (also ending a waiting long
    poll) and before every new handshake while the old session may still be alive (a lost
    poll, a network failure, a body that is not JSON), so the org's concurrent-client
    allocation is not held by sessions left to expire.

    ``http`` replaces the HTTP client (then its TLS settings and cookie jar are the caller's);
    otherwise one verifying certificates is made, trusting ``ca_file`` when given. ``clock``,
    ``sleep`` and ``rand`` drive time, waits and jitter (tests pass fakes); ``logger``
    receives one line per session change, never a token or a payload.
    """

    def __init__(
        self,
        tokens: TokenManager,
        channels: Mapping[str, int] | Sequence[str],
        *,
        api_version: str = "62.0",
        durable_position: Callable[[str], int] | None = None,
        on_corrupted: CorruptedReplayPolicy = "fail",
        http: httpx.Client | None = None,
        ca_file: str | None = None,
        retry: RetryPolicy | None = None,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        poll_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        rand: Callable[[], float] = random.random,
        logger: logging.Logger | None = None,
    ) -> None:
        initial = (
            dict(channels) if isinstance(channels, Mapping) else dict.fromkeys(channels, REPLAY_NEW)
        )
        problems = []
        if not initial:
            problems.append("channels: expected at least one channel")
        for channel, replay in initial.items():
            if not isinstance(channel, str) or not channel.startswith("/") or len(channel) < 2:
                problems.append(f"channel {channel!r}: expected a name with a leading '/'")
            if not isinstance(replay, int) or isinstance(replay, bool) or replay < REPLAY_ALL:
                problems.append(
                    f"channel {channel!r}: replay must be -1 (new), -2 (all retained) or a "
                    f"replay id >= 0 (got {replay!r})"
                )
        if not isinstance(api_version, str) or not _VERSION.match(api_version):
            problems.append(f"api_version must look like '62.0' (got {api_version!r})")
        elif float(api_version) < 37.0:
            problems.append(
                f"api_version must be 37.0 or later for durable replay (got {api_version!r})"
            )
        if on_corrupted not in ("fail", "earliest", "latest"):
            problems.append(
                f"on_corrupted must be 'fail', 'earliest' or 'latest' (got {on_corrupted!r})"
            )
        if poll_timeout is not None and not poll_timeout >= 0:
            problems.append(f"poll_timeout must be >= 0 seconds (got {poll_timeout!r})")
        if not 256 <= max_request_bytes <= MAX_REQUEST_BYTES:
            problems.append(
                f"max_request_bytes must be 256..{MAX_REQUEST_BYTES} (got {max_request_bytes})"
            )
        if problems:
            raise ValueError("invalid CometdSubscription: " + "; ".join(problems))
        self._tokens = tokens
        self._initial = initial
        self._durable = durable_position
        self._on_corrupted = on_corrupted
        self._owns_http = http is None
        self._transport = BayeuxTransport(
            http if http is not None else http_client(ca_file=ca_file, timeout=_META_TIMEOUT),
            api_version=api_version,
        )
        self._retry = retry or RetryPolicy()
        self._limit = max_request_bytes
        self._poll_timeout = poll_timeout
        self._clock = clock
        self._closed = threading.Event()
        self._sleep: Callable[[float], None] = sleep if sleep is not None else self._wait
        self._rand = rand
        self._log = logger or _log
        self._ids = itertools.count(1)
        self._last: dict[str, int] = {}
        self._superseded: dict[str, tuple[int, int]] = {}
        self._iterated = False
        # The live session (client id and the credentials it was made with) until it is
        # disconnected or known to be gone.
        self._session: tuple[str, Credentials] | None = None
        self._session_lock = threading.Lock()
        self.client_id = ""
        self.handshakes = 0
        self.connects = 0
        self.notifications = 0
        self.disconnects = 0

    def _wait(self, seconds: float) -> None:
        # Backoff waits end early when the subscription is closed.
        self._closed.wait(seconds)

    def __repr__(self) -> str:
        return f"CometdSubscription({sorted(self._initial)}, api={self._transport.api_version})"

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(self._initial)

    def close(self) -> None:
        """Stop: the session is disconnected (which ends a waiting long poll) and iteration
        ends after the current request (an owned HTTP client is closed too)."""
        self._closed.set()
        self._disconnect("closed")
        if self._owns_http:
            self._transport.close()

    def _disconnect(self, why: str, *, credentials: Credentials | None = None) -> None:
        """Send ``/meta/disconnect`` for the live session, if any (once; failures only
        logged: the session then expires on the server), with ``credentials`` when given (a
        token obtained after the session's own was rejected) or the session's own."""
        with self._session_lock:
            session, self._session = self._session, None
        if session is None:
            return
        client_id, own = session
        credentials = credentials or own
        body = next(pack([disconnect_message(client_id, self._next_id())], limit=self._limit))
        try:
            self._transport.post(credentials, body, timeout=_DISCONNECT_TIMEOUT, stage="disconnect")
        except (StreamingError, RuntimeError) as exc:  # RuntimeError: the client is closed
            self._log.info(
                "streaming: could not disconnect client %s (%s): %s; the server lets it expire",
                client_id[:8],
                why,
                exc,
            )
            return
        self.disconnects += 1
        self._log.info("streaming: disconnected client %s (%s)", client_id[:8], why)

    def _forget_session(self) -> None:
        """The server ended the session itself (unknown client, authentication revoked)."""
        with self._session_lock:
            self._session = None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> CometdSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- positions ---------------------------------------------------------------------------

    def _resume(self, channel: str) -> int:
        if self._durable is not None:
            value = self._durable(channel)
        else:
            value = self._last.get(channel, self._initial[channel])
        superseded = self._superseded.get(channel)
        if superseded is not None and value == superseded[0]:
            value = superseded[1]
        return value

    def _next_id(self) -> str:
        return str(next(self._ids))

    # -- the session loop --------------------------------------------------------------------

    def __iter__(self) -> Iterator[StreamItem]:
        if self._iterated:
            raise RuntimeError(
                f"{self!r} can be iterated once; create a new subscription resuming from the "
                "stored replay ids"
            )
        self._iterated = True
        return self._run()

    def _run(self) -> Generator[StreamItem, None, None]:
        try:
            yield from self._sessions()
        finally:
            self._disconnect("the subscription ended")

    def _sessions(self) -> Generator[StreamItem, None, None]:
        recovery = _Recovery(self._retry, self._tokens, self._sleep, self._rand, self._log)
        reason = ""
        first = True
        while not self._closed.is_set():
            positions = {c: r if first else self._resume(c) for c, r in self._initial.items()}
            credentials: Credentials | None = None
            try:
                credentials = self._tokens.current()
                self._disconnect("before a new handshake", credentials=credentials)
                client_id, advice = self._handshake(credentials)
                recovery.handshook()
                if not first:
                    yield Reconnected(reason, recovery.consecutive, positions, client_id)
                first = False
                yield from self._subscribe_all(credentials, client_id, positions)
                self._log.info(
                    "streaming: subscribed %d channel(s) as client %s",
                    len(positions),
                    client_id[:8],
                )
                yield from self._poll(credentials, client_id, advice, recovery)
                return
            except (StreamingError, AuthUnavailableError) as exc:
                if self._closed.is_set():
                    return
                if isinstance(exc, UnknownClientError):
                    self._forget_session()
                # Any other session may still be alive on the server (a lost poll, a body
                # that was not JSON, a network failure, a rejected token): it is disconnected
                # before the next handshake, with the credentials that handshake uses.
                reason = recovery.recover(exc, credentials)

    def _post(
        self, credentials: Credentials, body: str, *, timeout: float, stage: str
    ) -> list[tuple[str, Any]]:
        answer = self._transport.post(credentials, body, timeout=timeout, stage=stage)
        assert answer is not None
        return self._messages(answer, stage)

    @staticmethod
    def _messages(answer: RawAnswer, stage: str) -> list[tuple[str, Any]]:
        try:
            return split_messages(answer.text)
        except ValueError as exc:
            raise _MalformedBody(
                f"{stage}: expected a JSON array of Bayeux messages, got HTTP {answer.status} "
                f"with {len(answer.text)} characters that are not ({exc})",
                raw=answer.text,
                code=answer.status,
                channel=stage,
            ) from exc

    @staticmethod
    def _reply(messages: list[tuple[str, Any]], message_id: str, stage: str) -> Mapping[str, Any]:
        for _raw, message in messages:
            if isinstance(message, Mapping) and str(message.get("id", "")) == message_id:
                return message
        for _raw, message in messages:
            if isinstance(message, Mapping) and message.get("successful") is False:
                return message
        raise StreamingProtocolError(
            f"{stage}: the answer holds no reply to message {message_id} "
            f"({len(messages)} messages)",
            channel=stage,
        )

    def _handshake(self, credentials: Credentials) -> tuple[str, Advice]:
        message_id = self._next_id()
        body = next(pack([handshake_message(message_id)], limit=self._limit))
        messages = self._post(credentials, body, timeout=_META_TIMEOUT, stage="handshake")
        reply = self._reply(messages, message_id, "handshake")
        if not reply.get("successful"):
            raise classify(reply, stage="handshake")
        client_id = reply.get("clientId")
        if not isinstance(client_id, str) or not client_id:
            raise StreamingProtocolError("handshake: the successful reply has no clientId")
        types = reply.get("supportedConnectionTypes")
        if isinstance(types, list) and "long-polling" not in types:
            raise StreamingProtocolError(
                f"handshake: the server offers {types}, this client speaks long-polling only"
            )
        self.client_id = client_id
        with self._session_lock:
            self._session = (client_id, credentials)
        self.handshakes += 1
        self._log.info(
            "streaming: handshake with %s (client %s)",
            self._transport.endpoint(credentials),
            client_id[:8],
        )
        return client_id, Advice.read(reply, Advice())

    def _subscribe_all(
        self, credentials: Credentials, client_id: str, positions: dict[str, int]
    ) -> Generator[StreamItem, None, None]:
        pending = dict(positions)
        while pending:
            ids = {self._next_id(): c for c in pending}
            messages = [subscribe_message(client_id, c, pending[c], i) for i, c in ids.items()]
            replies: dict[str, Mapping[str, Any]] = {}
            for body in pack(messages, limit=self._limit):
                answer = self._post(credentials, body, timeout=_META_TIMEOUT, stage="subscribe")
                for _raw, reply in answer:
                    if isinstance(reply, Mapping) and str(reply.get("id", "")) in ids:
                        replies[str(reply["id"])] = reply
            retry: dict[str, int] = {}
            for message_id, channel in ids.items():
                reply = replies.get(message_id)
                if reply is None:
                    raise StreamingProtocolError(
                        f"subscribe {channel}: the server sent no reply to it", channel=channel
                    )
                if reply.get("successful"):
                    continue
                error = classify(reply, stage=f"subscribe {channel}")
                if not isinstance(error, StreamingReplayError):
                    raise error
                replay = pending[channel]
                resumed = self._corrupted(channel, replay, error)
                self._superseded[channel] = (replay, resumed)
                positions[channel] = resumed
                yield ReplayGap(channel, replay, resumed, str(error))
                retry[channel] = resumed
            pending = retry

    def _corrupted(self, channel: str, replay: int, error: StreamingReplayError) -> int:
        if replay < 0 or self._on_corrupted == "fail":
            raise StreamingReplayError(
                f"subscribe {channel}: the server rejected replay id {replay}: it is not in "
                "the channel's retention window (24 hours for PushTopic and generic events, "
                "72 hours for platform and change events). on_corrupted='earliest' resumes at "
                "the oldest retained event (nothing retained is skipped), on_corrupted="
                "'latest' at new events only (everything in between is skipped).",
                error=error.error,
                code=error.code,
                channel=channel,
            ) from error
        resumed = REPLAY_ALL if self._on_corrupted == "earliest" else REPLAY_NEW
        self._log.warning(
            "streaming: %s rejected replay id %d; on_corrupted=%s resumes at %d",
            channel,
            replay,
            self._on_corrupted,
            resumed,
        )
        return resumed

    def _poll(
        self,
        credentials: Credentials,
        client_id: str,
        advice: Advice,
        recovery: _Recovery,
    ) -> Generator[StreamItem, None, None]:
        had_events = True
        while not self._closed.is_set():
            limit = (MAX_GAP_AFTER_EVENTS if had_events else MAX_GAP_IDLE) - _GAP_MARGIN
            wait = min(advice.interval, limit)
            if wait > 0:
                self._sleep(wait)
                if self._closed.is_set():
                    return
            message_id = self._next_id()
            quiet = self._poll_timeout
            connect = connect_message(client_id, message_id, timeout=quiet)
            body = next(pack([connect], limit=self._limit))
            try:
                if quiet is None:
                    messages = self._post(
                        credentials, body, timeout=advice.timeout + _POLL_MARGIN, stage="connect"
                    )
                else:
                    answer = self._transport.post(
                        credentials,
                        body,
                        timeout=min(quiet, advice.timeout) + _QUIET_MARGIN,
                        stage="connect",
                        idle_on_timeout=True,
                    )
                    if answer is None:
                        # The server kept the poll past the time asked for: nothing was
                        # waiting. A caller that goes on gets a new session (the poll is
                        # still held on the old one, which is disconnected first).
                        yield IdleConnect(self._clock(), client_id)
                        raise StreamingUnavailableError(
                            f"connect: no answer within {min(quiet, advice.timeout):g} s as "
                            f"asked (plus {_QUIET_MARGIN:g} s); reconnecting",
                            channel="/meta/connect",
                        )
                    messages = self._messages(answer, "connect")
            except _MalformedBody as exc:
                # Handed out for quarantine; the reconnect replays its events from the
                # stored positions, so nothing is lost with it.
                yield MalformedMessage(exc.raw, str(exc), received_at=self._clock())
                raise
            received = self._clock()
            self.connects += 1
            notifications: list[Notification] = []
            malformed: list[MalformedMessage] = []
            reply: Mapping[str, Any] | None = None
            for raw, message in messages:
                if not isinstance(message, Mapping):
                    malformed.append(
                        MalformedMessage(raw, "expected a JSON object", received_at=received)
                    )
                    continue
                channel = message.get("channel")
                if channel == "/meta/connect" and str(message.get("id", "")) == message_id:
                    reply = message
                elif isinstance(channel, str) and channel.startswith("/meta/"):
                    self._log.debug("streaming: ignored a %s reply during connect", channel)
                else:
                    item = parse_notification(raw, message, received_at=received)
                    if isinstance(item, Notification):
                        notifications.append(item)
                    else:
                        malformed.append(item)
            if notifications:
                for n in notifications:
                    self._last[n.channel] = n.replay_id
                self.notifications += len(notifications)
                yield NotificationBatch(tuple(notifications), received, client_id)
            yield from malformed
            if reply is None:
                raise StreamingProtocolError(
                    f"connect: the answer holds no reply to message {message_id}",
                    channel="/meta/connect",
                )
            advice = Advice.read(reply, advice)
            if not reply.get("successful"):
                raise classify(reply, stage="connect")
            recovery.healthy()
            had_events = bool(notifications)
            if not notifications and not malformed:
                yield IdleConnect(received, client_id)
            if advice.reconnect == "handshake":
                raise UnknownClientError(
                    "connect: the server advised a new handshake", channel="/meta/connect"
                )
            if advice.reconnect == "none":
                raise StreamingProtocolError(
                    "connect: the server advised not to reconnect (reconnect: none)",
                    channel="/meta/connect",
                )


class _Recovery:
    """Consecutive-failure bookkeeping: backoff for transient failures, a new token for
    rejected ones, raising once attempts run out or retrying cannot help."""

    def __init__(
        self,
        retry: RetryPolicy,
        tokens: TokenManager,
        sleep: Callable[[float], None],
        rand: Callable[[], float],
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retry = retry
        self._tokens = tokens
        self._sleep = sleep
        self._rand = rand
        self._log = log
        self._clock = clock
        self._since = clock()
        # A handshake succeeded once: the server was reached.
        self.contacted = False
        self.attempts = 0
        self.auth_failures = 0

    @property
    def consecutive(self) -> int:
        return max(self.attempts, self.auth_failures)

    def handshook(self) -> None:
        self.contacted = True
        self.auth_failures = 0

    def healthy(self) -> None:
        self.attempts = 0
        self.auth_failures = 0

    def recover(
        self, error: StreamingError | AuthUnavailableError, credentials: Credentials | None
    ) -> str:
        """Wait or refresh as ``error`` requires and return the reason to report; raise
        ``error`` when retrying cannot help or attempts are exhausted."""
        if isinstance(error, StreamingAuthError):
            self.auth_failures += 1
            if self.auth_failures > self._retry.auth_retries:
                raise StreamingAuthError(
                    f"{error} (rejected {self.auth_failures} times in a row even after logging "
                    "in again; check the user's API and Streaming API permissions)",
                    error=error.error,
                    code=error.code,
                    channel=error.channel,
                    failure_reason=error.failure_reason,
                ) from error
            self._tokens.invalidate(credentials)
            self._log.warning("streaming: %s; logging in again", error)
            if self.auth_failures > 1:
                self._sleep(self._retry.delay(self.auth_failures - 1, rand=self._rand))
            return f"authentication rejected ({error.error or error}); token refreshed"
        transient = isinstance(
            error, StreamingUnavailableError | UnknownClientError | StreamingProtocolError
        ) or (isinstance(error, HandshakeDeniedError) and "simultaneous" in error.failure_reason)
        if isinstance(error, AuthUnavailableError):
            transient = True
        if not transient or (
            isinstance(error, StreamingProtocolError)
            and not isinstance(error, _MalformedBody)
            and error.code in (400, 413)
        ):
            raise error
        self.attempts += 1
        if self.attempts > self._retry.max_attempts:
            raise StreamingUnavailableError(
                f"gave up after {self._retry.max_attempts} consecutive failed attempts; last "
                f"failure: {error}",
                channel=getattr(error, "channel", ""),
            ) from error
        if isinstance(error, UnknownClientError) and self.attempts == 1:
            self._log.info("streaming: %s; handshaking again", error)
        else:
            delay = self._retry.delay(self.attempts, rand=self._rand)
            waited = self._clock() - self._since
            if not self.contacted and self._retry.first_contact_over(waited, delay):
                # Never reached: a wrong instance URL, a name that does not resolve, a login
                # endpoint that is down. Said now, rather than after every backoff.
                raise StreamingUnavailableError(
                    f"the first connection failed ({self.attempts} attempts in {waited:.1f} "
                    f"s, the server never answered): {error}",
                    channel=getattr(error, "channel", ""),
                ) from error
            self._log.warning(
                "streaming: %s; reconnecting in %.2f s (attempt %d of %d)",
                error,
                delay,
                self.attempts,
                self._retry.max_attempts,
            )
            self._sleep(delay)
        return str(error)
