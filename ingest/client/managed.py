"""ManagedSubscribe (beta): the server stores the position, the consumer commits it.

A managed subscription is a ``ManagedEventSubscription`` record in the org, named by
developer name or by id; a new stream resumes after the last replay id committed on the
server (or at the record's default replay when nothing was committed). The consumer calls
:meth:`ManagedSubscription.commit` only after it has durably stored the events of a batch,
and for keepalives with their ``latest_replay_id`` (Salesforce closes streams that commit
nothing for 30 minutes).

Commit outcomes. The server answers commits in the stream's responses and may answer several
with one response (for the last of them). A refused commit, a commit still unanswered when
its stream ends, and a commit made while reconnecting (a position delivered on one stream
cannot be committed on the next) are yielded as :class:`~ingest.client.stream.CommitFailed`
items, never ignored: the server-side position did not (or may not) advance, so events after
the last acknowledged commit can be delivered again on the next stream.

Iteration yields the same lifecycle items as Subscribe, with the same flow control and the
same recovery (backoff for transient failures, token refresh for rejections, permanent
failures raised).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from typing import Any

import grpc

from ingest.auth import TokenManager
from ingest.client.errors import Failure
from ingest.client.retry import RetryPolicy
from ingest.client.stream import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_BUFFER_EVENTS,
    MAX_REQUESTED,
    CommitFailed,
    EventBatch,
    FlowWindow,
    Item,
    Keepalive,
    Resubscribed,
    StreamStats,
    _Stream,
)
from ingest.client.subscriber import _DEFAULT_IDLE_FETCH_AFTER, _convert_fetch, _Recovery
from ingest.pubsub import pb2, pb2_grpc
from ingest.replay import After, ReplayId

__all__ = ["ManagedSubscription"]

_log = logging.getLogger(__name__)


class ManagedSubscription:
    """A resilient ManagedSubscribe stream. Give exactly one of ``developer_name`` and
    ``subscription_id``; ``topic`` only labels the items (the server knows the topic).
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        developer_name: str | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        num_requested: int = MAX_REQUESTED,
        buffer_events: int = DEFAULT_BUFFER_EVENTS,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        retry: RetryPolicy | None = None,
        tokens: TokenManager | None = None,
        idle_fetch_after: float = _DEFAULT_IDLE_FETCH_AFTER,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        rand: Callable[[], float] = random.random,
        id_factory: Callable[[], str] = lambda: str(uuid.uuid4()),
        logger: logging.Logger | None = None,
    ) -> None:
        if bool(developer_name) == bool(subscription_id):
            raise ValueError(
                "a managed subscription is named by exactly one of developer_name and "
                f"subscription_id (got developer_name={developer_name!r}, "
                f"subscription_id={subscription_id!r})"
            )
        self.name = developer_name or subscription_id or ""
        self.topic = topic or f"managed:{self.name}"
        self._developer_name = developer_name or ""
        self._subscription_id = subscription_id or ""
        self._stub = pb2_grpc.PubSubStub(channel)
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
        self._new_id = id_factory
        self._log = logger or _log
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stream: _Stream[Any, Any] | None = None
        self._outstanding: OrderedDict[str, ReplayId] = OrderedDict()
        self._unsent: set[str] = set()
        self._last_committed: ReplayId | None = None
        self._events = 0
        self._batches = 0
        self._keepalives = 0
        self._requests = 0
        self._streams = 0
        self._got_events = False
        self._reached = False  # a stream has delivered something: the server was reached
        self._iterated = False
        self._convert_events = _convert_fetch(self.topic)

    def _wait_closed(self, seconds: float) -> None:
        self._closed.wait(seconds)

    # -- public ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Item]:
        yield from self._items()

    def __enter__(self) -> ManagedSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commit(self, replay_id: ReplayId) -> str:
        """Ask the server to store ``replay_id`` as this subscription's position; returns the
        commit request id. Call it only after the events up to ``replay_id`` are durably
        stored (or with a keepalive's ``latest_replay_id``)."""
        if not isinstance(replay_id, ReplayId):
            raise TypeError(f"commit needs a ReplayId (got a {type(replay_id).__name__})")
        request_id = self._new_id()
        request = pb2.ManagedFetchRequest(
            commit_replay_id_request=pb2.CommitReplayRequest(
                commit_request_id=request_id, replay_id=replay_id.value
            )
        )
        with self._lock:
            if not self._iterated:
                raise RuntimeError(
                    f"{self.topic}: commit({replay_id.hex()}) before iterating; commit while "
                    "iterating, after storing the items it yielded"
                )
            stream = self._stream
            self._outstanding[request_id] = replay_id
            if stream is None:
                # Between streams (reconnecting): the next stream reports it as failed, since
                # a position delivered on an old stream cannot be committed on a new one.
                self._unsent.add(request_id)
                return request_id
        stream.send(request)
        return request_id

    @property
    def outstanding_commits(self) -> tuple[ReplayId, ...]:
        """Commits sent and not yet answered, oldest first."""
        with self._lock:
            return tuple(self._outstanding.values())

    @property
    def last_committed(self) -> ReplayId | None:
        """The last replay id the server acknowledged committing on this client."""
        return self._last_committed

    def close(self) -> None:
        """End the subscription; unanswered commits are abandoned (see the module notes)."""
        self._closed.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _note_handed(self, item: Any) -> None:
        """Nothing to remember: the server keeps the position (see :meth:`commit`)."""

    def stats(self) -> StreamStats:
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
        return f"ManagedSubscription({self.name!r})"

    # -- internals -------------------------------------------------------------------------

    def _first_request(self, n: int) -> pb2.ManagedFetchRequest:
        return pb2.ManagedFetchRequest(
            subscription_id=self._subscription_id,
            developer_name=self._developer_name,
            num_requested=n,
        )

    def _convert(self, response: Any, received_at: float) -> list[Any]:
        if response.HasField("commit_response") and not response.events:
            return []  # a commit answer: _inspect handled it, it is not a keepalive
        return self._convert_events(response, received_at)

    def _inspect(self, response: Any) -> list[Any]:
        # Runs on the reader thread, so answers are recorded while the consumer is busy.
        if response.HasField("commit_response"):
            return self._answered(response.commit_response)
        return []

    def _answered(self, answer: Any) -> list[CommitFailed]:
        request_id = answer.commit_request_id
        with self._lock:
            if request_id not in self._outstanding:
                self._log.warning(
                    "%s: commit response for unknown request %s", self.topic, request_id
                )
                return []
            requested = self._outstanding[request_id]
            # Coalesced answers speak for every earlier request as well.
            while self._outstanding:
                key, _ = self._outstanding.popitem(last=False)
                if key == request_id:
                    break
        replay_id = ReplayId(answer.replay_id) if answer.replay_id else requested
        if answer.HasField("error"):
            message = answer.error.msg or pb2.ErrorCode.Name(answer.error.code)
            self._log.warning(
                "%s: commit %s of %s refused: %s",
                self.topic,
                request_id,
                replay_id.hex(),
                message,
            )
            return [CommitFailed(self.topic, request_id, replay_id, f"refused: {message}")]
        self._last_committed = replay_id
        return []

    def _abandoned(self) -> list[CommitFailed]:
        """Every commit not answered by the stream that just ended (or never sent)."""
        with self._lock:
            lost = list(self._outstanding.items())
            unsent = set(self._unsent)
            self._outstanding.clear()
            self._unsent.clear()
        since = self._last_committed.hex() if self._last_committed else "the start"
        return [
            CommitFailed(
                self.topic,
                request_id,
                replay_id,
                (
                    "committed while no stream was open (reconnecting), so it was not sent"
                    if request_id in unsent
                    else "the stream ended before the server answered; it may not have been applied"
                )
                + f", so events after {since} may be delivered again",
            )
            for request_id, replay_id in lost
        ]

    def _open(self) -> _Stream[Any, Any]:
        return _Stream(
            name=self.topic,
            call=self._stub.ManagedSubscribe,
            first_request=self._first_request,
            fetch_request=lambda n: pb2.ManagedFetchRequest(num_requested=n),
            convert=self._convert,
            inspect=self._inspect,
            clock=self._clock,
            window=self._window,
            idle_fetch_after=self._idle_after,
            idle_interval=self._idle_interval,
            logger=self._log,
        )

    def _items(self) -> Generator[Item, None, None]:
        with self._lock:
            if self._iterated:
                raise RuntimeError(f"{self!r} can be iterated once; create a new one to resume")
            self._iterated = True
        recovery = _Recovery(self._retry, self._tokens, self._sleep, self._rand, self._log)
        action = f"ManagedSubscribe {self.name}"
        first = True
        reason = ""
        while not self._closed.is_set():
            if not first:
                position = After(self._last_committed) if self._last_committed else None
                yield Resubscribed(self.topic, position, recovery.consecutive, reason)
            first = False
            credentials, failure = recovery.credentials()
            if failure is None:
                failure = yield from self._run_stream()
                if failure is None:
                    return
                if self._got_events:
                    recovery.reset()
                if self._reached:
                    recovery.contacted = True
            yield from self._abandoned()
            self._log.warning("%s failed: %s", action, failure.line())
            reason = recovery.recover(failure, action, credentials)

    def _run_stream(self) -> Generator[Item, None, Failure | None]:
        stream = self._open()
        with self._lock:
            self._stream = stream
        # Commits made while reconnecting were never sent; say so before anything else.
        yield from self._abandoned()
        self._streams += 1
        self._got_events = False
        self._log.info("managed subscription %s started", self.name)
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
            with self._lock:
                self._stream = None
            stream.close()
            self._requests += stream.fetch_requests
        if self._closed.is_set():
            return None
        return stream.failure
