"""Subscribe: one topic, one flow-controlled stream at a time, resubscribed after failures.

:class:`Subscription` is an iterator of lifecycle items (see :mod:`ingest.client.stream`).
When a stream fails, the failure is classified (:mod:`ingest.client.errors`) and:

- transient failures reopen the stream after a full-jitter backoff, at most
  ``retry.max_attempts`` times in a row (the count resets once events flow again);
- credential rejections invalidate the token, which the next call refreshes, and reopen;
- a rejected replay id follows ``on_corrupted``: ``"fail"`` raises
  :class:`~ingest.errors.ReplayIdError`; ``"earliest"`` / ``"latest"`` yield a
  :class:`ReplayGap` and resubscribe there;
- permanent failures raise :class:`~ingest.errors.PermanentError` at once.

Every new stream starts after the position the *consumer* has durably stored
(``durable_position()``), or after the last item handed out when no callback is given, and
is announced by a :class:`Resubscribed` item so the consumer drops what it had not stored.
Items received before a failure are handed out first, then the failure is handled.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from ingest.auth import TokenManager
from ingest.auth_flows import Credentials
from ingest.client.errors import Failure
from ingest.client.retry import RetryPolicy
from ingest.client.stream import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_BUFFER_EVENTS,
    MAX_REQUESTED,
    EventBatch,
    EventColumns,
    FlowWindow,
    Item,
    Keepalive,
    ReplayGap,
    Resubscribed,
    StreamStats,
    _SizedParser,
    _Stream,
)
from ingest.errors import AuthUnavailableError, PermanentError, ReplayIdError, TransientError
from ingest.pubsub import pb2
from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition

__all__ = ["CorruptedReplayPolicy", "Subscription", "fetch_request"]

CorruptedReplayPolicy = Literal["fail", "earliest", "latest"]

_log = logging.getLogger(__name__)
_DEFAULT_IDLE_FETCH_AFTER = 30.0
_SUBSCRIBE = "/eventbus.v1.PubSub/Subscribe"


def fetch_request(topic: str, start: StartPosition, num_requested: int) -> pb2.FetchRequest:
    """The first FetchRequest of a stream: topic, start position and initial window."""
    if isinstance(start, After):
        return pb2.FetchRequest(
            topic_name=topic,
            replay_preset=pb2.ReplayPreset.CUSTOM,
            replay_id=start.replay_id.value,
            num_requested=num_requested,
        )
    preset = pb2.ReplayPreset.EARLIEST if isinstance(start, Earliest) else pb2.ReplayPreset.LATEST
    return pb2.FetchRequest(topic_name=topic, replay_preset=preset, num_requested=num_requested)


@dataclass(frozen=True, slots=True)
class _NeedPosition:
    reason: str
    attempt: int
    forced: StartPosition | None


def _convert_fetch(topic: str) -> Callable[[Any, float], list[Any]]:
    new_replay_id = ReplayId.__new__
    set_value = object.__setattr__

    def replay_id(value: bytes) -> ReplayId:
        # The server's bytes are bytes already; skip re-validating them.
        rid = new_replay_id(ReplayId)
        set_value(rid, "value", value)
        return rid

    def convert(response: Any, received_at: float) -> list[Any]:
        pending = response.pending_num_requested
        raw_events = response.events
        if raw_events:
            # Columns in one pass, without an object per event: at 100 events per response
            # and 100k events/s, per-event objects cost more than receiving them.
            # One comprehension per field: each reads a field of every message in a tight
            # loop, cheaper than one loop appending to four lists.
            replay_ids = [e.replay_id for e in raw_events]
            events = [e.event for e in raw_events]
            event_ids = [e.id for e in events]
            schema_ids = [e.schema_id for e in events]
            payloads = [e.payload for e in events]
            if not all(replay_ids):
                missing = replay_ids.index(b"")
                raise PermanentError(
                    f"{topic}: the server sent event {event_ids[missing]} without a replay "
                    "id; the stream cannot be resumed past it"
                )
            latest = response.latest_replay_id or replay_ids[-1]
            columns = EventColumns(
                tuple(replay_ids), tuple(event_ids), tuple(schema_ids), tuple(payloads)
            )
            return [
                EventBatch.of_columns(
                    topic,
                    columns,
                    latest_replay_id=replay_id(latest),
                    rpc_id=response.rpc_id,
                    received_at=received_at,
                    pending_num_requested=pending,
                )
            ]
        if not response.latest_replay_id:
            # A keepalive without a position carries nothing to checkpoint.
            return []
        return [
            Keepalive(
                topic, ReplayId(response.latest_replay_id), response.rpc_id, received_at, pending
            )
        ]

    return convert


class Subscription:
    """A resilient Subscribe stream on one topic. Iterate it for :data:`Item` values.

    ``start`` is used for the first stream. ``durable_position`` returns the position after
    the last event (or keepalive) the consumer has durably stored, or its initial start when
    nothing is stored yet; it is called between items, in the consumer's thread.
    ``num_requested`` (at most 100) is the server-side window; ``buffer_events`` bounds events
    received but not yet taken plus events outstanding, and ``buffer_bytes`` the bytes held:
    the stream keeps receiving while the consumer is busy, up to those bounds.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        topic: str,
        *,
        start: StartPosition | None = None,
        durable_position: Callable[[], StartPosition] | None = None,
        on_corrupted: CorruptedReplayPolicy = "fail",
        num_requested: int = MAX_REQUESTED,
        buffer_events: int = DEFAULT_BUFFER_EVENTS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        retry: RetryPolicy | None = None,
        tokens: TokenManager | None = None,
        idle_fetch_after: float = _DEFAULT_IDLE_FETCH_AFTER,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        rand: Callable[[], float] = random.random,
        logger: logging.Logger | None = None,
    ) -> None:
        if not isinstance(topic, str) or not topic.startswith("/"):
            raise ValueError(
                f"topic must be a path such as /data/AccountChangeEvent (got {topic!r})"
            )
        if on_corrupted not in ("fail", "earliest", "latest"):
            raise ValueError(
                f"on_corrupted must be 'fail', 'earliest' or 'latest' (got {on_corrupted!r})"
            )
        if idle_fetch_after <= 0:
            raise ValueError(f"idle_fetch_after must be > 0 seconds (got {idle_fetch_after})")
        self.topic = topic
        self._channel = channel
        self._start: StartPosition = start if start is not None else Latest()
        self._durable = durable_position
        self._on_corrupted = on_corrupted
        self._window = FlowWindow(num_requested, buffer_events, buffer_bytes)
        self._retry = retry or RetryPolicy()
        self._tokens = tokens
        self._idle_after = idle_fetch_after
        # Set by a MultiSubscription that iterates this subscription in its consumer's
        # thread: the stream then yields _IDLE after this many seconds without a response.
        self._idle_interval: float | None = None
        self._clock = clock
        # Backoff waits on the closed flag by default, so close() interrupts it.
        self._sleep = sleep if sleep is not None else self._wait_closed
        self._rand = rand
        self._log = logger or _log
        self._closed = threading.Event()
        self._stream: _Stream[Any, Any] | None = None
        self._last_handed: ReplayId | None = None
        self._superseded: tuple[StartPosition, StartPosition] | None = None
        self._events = 0
        self._batches = 0
        self._keepalives = 0
        self._requests = 0
        self._streams = 0
        self._got_events = False
        self._reached = False  # a stream has delivered something: the server was reached
        self._iterated = False

    def _wait_closed(self, seconds: float) -> None:
        self._closed.wait(seconds)

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Item]:
        items = self._items()  # raises at the first next() if iterated before
        reply: StartPosition | None = None
        while True:
            try:
                out = items.send(reply)
            except StopIteration:
                return
            reply = None
            if isinstance(out, _NeedPosition):
                reply = self._resume_position(out)
                yield Resubscribed(self.topic, reply, out.attempt, out.reason)
                continue
            self._note_handed(out)
            yield out

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the subscription: the current stream is cancelled and iteration stops."""
        self._closed.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def stats(self) -> StreamStats:
        """Counters since creation (events, batches, keepalives, requests, streams, window)."""
        stream = self._stream
        requests = self._requests + (stream.fetch_requests if stream is not None else 0)
        return StreamStats(
            events=self._events,
            batches=self._batches,
            keepalives=self._keepalives,
            fetch_requests=requests,
            streams=self._streams,
            outstanding=self._window.outstanding,
            buffered=self._window.buffered,
            server_pending=self._window.server_pending,
            window=self._window.window,
            open=stream is not None,
            quiet_seconds=stream.quiet_seconds() if stream is not None else 0.0,
        )

    def __repr__(self) -> str:
        return f"Subscription({self.topic!r}, start={self._start!r})"

    # -- positions (consumer thread) -----------------------------------------------------

    def _note_handed(self, item: Any) -> None:
        if isinstance(item, EventBatch | Keepalive):
            self._last_handed = item.latest_replay_id

    def _resume_position(self, need: _NeedPosition) -> StartPosition:
        if need.forced is not None:
            return need.forced
        if self._durable is not None:
            position = self._durable()
        elif self._last_handed is not None:
            position = After(self._last_handed)
        else:
            position = self._start
        if self._superseded is not None and position == self._superseded[0]:
            position = self._superseded[1]
        return position

    # -- the stream loop ------------------------------------------------------------------

    def _open(self, position: StartPosition) -> _Stream[Any, Any]:
        topic = self.topic
        parser = _SizedParser(pb2.FetchResponse.FromString)
        call = self._channel.stream_stream(
            _SUBSCRIBE,
            request_serializer=pb2.FetchRequest.SerializeToString,
            response_deserializer=parser,
        )
        return _Stream(
            name=topic,
            call=call,
            parser=parser,
            first_request=lambda n: fetch_request(topic, position, n),
            fetch_request=lambda n: pb2.FetchRequest(num_requested=n),
            convert=_convert_fetch(topic),
            clock=self._clock,
            window=self._window,
            idle_fetch_after=self._idle_after,
            idle_interval=self._idle_interval,
            logger=self._log,
        )

    def _items(self) -> Generator[Any, StartPosition | None, None]:
        if self._iterated:
            raise RuntimeError(
                f"{self!r} can be iterated once; to continue, create a new Subscription "
                "starting after the last stored replay id"
            )
        self._iterated = True
        position = self._start
        recovery = _Recovery(self._retry, self._tokens, self._sleep, self._rand, self._log)
        forced: StartPosition | None = None
        reason = ""
        first = True
        while not self._closed.is_set():
            if not first:
                sent = yield _NeedPosition(reason, recovery.consecutive, forced)
                if sent is None or self._closed.is_set():
                    return
                position = sent
                forced = None
            first = False
            action = f"Subscribe to {self.topic} at {_describe(position)}"
            credentials, failure = recovery.credentials()
            if failure is None:
                failure = yield from self._run_stream(position)
                if failure is None:
                    return
                if self._got_events:
                    recovery.reset()
                if self._reached:
                    recovery.contacted = True
            self._log.warning("%s failed: %s", action, failure.line())
            if failure.disposition != "replay":
                reason = recovery.recover(failure, action, credentials)
                continue
            if not isinstance(position, After):
                raise failure.exception(action)
            if self._on_corrupted == "fail":
                raise ReplayIdError(
                    f"{action}: the server rejected replay id {position.replay_id.hex()} "
                    f"({failure.summary()}): it is unknown or older than the retention "
                    "window (72 hours on Salesforce), so events after it may no longer be "
                    "retrievable. Two ways out: on_corrupted='earliest' resumes at the "
                    "oldest retained event (nothing retained is skipped; events stored "
                    "before may come again), on_corrupted='latest' resumes at the tip "
                    "(everything in between is skipped).",
                    status=failure.status,
                    error_code=failure.error_code,
                    rpc_id=failure.rpc_id,
                )
            resumed: StartPosition = Earliest() if self._on_corrupted == "earliest" else Latest()
            reason = (
                f"replay id {position.replay_id.hex()} rejected ({failure.summary()}); "
                f"policy on_corrupted={self._on_corrupted!r}"
            )
            self._log.warning("%s: %s: resuming at %s", self.topic, reason, resumed.kind)
            self._superseded = (position, resumed)
            yield ReplayGap(self.topic, position, resumed, reason)
            forced = resumed

    def _run_stream(self, position: StartPosition) -> Generator[Any, Any, Failure | None]:
        stream = self._open(position)
        self._stream = stream
        self._streams += 1
        self._got_events = False
        if self._closed.is_set():
            stream.close()
            return None
        self._log.info("subscribed to %s at %s", self.topic, _describe(position))
        try:
            for item in stream:
                self._reached = True
                if isinstance(item, EventBatch):
                    self._got_events = True
                    self._events += len(item)
                    self._batches += 1
                elif isinstance(item, Keepalive):
                    self._keepalives += 1
                yield item
                if self._closed.is_set():
                    return None
        finally:
            stream.close()
            self._requests += stream.fetch_requests
            self._stream = None
        if self._closed.is_set():
            return None
        return stream.failure


class _Recovery:
    """Consecutive-failure bookkeeping shared by Subscribe and ManagedSubscribe streams:
    backoff for transient failures, token refresh for rejections, raising when bounded
    attempts run out or retrying cannot help, and within ``retry.first_contact`` seconds when
    the server was never reached (``contacted`` is set once a stream has answered)."""

    def __init__(
        self,
        retry: RetryPolicy,
        tokens: TokenManager | None,
        sleep: Callable[[float], None],
        rand: Callable[[], float],
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retry = retry
        self._tokens = tokens
        # Backoff waits on the closed flag by default, so close() interrupts it.
        self._sleep = sleep if sleep is not None else self._wait_closed
        self._rand = rand
        self._log = log
        self._clock = clock
        self._since = clock()
        self.contacted = False
        self.attempts = 0
        self.auth_failures = 0

    @property
    def consecutive(self) -> int:
        return max(self.attempts, self.auth_failures)

    def reset(self) -> None:
        """Events flowed: the next failure starts a fresh count."""
        self.attempts = 0
        self.auth_failures = 0

    def credentials(self) -> tuple[Credentials | None, Failure | None]:
        """The credentials the next call will use (logging in if due); a token endpoint
        that is down is a transient failure, a rejected login raises."""
        if self._tokens is None:
            return None, None
        try:
            return self._tokens.current(), None
        except AuthUnavailableError as exc:
            return None, Failure(
                "transient", "AUTH_UNAVAILABLE", "", "", str(exc), "retrying the login later"
            )

    def recover(self, failure: Failure, action: str, credentials: Credentials | None) -> str:
        """Wait or refresh as ``failure`` requires and return the reason to report; raise the
        failure when it is permanent or attempts are exhausted."""
        if failure.disposition in ("permanent", "replay"):
            raise failure.exception(action)
        if failure.disposition == "auth":
            self.auth_failures += 1
            if self.auth_failures > self._retry.auth_retries:
                raise failure.exception(
                    f"{action} (credentials rejected {self.auth_failures} times in a row even "
                    "after refreshing them; a static token cannot be refreshed)"
                )
            if self._tokens is not None:
                self._tokens.invalidate(credentials)
            if self.auth_failures > 1:
                self._sleep(self._retry.delay(self.auth_failures - 1, rand=self._rand))
            return f"credentials rejected ({failure.summary()}); token refreshed"
        self.attempts += 1
        if self.attempts > self._retry.max_attempts:
            raise TransientError(
                f"{action}: gave up after {self._retry.max_attempts} consecutive failed "
                f"attempts; last failure {failure.summary()}: {failure.description}",
                status=failure.status,
                error_code=failure.error_code,
                rpc_id=failure.rpc_id,
            )
        delay = self._retry.delay(self.attempts, rand=self._rand)
        waited = self._clock() - self._since
        if not self.contacted and self._retry.first_contact_over(waited, delay):
            # Never reached: a wrong address, a name that does not resolve, a login endpoint
            # that is down. Said now, rather than after every attempt's backoff.
            raise TransientError(
                f"{action}: the first connection failed ({self.attempts} attempts in "
                f"{waited:.1f} s; the server never answered): {failure.line()}",
                status=failure.status,
                error_code=failure.error_code,
                rpc_id=failure.rpc_id,
            )
        self._log.info(
            "%s: retrying in %.2f s (attempt %d of %d)",
            action,
            delay,
            self.attempts,
            self._retry.max_attempts,
        )
        self._sleep(delay)
        return failure.summary()


def _describe(position: StartPosition | None) -> str:
    if position is None:
        return "the committed position"
    if isinstance(position, After):
        return f"after {position.replay_id.hex()}"
    return position.kind
